import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { SignJWT, exportJWK, exportSPKI, generateKeyPair, UnsecuredJWT } from "jose";
import { tokenVerifier, TokenError } from "../../gateway/jwt.js";

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
  await rejects(v.verify(await sign("HS256", new TextEncoder().encode("other"))), /signature/);
  await rejects(v.verify(await sign("HS256", key, {}, "a.b")), /sub: user id/);
  await rejects(v.verify(await sign("HS256", key, { dev: "x y" })), /dev claim/);
  await rejects(v.verify("not.a.jwt"), /rejected/);
  await rejects(v.verify(new UnsecuredJWT({}).setSubject("alice").setExpirationTime(now() + 60).encode()), /rejected/);
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
  await rejects(v.verify(confusion), /rejected/);
  const other = await generateKeyPair("EdDSA");
  await rejects(v.verify(await sign("EdDSA", other.privateKey)), /rejected/);

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
