/**
 * Service tokens as backend teams meet them (docs/security.md, "Service tokens"): a right token is
 * served while another client at the same address retries a stale one; named tokens with scopes
 * (403 naming the scope on every route a token's scopes do not cover); a rotation with two tokens
 * valid at once and no 401 during the roll; reloads on change and on SIGHUP that drop no
 * connection; an audit line per users API call and counts per token name.
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { serviceTokenHash } from "../../protocol/index.js";
import { spawnGateway, startStack } from "../harness/stack.js";
import { deviceToken, TestDevice } from "../harness/device.js";
import { waitFor } from "../harness/wait.js";

const SINGLE = "single-Zq3v8Xk1Lr7Tn2Bw9Hc4Jd6Fs0Gm";
const dir = mkdtempSync(join(tmpdir(), "jetgate-service-tokens-"));
const TOKENS_FILE = join(dir, "tokens.yaml");
after(() => rmSync(dir, { recursive: true, force: true }));

/** One token per scope, each named after it: `t-<scope>` opens only that scope's routes. */
const SCOPES = ["dispatch", "read", "presence", "sessions", "revoke"] as const;
const tokenOf = (name: string) => `${name}-secret-Wx9Lm3Rv8Bz1Hc6Jd0Fs5Yg`;
type Entry = { name: string; scopes: readonly string[]; notAfter?: string };
function writeTokens(entries: Entry[]): void {
  const lines = entries.map((e) => `  - name: ${e.name}\n    sha256: "${serviceTokenHash(tokenOf(e.name))}"\n    scopes: [${e.scopes.join(", ")}]\n${e.notAfter ? `    not_after: "${e.notAfter}"\n` : ""}`);
  writeFileSync(TOKENS_FILE, `tokens:\n${lines.join("")}`);
}
const PER_SCOPE: Entry[] = SCOPES.map((s) => ({ name: `t-${s}`, scopes: [s] }));
writeTokens(PER_SCOPE);

const stack = await startStack({
  env: { JETGATE_SERVICE_TOKEN: SINGLE },
  gateway: { JETGATE_SERVICE_TOKENS_FILE: TOKENS_FILE, JETGATE_TRUST_FORWARDED_FOR: "true" },
});
const gw = stack.gateway!;
after(() => stack.dispose());

interface Call {
  status: number;
  json: Record<string, unknown>;
  retryAfter: string | null;
}
async function call(method: string, path: string, token: string, opts: { body?: unknown; from?: string } = {}): Promise<Call> {
  const res = await fetch(`http://127.0.0.1:${gw.httpPort}${path}`, {
    method,
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json", ...(opts.from !== undefined ? { "x-forwarded-for": opts.from } : {}) },
    ...(opts.body !== undefined ? { body: JSON.stringify(opts.body) } : {}),
  });
  return { status: res.status, retryAfter: res.headers.get("retry-after"), json: (await res.json()) as Record<string, unknown> };
}
let n = 0;
const dispatchBody = (user: string) => ({ dispatch_id: `st-${n}`, message_id: `st-${n++}`, lane: "default", recipients: [user], body: "hi" });
const reloads = (outcome: "ok" | "error") => gw.metric("jetgate_gateway_service_token_reloads_total", { outcome });
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Every route of the API: its scope, and a call to it with `token`. */
const ROUTES: { route: string; scope: (typeof SCOPES)[number]; call: (token: string, from: string) => Promise<Call> }[] = [
  { route: "POST /v1/dispatch", scope: "dispatch", call: (t, from) => call("POST", "/v1/dispatch", t, { body: dispatchBody("scoped"), from }) },
  { route: "POST /v1/dispatch/batch", scope: "dispatch", call: (t, from) => call("POST", "/v1/dispatch/batch", t, { body: { dispatches: [dispatchBody("scoped")] }, from }) },
  { route: "GET /v1/users/{user}/mailbox", scope: "read", call: (t, from) => call("GET", "/v1/users/scoped/mailbox", t, { from }) },
  { route: "GET /v1/users/{user}/entries", scope: "read", call: (t, from) => call("GET", "/v1/users/scoped/entries?limit=5", t, { from }) },
  { route: "GET /v1/users/{user}/presence", scope: "presence", call: (t, from) => call("GET", "/v1/users/scoped/presence", t, { from }) },
  { route: "POST /v1/presence", scope: "presence", call: (t, from) => call("POST", "/v1/presence", t, { body: { users: ["scoped"] }, from }) },
  { route: "POST /v1/users/{user}/disconnect", scope: "sessions", call: (t, from) => call("POST", "/v1/users/scoped/disconnect", t, { body: { mode: "reconnect" }, from }) },
  { route: "POST /v1/users/{user}/revoke", scope: "revoke", call: (t, from) => call("POST", "/v1/users/scoped/revoke", t, { body: {}, from }) },
];

