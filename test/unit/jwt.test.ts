import { test } from "node:test";
import assert from "node:assert/strict";
import { createHmac } from "node:crypto";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { SignJWT, exportJWK, exportSPKI, generateKeyPair, UnsecuredJWT } from "jose";
import { SIGNATURE_FAILED, tokenVerifier, TokenError } from "../../gateway/jwt.js";

const dir = mkdtempSync(join(tmpdir(), "jetgate-jwt-"));
const now = () => Math.floor(Date.now() / 1000);
const sign = (alg: string, key: Parameters<SignJWT["sign"]>[0], claims: Record<string, unknown> = {}, sub = "alice", exp = now() + 60) =>
  new SignJWT(claims).setProtectedHeader({ alg }).setSubject(sub).setExpirationTime(exp).sign(key);

const rejects = async (p: Promise<unknown>, re: RegExp) =>
  assert.rejects(p, (e: unknown) => e instanceof TokenError && e.code === "UNAUTHORIZED" && re.test(e.message));

test("jwt - HS256 secret: valid token, sub and dev claims; expired, wrong secret and bad sub refused", async () => {
  const v = await tokenVerifier({ secret: "s3cret" });
  const key = new TextEncoder().encode("s3cret");
  const c = await v.verify(await sign("HS256", key, { dev: "phone" }));
  assert.deepEqual([c.user, c.device], ["alice", "phone"]);
  assert.ok(c.expiresAt > Date.now());
  await rejects(v.verify(await sign("HS256", key, {}, "alice", now() - 60)), /exp/);
  await rejects(v.verify(await sign("HS256", new TextEncoder().encode("other"))), /^signature did not verify with any configured key$/);
  await rejects(v.verify(await sign("HS256", key, {}, "a.b")), /sub: user id/);
  await rejects(v.verify(await sign("HS256", key, { dev: "x y" })), /dev claim/);
  await rejects(v.verify("not.a.jwt"), /malformed/);
  await rejects(v.verify(new UnsecuredJWT({}).setSubject("alice").setExpirationTime(now() + 60).encode()), /^signature did not verify with any configured key$/);
  const noExp = await new SignJWT({}).setProtectedHeader({ alg: "HS256" }).setSubject("alice").sign(key);
  await rejects(v.verify(noExp), /exp/);
});

test("jwt - public keys (PEM, several) and a JWKS file: EdDSA and ES256 accepted, HS256 key confusion refused", async () => {
  const ed = await generateKeyPair("EdDSA", { extractable: true });
  const es = await generateKeyPair("ES256", { extractable: true });
  const pemFile = join(dir, "keys.pem");
  writeFileSync(pemFile, `${await exportSPKI(ed.publicKey)}\n${await exportSPKI(es.publicKey)}\n`);
  const v = await tokenVerifier({ publicKeysFile: pemFile });
  assert.equal((await v.verify(await sign("EdDSA", ed.privateKey))).user, "alice");
  assert.equal((await v.verify(await sign("ES256", es.privateKey))).user, "alice");
  // an attacker signs HS256 with the public key's bytes as the secret
  const confusion = await sign("HS256", new TextEncoder().encode(await exportSPKI(ed.publicKey)));
  await rejects(v.verify(confusion), /^signature did not verify with any configured key$/);
  const other = await generateKeyPair("EdDSA");
  await rejects(v.verify(await sign("EdDSA", other.privateKey)), /^signature did not verify with any configured key$/);

  const jwksFile = join(dir, "keys.jwks");
  writeFileSync(jwksFile, JSON.stringify({ keys: [{ ...(await exportJWK(ed.publicKey)), alg: "EdDSA", kid: "k1" }] }));
  const j = await tokenVerifier({ publicKeysFile: jwksFile });
  const withKid = await new SignJWT({}).setProtectedHeader({ alg: "EdDSA", kid: "k1" }).setSubject("bob").setExpirationTime(now() + 60).sign(ed.privateKey);
  assert.equal((await j.verify(withKid)).user, "bob");
});

test("jwt - no key configured, or a key file without keys, is a named error", async () => {
  await assert.rejects(tokenVerifier({}), /JETGATE_JWT_SECRET or JETGATE_JWT_PUBLIC_KEYS_FILE/);
  const empty = join(dir, "empty.pem");
  writeFileSync(empty, "nothing here\n");
  await assert.rejects(tokenVerifier({ publicKeysFile: empty }), TokenError);
});

test("jwt - HS256 rotation: the previous secret still verifies, a third one does not", async () => {
  const v = await tokenVerifier({ secret: "new-secret", previousSecret: "old-secret" });
  const sign = (secret: string) => new SignJWT({}).setProtectedHeader({ alg: "HS256" }).setSubject("u").setExpirationTime("1h").sign(new TextEncoder().encode(secret));
  assert.equal((await v.verify(await sign("new-secret"))).user, "u");
  assert.equal((await v.verify(await sign("old-secret"))).user, "u");
  await assert.rejects(v.verify(await sign("other-secret")), TokenError);
});

