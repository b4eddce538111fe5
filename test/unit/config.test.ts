import { test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { ConfigError, ENV_VARS, tokenStrengthProblem } from "../../protocol/index.js";
import { loadConfig } from "../../protocol/io/index.js";

const key = Buffer.alloc(32, 1).toString("base64url");

function problems(env: Record<string, string>): string[] {
  try {
    loadConfig(env);
  } catch (e) {
    assert.ok(e instanceof ConfigError);
    assert.equal(e.name, "ConfigError");
    return [...e.problems];
  }
  assert.fail("expected a ConfigError");
}

test("config - defaults suit a local run", () => {
  const c = loadConfig({});
  assert.equal(c.JETGATE_ENV, "development");
  assert.deepEqual(c.JETGATE_NATS_URL, ["nats://127.0.0.1:4222"]);
  assert.deepEqual(c.JETGATE_LANES, ["default"]);
  assert.equal(c.JETGATE_GATEWAY_PORT, 8080);
  assert.equal(c.JETGATE_CURSOR_KEYS.length, 1);
  assert.equal(c.JETGATE_TRUST_FORWARDED_FOR, false);
  // health and metrics on a listener of their own, off the network unless told otherwise
  assert.equal(c.JETGATE_METRICS_HOST, "127.0.0.1");
  assert.equal(c.JETGATE_GATEWAY_METRICS_PORT, 9090);
  assert.equal(c.JETGATE_JWT_MAX_LIFETIME_S, 86_400);
  assert.equal(c.JETGATE_MAX_DEVICES_PER_USER, 64);
});

test("config - values parse into their types", () => {
  const c = loadConfig({
    JETGATE_NATS_URL: "nats://a:1, nats://b:2", JETGATE_LANES: "chat,notify,chat", JETGATE_SHARDS: "16",
    JETGATE_TRUST_FORWARDED_FOR: "yes", JETGATE_CURSOR_KEYS: `${key},${Buffer.alloc(40, 2).toString("base64")}`,
  });
  assert.deepEqual(c.JETGATE_NATS_URL, ["nats://a:1", "nats://b:2"]);
  assert.deepEqual(c.JETGATE_LANES, ["chat", "notify"]);
  assert.equal(c.JETGATE_SHARDS, 16);
  assert.equal(c.JETGATE_TRUST_FORWARDED_FOR, true);
  assert.equal(c.JETGATE_CURSOR_KEYS[1]!.byteLength, 40);
});

test("config - each bad value is named with its variable and reason", () => {
  const cases: [Record<string, string>, RegExp][] = [
    [{ JETGATE_GATEWAY_PORT: "abc" }, /^JETGATE_GATEWAY_PORT: must be an integer between 0 and 65535/],
    [{ JETGATE_GATEWAY_PORT: "70000" }, /^JETGATE_GATEWAY_PORT: must be between 0 and 65535, got 70000/],
    [{ JETGATE_NATS_URL: "http://x" }, /^JETGATE_NATS_URL: scheme must be one of/],
    [{ JETGATE_NATS_URL: "::" }, /^JETGATE_NATS_URL: not a URL/],
    [{ JETGATE_REDIS_URL: "nats://x" }, /^JETGATE_REDIS_URL: scheme/],
    [{ JETGATE_LANES: "a.b" }, /^JETGATE_LANES: lane may contain only/],
    [{ JETGATE_LANES: "chat,_all" }, /^JETGATE_LANES: lane "_all" is reserved \(the watermark hash's field for the user's head over all lanes\)$/m],
    [{ JETGATE_TRUST_FORWARDED_FOR: "maybe" }, /^JETGATE_TRUST_FORWARDED_FOR: must be true or false/],
    // gone with the pure-JS fallback: the gateway runs on the native binary or not at all
    [{ JETGATE_ALLOW_UWS_FALLBACK: "true" }, /^JETGATE_ALLOW_UWS_FALLBACK: unknown setting/],
    [{ JETGATE_LOG_LEVEL: "loud" }, /^JETGATE_LOG_LEVEL: /],
    [{ JETGATE_CURSOR_KEYS: "short" }, /^JETGATE_CURSOR_KEYS: key 0 decodes to 3 bytes/],
    [{ JETGATE_CURSOR_KEYS: "!!!" }, /^JETGATE_CURSOR_KEYS: key 0 is not base64/],
    [{ JETGATE_REDIS_PREFIX: "a:b" }, /^JETGATE_REDIS_PREFIX: /],
    [{ JETGATE_JWT_MAX_LIFETIME_S: "10" }, /^JETGATE_JWT_MAX_LIFETIME_S: must be between 60 and 31622400, got 10/],
    [{ JETGATE_MAX_DEVICES_PER_USER: "0" }, /^JETGATE_MAX_DEVICES_PER_USER: must be between 1 and 10000, got 0/],
    [{ JETGATE_GATEWAY_METRICS_PORT: "-1" }, /^JETGATE_GATEWAY_METRICS_PORT: must be between 0 and 65535/],
    [{ JETGATE_PORT: "1" }, /^JETGATE_PORT: unknown setting/],
    [{ JETGATE_ENV: "production" }, /^JETGATE_CURSOR_KEYS: required when JETGATE_ENV=production/],
    [{ JETGATE_NATS_TOKEN: "t", JETGATE_NATS_USER: "u" }, /^JETGATE_NATS_TOKEN: set one NATS authentication/],
    [{ JETGATE_JWT_PREVIOUS_SECRET: "old" }, /^JETGATE_JWT_PREVIOUS_SECRET: needs JETGATE_JWT_SECRET/],
    [{ JETGATE_ENV: "production", JETGATE_CURSOR_KEYS: key, JETGATE_JWT_SECRET: "s", JETGATE_FAULT_EXIT_AFTER: "push" }, /^JETGATE_FAULT_EXIT_AFTER: test-only/],
    [{ JETGATE_ENV: "production", JETGATE_CURSOR_KEYS: key, JETGATE_JWT_SECRET: "s", JETGATE_FAULT_AUTH_PAUSE_MS: "100" }, /^JETGATE_FAULT_AUTH_PAUSE_MS: test-only/],
    [{ JETGATE_ENV: "production", JETGATE_CURSOR_KEYS: key, JETGATE_JWT_SECRET: "s", JETGATE_FAULT_REGISTRY_LAG_MS: "100" }, /^JETGATE_FAULT_REGISTRY_LAG_MS: test-only/],
    [{ JETGATE_ENV: "production", JETGATE_CURSOR_KEYS: key, JETGATE_JWT_SECRET: "s", JETGATE_DEMO_DIR: "/x" }, /^JETGATE_DEMO_DIR: the demo page hands out tokens/],
  ];
  for (const [env, re] of cases) {
    const p = problems(env);
    assert.ok(p.some((line) => re.test(line)), `${JSON.stringify(env)} -> ${JSON.stringify(p)}`);
  }
});

test("config - all problems are reported at once", () => {
  const p = problems({ JETGATE_GATEWAY_PORT: "x", JETGATE_SHARDS: "0", JETGATE_TYPO: "1" });
  assert.equal(p.length, 3, JSON.stringify(p));
});

test("config - production secrets are required of gateways only: workers and the CLI never use them", () => {
  assert.equal(loadConfig({ JETGATE_ENV: "production" }, "worker").JETGATE_ENV, "production");
  assert.equal(loadConfig({ JETGATE_ENV: "production" }, "tool").JETGATE_ENV, "production");
  assert.throws(() => loadConfig({ JETGATE_ENV: "production" }, "gateway"), ConfigError);
});

test("config - production with its secrets set is accepted", () => {
  const c = loadConfig({ JETGATE_ENV: "production", JETGATE_CURSOR_KEYS: key, JETGATE_JWT_SECRET: "s" });
  assert.equal(c.JETGATE_CURSOR_KEYS.length, 1);
  assert.ok(ENV_VARS.includes("JETGATE_NATS_URL"));
});

test("config - a production admin token must be long and not guessable; development keeps the 16-character floor", () => {
  const prod = (t: string) => () => loadConfig({ JETGATE_ENV: "production", JETGATE_CURSOR_KEYS: key, JETGATE_JWT_SECRET: "s", JETGATE_ADMIN_TOKEN: t });
  for (const weak of ["aaaaaaaaaaaaaaaa", "a".repeat(64), "passwordpasswordpasswordpassword", "0123456789abcdef"]) {
    assert.throws(prod(weak), (e: unknown) => e instanceof ConfigError && /JETGATE_ADMIN_TOKEN: (must be at least 32 characters|looks guessable).*openssl rand -base64 32/.test(e.message), weak);
  }
  for (const strong of [randomBytes(32).toString("base64"), randomBytes(32).toString("hex"), randomBytes(24).toString("base64url")]) {
    assert.equal(tokenStrengthProblem(strong), undefined, strong);
    assert.equal(prod(strong)().JETGATE_ADMIN_TOKEN, strong);
  }
  assert.match(tokenStrengthProblem("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa")!, /looks guessable \(about 0 bits from 1 distinct characters/);
  assert.equal(loadConfig({ JETGATE_ADMIN_TOKEN: "aaaaaaaaaaaaaaaa" }).JETGATE_ADMIN_TOKEN, "aaaaaaaaaaaaaaaa", "development: 16 characters are enough");
});

test("config - JETGATE_OPS_KEY: base64 keys of at least 32 bytes, named when not", () => {
  const k = Buffer.alloc(32, 1).toString("base64");
  assert.equal(loadConfig({ JETGATE_OPS_KEY: `${k},${k}` }).JETGATE_OPS_KEY!.length, 2);
  assert.equal(loadConfig({}).JETGATE_OPS_KEY, undefined);
  assert.throws(() => loadConfig({ JETGATE_OPS_KEY: Buffer.alloc(16).toString("base64") }), /JETGATE_OPS_KEY: key 0 decodes to 16 bytes; at least 32 are required/);
  assert.throws(() => loadConfig({ JETGATE_OPS_KEY: "not base64!" }), /JETGATE_OPS_KEY: key 0 is not base64/);
});

test("config - docs/config.md documents exactly the variables of the schema", async () => {
  const { readFile } = await import("node:fs/promises");
  const doc = await readFile(new URL("../../docs/config.md", import.meta.url), "utf8");
  const documented = new Set([...doc.matchAll(/^\| `(JETGATE_[A-Z0-9_]+)` \|/gm)].map((m) => m[1]));
  assert.deepEqual([...documented].sort(), [...ENV_VARS].sort());
});

test("config - every JETGATE_ setting README.md and docs/ name is accepted, and each table default loads", async () => {
  const { readFile, readdir } = await import("node:fs/promises");
  const root = new URL("../../", import.meta.url);
  const files = ["README.md", "bench/README.md", "k8s/jetgate/README.md", ...(await readdir(new URL("docs/", root))).filter((f) => f.endsWith(".md")).map((f) => `docs/${f}`)];
  // names that are not settings: the registry's stream and the workers' floor records'
  const notSettings = new Set(["JETGATE_REGISTRY", "JETGATE_FLOORS"]);
  const known = new Set<string>(ENV_VARS);
  for (const f of files) {
    const text = await readFile(new URL(f, root), "utf8");
    for (const [name] of text.matchAll(/\bJETGATE_[A-Z0-9_]+\b/g)) {
      if (notSettings.has(name)) continue;
      assert.ok(known.has(name), `${f} names ${name}, which the config refuses as unknown`);
    }
  }
  const table = await readFile(new URL("docs/config.md", root), "utf8");
  for (const [, name, value] of table.matchAll(/^\| `(JETGATE_[A-Z0-9_]+)` \| `([^`]*)` \|/gm)) {
    assert.doesNotThrow(() => loadConfig({ [name!]: value! }), `${name}=${value}, its documented default`);
  }
});