test("service tokens - one address: a client retrying a stale token every 50 ms is held off; the right token, sent beside it every 100 ms, is served every time", async () => {
  // both from the socket's address (127.0.0.1): no X-Forwarded-For
  const stale: number[] = [];
  const right: number[] = [];
  const until = Date.now() + 8000;
  const staleLoop = (async () => {
    while (Date.now() < until) {
      stale.push((await call("POST", "/v1/dispatch", "stale-token-of-an-old-pod", { body: dispatchBody("pair") })).status);
      await sleep(50);
    }
  })();
  const rightLoop = (async () => {
    while (Date.now() < until) {
      right.push((await call("POST", "/v1/dispatch", SINGLE, { body: dispatchBody("pair") })).status);
      await sleep(100);
    }
  })();
  await Promise.all([staleLoop, rightLoop]);
  assert.ok(right.length >= 40, `${right.length} right calls`);
  assert.deepEqual([...new Set(right)], [200], `the right token's answers: ${right.join(" ")}`);
  assert.ok(stale.filter((s) => s === 429).length > stale.length / 2, `the stale token's answers: ${stale.join(" ")}`);
  const wrong = stale.filter((s) => s === 401).length;
  assert.ok(wrong >= 10 && wrong <= 12, `${wrong} answered 401: 10, then one per 6 s`);
  assert.equal(gw.output.filter((l) => l.includes("too many wrong service tokens from this address")).length >= 1, true, "the address held off is logged");
});

test("service tokens - every route answers 403 naming its scope to a token without it, and serves a token with it; each call audited and counted by token name", async () => {
  for (const r of ROUTES) {
    for (const scope of SCOPES) {
      const a = await r.call(tokenOf(`t-${scope}`), "198.51.100.20");
      if (scope === r.scope) {
        assert.equal(a.status, 200, `${r.route} with t-${scope}: ${JSON.stringify(a.json)}`);
      } else {
        assert.equal(a.status, 403, `${r.route} with t-${scope}`);
        assert.equal(a.json.scope, r.scope, r.route);
        assert.match(String(a.json.error), new RegExp(`service token "t-${scope}" does not have the scope ${r.scope} \\(it has ${scope}\\)`), r.route);
      }
    }
    // the single token has every scope
    assert.equal((await r.call(SINGLE, "198.51.100.20")).status, 200, `${r.route} with JETGATE_SERVICE_TOKEN`);
  }
  // one audit line per users API call made with a token of the gateway's, served or refused
  const audit = () => gw.output.filter((l) => l.includes('"audit":true')).map((l) => JSON.parse(l) as Record<string, unknown>);
  await waitFor("the audit lines", () => audit().length >= 6 * 6);
  const revokes = audit().filter((l) => l.route === "POST /v1/users/:user/revoke");
  assert.deepEqual(revokes.map((l) => [l.token, l.status]).sort(), [["default", 200], ...SCOPES.map((s) => [`t-${s}`, s === "revoke" ? 200 : 403])].sort());
  const served = revokes.find((l) => l.token === "t-revoke")!;
  assert.equal(served.user, "scoped");
  assert.equal(served.client, "198.51.100.20");
  assert.equal(served.mode, "signed_out");
  assert.equal(typeof served.issued_before, "number");
  const refused = revokes.find((l) => l.token === "t-read")!;
  assert.match(String(refused.error), /does not have the scope revoke/);
  assert.equal(audit().filter((l) => String(l.route).includes("dispatch")).length, 0, "dispatches are counted, not logged");
  // counted per token name
  assert.equal(await gw.metric("jetgate_gateway_dispatch_requests_total", { token: "t-dispatch", status: "200" }), 2);
  assert.equal(await gw.metric("jetgate_gateway_dispatch_requests_total", { token: "t-read", status: "403" }), 2);
  assert.equal(await gw.metric("jetgate_gateway_users_api_requests_total", { token: "t-presence", status: "200" }), 2);
  assert.equal(await gw.metric("jetgate_gateway_users_api_requests_total", { token: "t-sessions", path: "/v1/users/:user/disconnect", status: "200" }), 1);
});

