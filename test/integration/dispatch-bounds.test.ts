/**
 * POST /v1/dispatch is bounded by what it appends, not only by its own bytes: recipients x body
 * bytes over JETGATE_DISPATCH_MAX_BYTES is a 413 with nothing appended (a probe's 10,000 x 64 KiB,
 * 757 KB of request, took a gateway from 124 MB to 3.3 GB). And input that would be appended as
 * something else than was sent is a named 400: base64 that does not decode whole, a lone surrogate
 * in a text body, one dispatch_id twice in a batch with different contents.
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { jetstreamManager } from "@nats-io/jetstream";
import { startStack } from "../harness/stack.js";

const LIMIT = 1024 * 1024;
const stack = await startStack({ env: { JETGATE_SERVICE_TOKEN: "svc-secret", JETGATE_DISPATCH_MAX_BYTES: String(LIMIT) }, worker: false, gateway: {} });
after(() => stack.dispose());
const gateway = stack.gateway!;

async function post(path: string, body: unknown): Promise<{ status: number; json: { error?: string; field?: string; results?: unknown[]; dispatches?: unknown[] } }> {
  const res = await fetch(`http://127.0.0.1:${gateway.httpPort}${path}`, {
    method: "POST",
    headers: { authorization: "Bearer svc-secret", "content-type": "application/json" },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
  return { status: res.status, json: (await res.json()) as { error?: string; field?: string } };
}

async function appended(): Promise<number> {
  const jsm = await jetstreamManager(stack.nc);
  let n = 0;
  for (const s of stack.registry.state.shards.keys()) n += (await jsm.streams.info(`MBX_${s}`)).state.messages;
  return n;
}

const users = (n: number, prefix: string) => Array.from({ length: n }, (_, i) => `${prefix}${i}`);
const b64 = (bytes: number) => Buffer.alloc(bytes, 7).toString("base64");

test("dispatch bounds - recipients x body bytes: at the limit appended (200), over it 413 naming JETGATE_DISPATCH_MAX_BYTES and nothing appended", async () => {
  const body = 64 * 1024;
  const before = await appended();
  const at = await post("/v1/dispatch", { dispatch_id: "at", message_id: "at", lane: "default", recipients: users(LIMIT / body, "at"), body_b64: b64(body) });
  assert.equal(at.status, 200, JSON.stringify(at.json));
  assert.equal(at.json.results!.length, 16);
  assert.equal(await appended(), before + 16);
  const over = await post("/v1/dispatch", { dispatch_id: "over", message_id: "over", lane: "default", recipients: users(LIMIT / body + 1, "ov"), body_b64: b64(body) });
  assert.equal(over.status, 413);
  assert.match(over.json.error!, /^recipients: the request appends 1114112 bytes \(recipients x body bytes\), over JETGATE_DISPATCH_MAX_BYTES \(1048576\): split it; nothing was appended$/);
  assert.equal(over.json.field, "recipients");
  // a batch counts all its dispatches: 2 x 10 x 64 KiB
  const batch = await post("/v1/dispatch/batch", {
    dispatches: [0, 1].map((i) => ({ dispatch_id: `ob${i}`, message_id: `ob${i}`, lane: "default", recipients: users(10, `ob${i}-`), body_b64: b64(body) })),
  });
  assert.equal(batch.status, 413);
  assert.match(batch.json.error!, /over all its dispatches\), over JETGATE_DISPATCH_MAX_BYTES/);
  assert.equal(batch.json.field, "dispatches");
  assert.equal(await appended(), before + 16, "nothing of the refused requests");
});

test("dispatch bounds - base64 that does not decode whole, and a lone surrogate in text, are named 400s (they appended other bytes than were sent)", async () => {
  const before = await appended();
  for (const [body, re] of [
    [{ body_b64: "Q" }, /^body_b64: must be base64/],
    [{ body_b64: "QUJD=" }, /^body_b64: must be base64/],
  ] as const) {
    const r = await post("/v1/dispatch", { dispatch_id: "b", message_id: "b", lane: "default", recipients: ["u1"], ...body });
    assert.equal(r.status, 400, JSON.stringify(body));
    assert.match(r.json.error!, re);
    assert.equal(r.json.field, "body_b64");
  }
  const lone = await post("/v1/dispatch", '{"dispatch_id":"s","message_id":"s","lane":"default","recipients":["u1"],"body":"a\\ud800b"}');
  assert.equal(lone.status, 400);
  assert.match(lone.json.error!, /^body: must be text: it holds a lone UTF-16 surrogate/);
  assert.equal(await appended(), before);
});

test("dispatch bounds - one dispatch_id twice in a batch with another body is a 400 naming it; the same dispatch twice is a retry (duplicate)", async () => {
  const before = await appended();
  const one = (body: string) => ({ dispatch_id: "twice", message_id: "twice", lane: "default", recipients: ["u2"], body });
  const bad = await post("/v1/dispatch/batch", { dispatches: [one("a"), one("b")] });
  assert.equal(bad.status, 400);
  assert.equal(bad.json.field, "dispatches.1.dispatch_id");
  assert.match(bad.json.error!, /^dispatches\.1\.dispatch_id: repeats the dispatch_id of dispatches\.0 with another body/);
  assert.equal(await appended(), before, "nothing of that batch");
  const retry = await post("/v1/dispatch/batch", { dispatches: [one("a"), one("a")] });
  assert.equal(retry.status, 200);
  const [first, second] = retry.json.dispatches as { results: { seq: string; duplicate: boolean }[] }[];
  assert.equal(second!.results[0]!.duplicate, true);
  assert.equal(second!.results[0]!.seq, first!.results[0]!.seq);
  assert.equal(await appended(), before + 1);
});
