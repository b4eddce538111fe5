/**
 * The device port's HTTP edges, as a backend or a probe meets them: every answer is JSON (an
 * unknown route too), the bearer scheme is case-insensitive, an unknown body field is named, and
 * wrong service tokens are throttled per client address over the dispatch and users APIs together.
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { startStack } from "../harness/stack.js";

const TOKEN = "http-edges-secret";
// the throttle counts by client address: with X-Forwarded-For trusted, each test is an address of its own
const stack = await startStack({ env: { JETGATE_SERVICE_TOKEN: TOKEN }, gateway: { JETGATE_TRUST_FORWARDED_FOR: "true" } });
const gw = stack.gateway!;
after(() => stack.dispose());

async function call(method: string, path: string, opts: { auth?: string; body?: unknown; from?: string } = {}) {
  const res = await fetch(`http://127.0.0.1:${gw.httpPort}${path}`, {
    method,
    headers: { authorization: opts.auth ?? `Bearer ${TOKEN}`, "content-type": "application/json", "x-forwarded-for": opts.from ?? "198.51.100.1" },
    ...(opts.body !== undefined ? { body: JSON.stringify(opts.body) } : {}),
  });
  const text = await res.text();
  return { status: res.status, type: res.headers.get("content-type"), retryAfter: res.headers.get("retry-after"), json: JSON.parse(text) as Record<string, unknown> };
}

const dispatch = (n: string) => ({ dispatch_id: `edge-${n}`, message_id: `edge-${n}`, lane: "default", recipients: ["edgy"], body: "hi" });

test("http edges - an unknown route or method is a JSON 404 naming it", async () => {
  for (const [method, path] of [["GET", "/nope"], ["POST", "/v1/users"], ["DELETE", "/v1/dispatch"], ["GET", "/metrics"]] as const) {
    const r = await call(method, path);
    assert.equal(r.status, 404, `${method} ${path}`);
    assert.equal(r.type, "application/json");
    assert.match(String(r.json.error), new RegExp(`no such route: ${method} ${path.replace("/", "\\/")}`));
  }
});

test("http edges - the bearer scheme is case-insensitive on the dispatch and users APIs; the token is exact", async () => {
  for (const scheme of ["bearer", "BEARER"]) {
    assert.equal((await call("POST", "/v1/dispatch", { auth: `${scheme} ${TOKEN}`, body: dispatch(scheme), from: "198.51.100.2" })).status, 200, scheme);
    assert.equal((await call("GET", "/v1/users/edgy/presence", { auth: `${scheme} ${TOKEN}`, from: "198.51.100.2" })).status, 200, scheme);
  }
  assert.equal((await call("GET", "/v1/users/edgy/presence", { auth: `Bearer ${TOKEN.toUpperCase()}`, from: "198.51.100.2" })).status, 401);
});

test("http edges - an unknown body field is a 400 that names it", async () => {
  const users = await call("POST", "/v1/users/edgy/disconnect", { body: { mode: "reconnect", colour: "blue" }, from: "198.51.100.3" });
  assert.equal(users.status, 400);
  assert.equal(users.json.field, "colour");
  const batch = await call("POST", "/v1/dispatch/batch", { body: { dispatches: [dispatch("b")], colour: "blue" }, from: "198.51.100.3" });
  assert.equal(batch.status, 400);
  assert.equal(batch.json.field, "colour");
});

test("http edges - wrong service tokens are throttled per address, over the dispatch and users APIs together: 10, then 429 with Retry-After; the right token and other addresses are not", async () => {
  const from = "198.51.100.4";
  for (let i = 0; i < 10; i++) {
    const r = i % 2 === 0 ? await call("POST", "/v1/dispatch", { auth: "Bearer wrong", body: dispatch(`w${i}`), from }) : await call("GET", "/v1/users/edgy/mailbox", { auth: "Bearer wrong", from });
    assert.equal(r.status, 401, `wrong token ${i + 1}`);
  }
  for (const r of [await call("GET", "/v1/users/edgy/presence", { auth: "Bearer wrong", from }), await call("POST", "/v1/dispatch", { auth: "Bearer wrong", body: dispatch("w11"), from })]) {
    assert.equal(r.status, 429);
    assert.match(r.retryAfter ?? "", /^[1-9]\d*$/);
    assert.match(String(r.json.error), /too many wrong tokens/);
  }
  // the right token is served from the held-off address (test/integration/service-tokens.test.ts
  // sends both at once); wrong ones from another address are not held off
  assert.equal((await call("GET", "/v1/users/edgy/presence", { from })).status, 200);
  assert.equal((await call("POST", "/v1/dispatch", { body: dispatch("w12"), from })).status, 200);
  assert.equal((await call("GET", "/v1/users/edgy/presence", { auth: "Bearer wrong", from: "198.51.100.5" })).status, 401);
});
