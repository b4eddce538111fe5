import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { ConfigError, SERVICE_SCOPES, serviceTokenHash, ServiceTokensError, ServiceTokenTable } from "../../protocol/index.js";
import { bearerToken } from "../../gateway/http/bearer.js";
import { decideAdmission, ServiceAuth, type AdmissionInput } from "../../gateway/http/service-auth.js";
import { ServiceTokensSource } from "../../gateway/http/service-tokens-source.js";

const NOTIFIER = "nT4k7Qp2Wx9Lm3Rv8Bz1Hc6Jd0Fs5Yg-e";
const SUPPORT = "sP8w2Kx5Nq7Tb3Lr9Vm1Hd4Jc6Fg0Za-u";
const file = (entries: string) => `tokens:\n${entries}`;
const entry = (name: string, token: string, scopes: string, extra = "") => `  - name: ${name}\n    sha256: ${serviceTokenHash(token)}\n    scopes: [${scopes}]\n${extra}`;
const TWO = file(entry("notifier", NOTIFIER, "dispatch, presence") + entry("support", SUPPORT, "read, sessions, revoke", `    not_after: "2027-03-01T00:00:00Z"\n`));
const NOW = Date.parse("2026-12-05T00:00:00Z");

test("service tokens - the SHA-256 of the token's UTF-8 bytes, in hex", () => {
  assert.equal(serviceTokenHash("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
});

test("service tokens - a YAML file and the single token: each token by its hash, with its name and scopes; JSON reads the same", () => {
  const t = ServiceTokenTable.from(TWO, "the-single-token");
  assert.equal(t.size, 3);
  const m = t.match(NOTIFIER, NOW);
  assert.equal(m.kind, "valid");
  assert.equal(m.kind === "valid" && m.token.name, "notifier");
  assert.deepEqual(m.kind === "valid" && [...m.token.scopes], ["dispatch", "presence"]);
  const single = t.match("the-single-token", NOW);
  assert.deepEqual(single.kind === "valid" && [single.token.name, [...single.token.scopes]], ["default", [...SERVICE_SCOPES]]);
  assert.equal(t.match("not-a-token", NOW).kind, "unknown");
  const json = JSON.stringify({ tokens: [{ name: "notifier", sha256: serviceTokenHash(NOTIFIER).toUpperCase(), scopes: ["dispatch"] }] });
  assert.equal(ServiceTokenTable.from(json, undefined).match(NOTIFIER, NOW).kind, "valid", "JSON, and the hash in either case");
});

test("service tokens - a token past its not_after is expired, not unknown", () => {
  const t = ServiceTokenTable.from(TWO, undefined);
  assert.equal(t.match(SUPPORT, Date.parse("2027-03-01T00:00:00Z")).kind, "valid", "valid at its not_after");
  const m = t.match(SUPPORT, Date.parse("2027-03-01T00:00:01Z"));
  assert.equal(m.kind, "expired");
});

test("service tokens - a bad file names each problem by its field", () => {
  const problems = (text: string, single?: string) => {
    try {
      ServiceTokenTable.from(text, single);
    } catch (err) {
      assert.ok(err instanceof ServiceTokensError);
      return err.problems.join("\n");
    }
    assert.fail("accepted");
  };
  assert.match(problems("tokens: [\n"), /^not YAML or JSON: /);
  assert.match(problems("[]"), /^the file: /);
  assert.match(problems(file(entry("a b", NOTIFIER, "dispatch"))), /tokens\.0\.name: must be 1\.\.64 of/);
  assert.match(problems(file(entry("a", NOTIFIER, "dispatch, write"))), /tokens\.0\.scopes\.1: /);
  assert.match(problems(file(entry("a", NOTIFIER, ""))), /tokens\.0\.scopes: must name at least one scope/);
  assert.match(problems(file(`  - name: a\n    sha256: "1234"\n    scopes: [read]\n`)), /tokens\.0\.sha256: must be the token's SHA-256 in hex/);
  assert.match(problems(file(entry("a", NOTIFIER, "read", "    not_after: 2027-03-01\n"))), /tokens\.0\.not_after: must be an ISO 8601 date and time with a zone/);
  assert.match(problems(file(entry("a", NOTIFIER, "read", "    colour: blue\n"))), /tokens\.0: .*colour/);
  assert.match(problems(file(entry("a", NOTIFIER, "read") + entry("a", SUPPORT, "read"))), /tokens\.1\.name: "a" is used twice/);
  assert.match(problems(file(entry("a", NOTIFIER, "read") + entry("b", NOTIFIER, "read"))), /tokens\.1\.sha256: the same token as "a"/);
  assert.match(problems(file(entry("default", NOTIFIER, "read")), "single"), /tokens\.0\.name: "default" is used twice/);
});

test("service tokens - bearerToken: the scheme in any case, then the token; nothing for another scheme or none", () => {
  assert.equal(bearerToken("Bearer abc"), "abc");
  assert.equal(bearerToken("bEaReR abc"), "abc");
  for (const h of ["", "Bearer", "Bearer ", "Basic abc", "abc"]) assert.equal(bearerToken(h), undefined, JSON.stringify(h));
});

const table = ServiceTokenTable.from(TWO, undefined);
const decide = (over: Partial<AdmissionInput>) => decideAdmission({ header: `Bearer ${NOTIFIER}`, scope: "dispatch", table, now: NOW, heldOffS: 0, production: true, ...over });

test("service auth - a right token with the route's scope is served, held-off address or not", () => {
  assert.deepEqual(decide({}), { ok: true, token: "notifier" });
  assert.deepEqual(decide({ heldOffS: 6 }), { ok: true, token: "notifier" });
});

test("service auth - a right token without the route's scope: 403 naming the scope, what it has and what the scope opens; not a wrong token", () => {
  const a = decide({ scope: "read" });
  assert.equal(a.ok, false);
  assert.ok(!a.ok);
  assert.equal(a.status, "403 Forbidden");
  assert.equal(a.scope, "read");
  assert.equal(a.token, "notifier");
  assert.equal(a.wrong, false);
  assert.match(a.error, /service token "notifier" does not have the scope read \(it has dispatch, presence\); read opens GET \/v1\/users\/\{user\}\/mailbox/);
});

test("service auth - wrong, missing and expired tokens: 401 and counted; 429 with the wait while the address is held off", () => {
  const wrong = decide({ header: "Bearer nope" });
  assert.ok(!wrong.ok);
  assert.deepEqual([wrong.status, wrong.error, wrong.wrong, wrong.token], ["401 Unauthorized", "wrong bearer token", true, ""]);
  const missing = decide({ header: "" });
  assert.ok(!missing.ok);
  assert.deepEqual([missing.status, missing.error, missing.wrong], ["401 Unauthorized", "missing bearer token", true]);
  const expired = decide({ header: `Bearer ${SUPPORT}`, scope: "read", now: Date.parse("2027-04-01T00:00:00Z") });
  assert.ok(!expired.ok);
  assert.deepEqual([expired.status, expired.wrong, expired.token], ["401 Unauthorized", true, "support"]);
  assert.match(expired.error, /service token "support" expired at 2027-03-01T00:00:00\.000Z \(its not_after\)/);
  const held = decide({ header: "Bearer nope", heldOffS: 5 });
  assert.ok(!held.ok);
  assert.deepEqual([held.status, held.retryAfterS, held.wrong], ["429 Too Many Requests", 5, false]);
  assert.match(held.error, /too many wrong tokens from this address: try again in 5 s/);
});

test("service auth - no token configured: 503, the API is off, naming both settings", () => {
  const a = decide({ table: ServiceTokenTable.EMPTY });
  assert.ok(!a.ok);
  assert.equal(a.status, "503 Service Unavailable");
  assert.match(a.error, /JETGATE_SERVICE_TOKEN or JETGATE_SERVICE_TOKENS_FILE/);
});

test("service auth - in production a weak token of the file is refused when shown (named, with the fix); in development it is served", () => {
  const weak = ServiceTokenTable.from(file(entry("legacy", "password123", "dispatch")), undefined);
  const a = decide({ table: weak, header: "Bearer password123" });
  assert.ok(!a.ok);
  assert.equal(a.status, "401 Unauthorized");
  assert.match(a.error, /service token "legacy" is refused with JETGATE_ENV=production: it must be at least 32 characters .*jetgate token new/);
  assert.deepEqual(decide({ table: weak, header: "Bearer password123", production: false }), { ok: true, token: "legacy" });
});

test("service auth - one address: a client retrying a stale token is held off, a client with the right token is served every time", () => {
  let heldOff = 0;
  const auth = new ServiceAuth(() => table, true, () => heldOff++);
  let now = NOW;
  const statuses = { stale: new Map<string, number>(), right: new Map<string, number>() };
  const count = (m: Map<string, number>, s: string) => m.set(s, (m.get(s) ?? 0) + 1);
  // 13 s of a stale token every 50 ms beside the right one every 100 ms, from one address
  for (let i = 0; i < 260; i++, now += 50) {
    const stale = auth.admit("Bearer stale-token-of-an-old-pod", "10.0.0.7", "dispatch", now);
    count(statuses.stale, stale.ok ? "200" : stale.status.slice(0, 3));
    if (i % 2 === 0) {
      const right = auth.admit(`Bearer ${NOTIFIER}`, "10.0.0.7", "dispatch", now);
      count(statuses.right, right.ok ? "200" : right.status.slice(0, 3));
    }
  }
  assert.deepEqual([...statuses.right], [["200", 130]]);
  assert.equal(statuses.stale.get("401"), 10 + 2, "10, then one per 6 s over 13 s");
  assert.equal(statuses.stale.get("429"), 260 - 12);
  assert.equal(heldOff, 3, "logged when held off, not at every 429");
  // another address is not held off at all
  const other = auth.admit("Bearer nope", "10.0.0.8", "dispatch", now);
  assert.ok(!other.ok);
  assert.equal(other.status, "401 Unauthorized");
});

test("service tokens source - a bad file at start is a ConfigError naming the variable; a reload that fails keeps the tokens in force", () => {
  const dir = mkdtempSync(join(tmpdir(), "jetgate-tokens-"));
  try {
    const path = join(dir, "tokens.yaml");
    writeFileSync(path, "tokens: [{name: x}]");
    const hooks = { reloaded: (o: "ok" | "error") => outcomes.push(o), inForce: (t: ServiceTokenTable) => sizes.push(t.size) };
    const outcomes: string[] = [];
    const sizes: number[] = [];
    const log = pino({ level: "silent" });
    assert.throws(() => new ServiceTokensSource(path, undefined, log, hooks), (err: unknown) => err instanceof ConfigError && /JETGATE_SERVICE_TOKENS_FILE: tokens\.0\.sha256: /.test(err.message));
    assert.throws(() => new ServiceTokensSource(join(dir, "none.yaml"), undefined, log, hooks), /JETGATE_SERVICE_TOKENS_FILE: cannot read .*none\.yaml \(ENOENT\)/);
    writeFileSync(path, TWO);
    const source = new ServiceTokensSource(path, "the-single-token", log, hooks);
    assert.equal(source.table.size, 3);
    writeFileSync(path, "tokens: [");
    assert.equal(source.reload("SIGHUP"), false);
    assert.equal(source.table.match(NOTIFIER, NOW).kind, "valid", "the tokens in force stay");
    writeFileSync(path, file(entry("support", SUPPORT, "read")));
    assert.equal(source.reload("change"), true);
    assert.equal(source.table.match(NOTIFIER, NOW).kind, "unknown", "removed");
    assert.equal(source.table.match("the-single-token", NOW).kind, "valid", "the single token stays");
    assert.deepEqual(outcomes, ["error", "ok"]);
    assert.deepEqual(sizes, [3, 2]);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