test("service tokens - a rotation: the new token added, the backends rolled, the old one removed, with no 401 in between; a connected device stays connected and gets every entry", async () => {
  const device = await TestDevice.connect(gw.httpPort);
  device.send({ t: "AUTH", v: 1, token: await deviceToken("rotating"), device: "phone" });
  await device.next("SYNCED");
  writeTokens([...PER_SCOPE, { name: "crm-2026-11", scopes: ["dispatch", "read"] }]);
  await waitFor("crm-2026-11 in force", async () => (await call("GET", "/v1/users/rotating/mailbox", tokenOf("crm-2026-11"), { from: "198.51.100.30" })).status === 200);

  // three pods of one backend, each dispatching every 40 ms with the token it was rolled with
  const pods = [tokenOf("crm-2026-11"), tokenOf("crm-2026-11"), tokenOf("crm-2026-11")];
  const answers: number[] = [];
  let sent = 0;
  let running = true;
  const loops = pods.map(async (_, i) => {
    while (running) {
      const r = await call("POST", "/v1/dispatch", pods[i]!, { body: dispatchBody("rotating"), from: "198.51.100.31" });
      answers.push(r.status);
      if (r.status === 200) sent++;
      await sleep(40);
    }
  });
  const okBefore = await reloads("ok");
  // 1. add the new token beside the old one
  writeTokens([...PER_SCOPE, { name: "crm-2026-11", scopes: ["dispatch", "read"] }, { name: "crm-2026-12", scopes: ["dispatch", "read"] }]);
  await waitFor("the file reloaded with both", async () => (await reloads("ok")) > okBefore);
  // 2. roll the pods one at a time
  for (let i = 0; i < pods.length; i++) {
    await sleep(300);
    pods[i] = tokenOf("crm-2026-12");
  }
  await sleep(300);
  // 3. remove the old token
  const okMid = await reloads("ok");
  writeTokens([...PER_SCOPE, { name: "crm-2026-12", scopes: ["dispatch", "read"] }]);
  await waitFor("the file reloaded without the old one", async () => (await reloads("ok")) > okMid);
  await sleep(300);
  running = false;
  await Promise.all(loops);
  assert.ok(answers.length >= 30, `${answers.length} calls during the roll`);
  assert.deepEqual([...new Set(answers)], [200], `every call during the roll: ${answers.join(" ")}`);
  assert.equal((await call("POST", "/v1/dispatch", tokenOf("crm-2026-11"), { body: dispatchBody("rotating"), from: "198.51.100.32" })).status, 401, "the old token, removed");
  assert.ok((await gw.metric("jetgate_gateway_dispatch_requests_total", { token: "crm-2026-11", status: "200" })) > 0);
  assert.ok((await gw.metric("jetgate_gateway_dispatch_requests_total", { token: "crm-2026-12", status: "200" })) > 0);
  // the device never noticed
  await waitFor(`all ${sent} entries at the device`, () => device.entries().length === sent, { timeoutMs: 15_000 });
  assert.equal(device.closed, undefined);
  assert.equal(await device.roundTrip(), true);
  assert.ok(gw.output.some((l) => l.includes('"service tokens reloaded"') && l.includes('"removed":["crm-2026-11"]')), "the reload logged what it removed");
  device.close();
});

test("service tokens - SIGHUP reloads the file; an edit that cannot be used keeps the tokens in force, logged and counted; a token past not_after is refused by name", async () => {
  const device = await TestDevice.connect(gw.httpPort);
  device.send({ t: "AUTH", v: 1, token: await deviceToken("hup"), device: "phone" });
  await device.next("SYNCED");
  const hupsBefore = gw.output.filter((l) => l.includes('"why":"SIGHUP"')).length;
  writeTokens([...PER_SCOPE, { name: "by-hup", scopes: ["read"] }, { name: "ended", scopes: ["read"], notAfter: "2020-01-01T00:00:00Z" }]);
  gw.proc.kill("SIGHUP");
  await waitFor("the SIGHUP reload logged", () => gw.output.filter((l) => l.includes('"why":"SIGHUP"')).length > hupsBefore);
  assert.equal((await call("GET", "/v1/users/hup/mailbox", tokenOf("by-hup"), { from: "198.51.100.40" })).status, 200);
  const ended = await call("GET", "/v1/users/hup/mailbox", tokenOf("ended"), { from: "198.51.100.40" });
  assert.equal(ended.status, 401);
  assert.match(String(ended.json.error), /service token "ended" expired at 2020-01-01T00:00:00\.000Z/);
  assert.equal(await gw.metric("jetgate_gateway_service_token_not_after_seconds", { token: "ended" }), Date.parse("2020-01-01T00:00:00Z") / 1000);

  const errorsBefore = await reloads("error");
  writeFileSync(TOKENS_FILE, "tokens:\n  - name: broken\n    scopes: [everything]\n");
  await waitFor("the failed reload counted", async () => (await reloads("error")) > errorsBefore);
  assert.equal((await call("GET", "/v1/users/hup/mailbox", tokenOf("by-hup"), { from: "198.51.100.40" })).status, 200, "the tokens in force stay");
  assert.ok(gw.output.some((l) => l.includes("service tokens not reloaded") && l.includes("tokens.0.sha256")), "the failure logged, naming the field");
  assert.equal(gw.proc.exitCode, null, "SIGHUP does not end the gateway");
  assert.equal(device.closed, undefined);
  assert.equal(await device.roundTrip(), true);
  device.close();
  writeTokens(PER_SCOPE);
});

test("service tokens - a gateway started with a tokens file it cannot use does not start, and names the variable and the field", async () => {
  const bad = join(dir, "bad.yaml");
  writeFileSync(bad, `tokens:\n  - name: x\n    sha256: "${serviceTokenHash("x")}"\n    scopes: [dispatch, write]\n`);
  await assert.rejects(spawnGateway(stack.infra.env, { JETGATE_SERVICE_TOKENS_FILE: bad }), /exited with 1:[\s\S]*JETGATE_SERVICE_TOKENS_FILE: tokens\.0\.scopes\.1: /);
});
