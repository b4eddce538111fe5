/**
 * Dispatch while NATS is down (issue: reliability, item 4): `POST /v1/dispatch` (and `/batch`)
 * answer 503 with Retry-After and a message naming NATS, never 500; the Dispatcher's callers get
 * DispatchUnavailableError, a typed error to retry on; nothing published meanwhile, and every
 * entry that was answered 200 is delivered once NATS is back.
 */
import { test, after } from "node:test";
import { DispatchUnavailableError } from "../../protocol/index.js";
import assert from "node:assert/strict";
import { startStack } from "../harness/stack.js";
import { TestDevice, deviceToken } from "../harness/device.js";
import { waitFor } from "../harness/wait.js";

const stack = await startStack({ env: { JETGATE_LEASE_MS: "1000", JETGATE_SERVICE_TOKEN: "svc-secret" }, gateway: {} });
after(() => stack.dispose());
const gateway = stack.gateway!;

const post = (path: string, body: unknown) =>
  fetch(`http://127.0.0.1:${gateway.httpPort}${path}`, {
    method: "POST",
    headers: { authorization: "Bearer svc-secret", "content-type": "application/json" },
    body: JSON.stringify(body),
  });
const one = (id: string) => ({ dispatch_id: id, message_id: id, lane: "default", recipients: ["outage"], body: id });

test("dispatch during a NATS outage: 503 with Retry-After naming NATS, a typed error for the library; what was answered 200 arrives", { timeout: 120_000 }, async () => {
  assert.equal((await post("/v1/dispatch", one("before"))).status, 200);

  await stack.infra.nats.kill();
  // the gateway's connection notices the closed socket and starts reconnecting
  const refused = await waitFor("503 while NATS is down", async () => {
    const r = await post("/v1/dispatch", one("during"));
    return r.status === 503 ? r : undefined;
  }, { timeoutMs: 20_000, intervalMs: 100 });
  assert.equal(refused.headers.get("retry-after"), "2");
  const body = (await refused.json()) as { error: string; code: string };
  assert.equal(body.code, "DISPATCH_UNAVAILABLE");
  assert.match(body.error, /NATS .*(lost|unreachable).*nothing was published/);
  const batch = await post("/v1/dispatch/batch", { dispatches: [one("during-b1"), one("during-b2")] });
  assert.equal(batch.status, 503);
  assert.equal(batch.headers.get("retry-after"), "2");
  // bad input is still 400 while NATS is down: validation comes first
  assert.equal((await post("/v1/dispatch", { ...one("x"), lane: "nope" })).status, 400);

  // the library: a typed error, thrown before anything is published
  await waitFor("the test's own connection noticed", () => stack.dispatcher.unavailable !== undefined, { timeoutMs: 20_000 });
  await assert.rejects(stack.dispatcher.dispatch({ ...one("lib"), body: new TextEncoder().encode("lib") }), (err: unknown) => err instanceof DispatchUnavailableError && err.retryAfterMs === 2000 && /nothing was published/.test(err.message));

  await stack.infra.nats.start();
  await waitFor("200 once NATS is back", async () => (await post("/v1/dispatch", one("after"))).status === 200, { timeoutMs: 60_000, intervalMs: 250 });
  // the gateway takes devices again once its own NATS probe (every second) has been answered:
  // up to a second after dispatch works again (a device connected before that got 503)
  await waitFor("the gateway ready again", async () => (await gateway.http("/readyz")).status === 200, { timeoutMs: 20_000, intervalMs: 100 });

  const dev = await TestDevice.connect(gateway.httpPort);
  dev.send({ t: "AUTH", v: 1, token: await deviceToken("outage"), device: "d1" });
  await dev.next("SYNCED", 60_000);
  await waitFor("both acknowledged entries", () => ["before", "after"].every((id) => dev.entries().some((e) => e.id === id)), { timeoutMs: 30_000 });
  const ids = dev.entries().map((e) => e.id);
  assert.deepEqual(ids.filter((id) => id.startsWith("during") || id === "lib"), [], "nothing refused was appended");
  assert.equal(ids.filter((id) => id === "before").length, 1);
  dev.close();
});