/** An HS256 token over a payload written as given (JSON numbers jose's signer would not write, like 1e400). */
function rawHs256(payloadJson: string, secret = "s3cret"): string {
  const b64 = (s: string | Buffer) => Buffer.from(s).toString("base64url");
  const input = `${b64(JSON.stringify({ alg: "HS256" }))}.${b64(payloadJson)}`;
  return `${input}.${createHmac("sha256", secret).update(input).digest("base64url")}`;
}

test("jwt - token times: fractional seconds floored, non-finite refused, lifetime over JETGATE_JWT_MAX_LIFETIME_S refused by name", async () => {
  const v = await tokenVerifier({ secret: "s3cret", maxLifetimeS: 86_400 });
  const t = now();
  // RFC 7519 allows a fractional exp; the expiry in ms is an integer
  const frac = await v.verify(rawHs256(`{"sub":"alice","exp":${t + 3600}.5,"iat":${t}.25}`));
  assert.equal(frac.expiresAt, (t + 3600) * 1000);
  assert.ok(Number.isSafeInteger(frac.expiresAt));
  for (const exp of ["1e400", "1e300", `${t + 10 * 365 * 86400}`, `${t + 86_400 + 60}`]) {
    await rejects(v.verify(rawHs256(`{"sub":"alice","exp":${exp}}`)), /lifetime too long|exp must be a finite number/);
  }
  await rejects(v.verify(rawHs256(`{"sub":"alice","exp":1e400}`)), /token exp must be a finite number of seconds/);
  await rejects(v.verify(rawHs256(`{"sub":"alice","exp":${t + 600},"iat":-1e400}`)), /token iat must be a finite number/);
  await rejects(v.verify(rawHs256(`{"sub":"alice","exp":${t + 600},"nbf":-1e400}`)), /token nbf must be a finite number/);
  await rejects(v.verify(rawHs256(`{"sub":"alice","exp":${t + 10 * 86400}}`)), /exp is \d+ s away, the maximum is 86400 s \(JETGATE_JWT_MAX_LIFETIME_S\)/);
  // issued two days ago for three days: the remaining day is within the bound, the lifetime is not
  await rejects(v.verify(rawHs256(`{"sub":"alice","exp":${t + 86400},"iat":${t - 2 * 86400}}`)), /exp - iat is 259200 s/);
  // exactly the maximum is accepted, and a longer maximum accepts longer tokens
  assert.equal((await v.verify(rawHs256(`{"sub":"alice","exp":${t + 86_400}}`))).user, "alice");
  const longer = await tokenVerifier({ secret: "s3cret", maxLifetimeS: 30 * 86400 });
  assert.equal((await longer.verify(rawHs256(`{"sub":"alice","exp":${t + 10 * 86400}}`))).user, "alice");
});

test("jwt - a token no configured key verifies: one message whatever the keys, what each key said only in `detail`", async () => {
  const ed = await generateKeyPair("EdDSA", { extractable: true });
  const es = await generateKeyPair("ES256", { extractable: true });
  const pemFile = join(dir, "mixed.pem");
  writeFileSync(pemFile, `${await exportSPKI(ed.publicKey)}\n${await exportSPKI(es.publicKey)}\n`);
  const v = await tokenVerifier({ publicKeysFile: pemFile });
  const stranger = await generateKeyPair("EdDSA");
  for (const token of [
    await sign("EdDSA", stranger.privateKey),
    await sign("ES256", (await generateKeyPair("ES256")).privateKey),
    await sign("HS256", new TextEncoder().encode("guess")),
  ]) {
    const err = await v.verify(token).then(() => undefined, (e: unknown) => e);
    assert.ok(err instanceof TokenError);
    assert.equal(err.message, SIGNATURE_FAILED);
    assert.doesNotMatch(err.message, /ECDSA|Ed25519|CryptoKey|EdDSA|ES256|HS256/);
    assert.ok(err.detail !== undefined && err.detail.length > 0, "the operator's log gets each key's error");
  }
  const secret = await tokenVerifier({ secret: "s3cret", previousSecret: "older" });
  const wrong = await secret.verify(await sign("HS256", new TextEncoder().encode("guess"))).then(() => undefined, (e: unknown) => e);
  assert.ok(wrong instanceof TokenError && wrong.message === SIGNATURE_FAILED);
  assert.match(wrong.detail!, /ERR_JWS_SIGNATURE_VERIFICATION_FAILED.*;.*ERR_JWS_SIGNATURE_VERIFICATION_FAILED/);
  // a token a key verified but whose claims fail says which claim, for every key set
  await rejects(secret.verify(await sign("HS256", new TextEncoder().encode("older"), {}, "alice", now() - 60)), /"exp" claim timestamp check failed/);
});
