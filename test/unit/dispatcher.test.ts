/**
 * The Dispatcher's decisions in memory (protocol/io/dispatch.ts over a fake DispatchLink):
 * validation before anything is published, refusal while NATS is away, one unit in flight per
 * user (retries, timeouts, atomic batches and their fallback keep a user's order), the in-flight
 * window, and results numbered by the registry at the ack. The fake link
 * (test/harness/dispatch-fakes.ts) is a shard stream with JetStream's dedup by Nats-Msg-Id and
 * all-or-none batches; test/integration/dispatch*.test.ts run the same against nats-server, and
 * dispatcher-stall.test.ts what happens while NATS reads nothing.
 */
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { composeSeq, entryMsgId } from "../../protocol/index.js";
import { batchAck, entryAck, retryDelayMs, type AckAnswer } from "../../protocol/dispatch-ack.js";
import { MAX_RECIPIENTS, DispatchUnavailableError, DispatchValidationError, type DispatchRequest, type DispatchResult } from "../../protocol/dispatch-request.js";
import { nextUnit, type BatchLimits } from "../../protocol/dispatch-units.js";
import { LinkDispatcher, type DispatcherOptions } from "../../protocol/io/dispatch.js";
import { ManualClock, driven as drivenBy, pass as passBy } from "../harness/manual-clock.js";
import { FakeLink, json, type Policy } from "../harness/dispatch-fakes.js";

// Nothing else holds the process up while a test awaits what the manual clock will settle.
const alive = setInterval(() => undefined, 60_000);
after(() => clearInterval(alive));

/**
 * The Dispatcher's clock in these tests: its ack deadlines, sweeper and retry delays move only when
 * a test steps it (test/harness/manual-clock.ts: a millisecond at a time with a turn of the event
 * loop between, as the fake link answers on turns), so no test waits on the wall clock.
 */
const clock = new ManualClock(Date.now());
const pass = (ms: number) => passBy(clock, ms);
const driven = <T>(p: Promise<T>) => drivenBy(clock, p);

let epoch = 0;
/** Offsets from this one on have no seq in the registry (an offset past the 48-bit field). */
let noSeqFrom = Infinity;
/** Every user on shard 0 but those named `nobody*`; offsets numbered in the current `epoch`. */
const view = { shardOf: (u: string) => (u.startsWith("nobody") ? undefined : 0), seqOf: (_s: number, offset: number) => (offset >= noSeqFrom ? undefined : composeSeq(epoch, offset)) };

function rig(opts: Partial<DispatcherOptions> = {}) {
  const link = new FakeLink();
  const d = new LinkDispatcher(link, () => view, { lanes: ["default", "chat"], ackTimeoutMs: 40, clock, ...opts });
  return { link, d };
}

const req = (id: string, recipients: string[], body = new Uint8Array([1])): DispatchRequest => ({ dispatch_id: id, message_id: id, lane: "default", recipients, body });
const turn = () => new Promise<void>((r) => setImmediate(r));
const ok = (r: DispatchResult | undefined) => {
  assert.ok(r !== undefined && "seq" in r, JSON.stringify(r, (_, v: unknown) => (typeof v === "bigint" ? String(v) : v)));
  return r;
};

test("dispatcher - bad input: a DispatchValidationError naming the field, and nothing published", async () => {
  const { link, d } = rig({ maxBodyBytes: 8 });
  const cases: [string, unknown, string, RegExp][] = [
    ["not an object", null, "request", /must be an object/],
    ["unknown key", { ...req("a", ["u"]), extra: 1 }, "request", /unrecognized key "extra"/],
    ["unsafe dispatch id", req("d.1", ["u"]), "dispatch_id", /^dispatch_id: dispatch id may contain only/],
    ["unknown lane", { ...req("a", ["u"]), lane: "gossip" }, "lane", /unknown lane "gossip"; configured lanes: default, chat/],
    ["recipients not an array", { ...req("a", ["u"]), recipients: "u" }, "recipients", /must be an array/],
    ["no recipients", req("a", []), "recipients", /at least one/],
    ["over MAX_RECIPIENTS", req("a", Array.from({ length: MAX_RECIPIENTS + 1 }, (_, i) => `u${i}`)), "recipients", /at most 10000/],
    ["unsafe user", req("a", ["u", "b>b"]), "recipients.1", /user id/],
    ["no shard owns the user (registry not initialised)", req("a", ["u", "nobody1"]), "recipients.1", /no shard owns this user/],
    ["a recipient twice", req("a", ["u", "u"]), "recipients", /must be unique/],
    ["body not bytes", { ...req("a", ["u"]), body: "text" }, "body", /must be bytes/],
    ["body over the bound", req("a", ["u"], new Uint8Array(9)), "body", /9 bytes exceeds the limit of 8/],
  ];
  for (const [name, r, field, re] of cases) {
    await assert.rejects(d.dispatch(r as DispatchRequest), (e: unknown) => {
      assert.ok(e instanceof DispatchValidationError, name);
      assert.equal(e.field, field, name);
      assert.match(e.message, re, name);
      return true;
    });
  }
  // a large one goes through the sliced path: the same answers
  await assert.rejects(d.dispatch(req("a", [...Array.from({ length: 600 }, (_, i) => `v${i}`), "v0"])), /recipients must be unique/);
  await assert.rejects(d.dispatchMany([req("a", ["u"]), req("b", ["u", "nobody"])]), (e: unknown) => e instanceof DispatchValidationError && e.field === "dispatches.1.recipients.1");
  await assert.rejects(d.dispatchMany([req("a", ["u"]), req("a", ["u"], new Uint8Array([2]))]), (e: unknown) => e instanceof DispatchValidationError && e.field === "dispatches.1.dispatch_id" && /another body/.test(e.message));
  await turn();
  assert.deepEqual(link.published, [], "nothing published");
  d.close();
  assert.equal(link.closed, true);
});

test("dispatcher - NATS away: DispatchUnavailableError (retry after 2 s) before anything is published; bad input is still a validation error", async () => {
  const { link, d } = rig();
  link.down = "NATS connection to nats://x lost; reconnecting";
  assert.equal(d.unavailable, link.down);
  for (const call of [() => d.dispatch(req("a", ["u"])), () => d.dispatch(req("big", Array.from({ length: 700 }, (_, i) => `w${i}`))), () => d.dispatchMany([req("b", ["u"])])]) {
    await assert.rejects(call(), (e: unknown) => e instanceof DispatchUnavailableError && e.retryAfterMs === 2000 && e.message === "NATS connection to nats://x lost; reconnecting: nothing was published");
  }
  await assert.rejects(d.dispatch({ ...req("c", ["u"]), lane: "nope" }), DispatchValidationError);
  await turn();
  assert.deepEqual(link.published, []);
  link.down = undefined;
  ok((await driven(d.dispatch(req("a", ["u"]))))[0]);
  d.close();
});

test("dispatcher - one result per recipient, in request order; seq numbered by the registry when the ack arrives; a repeat is a duplicate", async () => {
  const { link, d } = rig();
  epoch = 0;
  const pending = d.dispatch(req("m1", ["ann", "ben", "cid"]));
  epoch = 3; // an epoch change between the publish and its ack
  const results = await driven(pending);
  assert.deepEqual(results.map((r) => ok(r).user), ["ann", "ben", "cid"]);
  assert.deepEqual(results.map((r) => ok(r).seq), [1, 2, 3].map((o) => composeSeq(3, o)));
  assert.deepEqual(results.map((r) => ok(r).offset), [1, 2, 3]);
  assert.deepEqual(link.ids(), ["ann", "ben", "cid"].map((u) => entryMsgId("m1", u)), "Nats-Msg-Id <dispatch_id>:<user>");
  const again = await driven(d.dispatch(req("m1", ["ann"])));
  assert.equal(ok(again[0]).duplicate, true);
  assert.equal(ok(again[0]).offset, 1);
  assert.equal(d.stats.appended, 4);
  epoch = 0;
  d.close();
});

test("dispatcher - a user's entries stay in call order through refused publishes, timeouts and retryable errors; other users go meanwhile", async () => {
  const { link, d } = rig({ attempts: 5 });
  const plan: Record<string, ReturnType<Policy>[]> = {
    [entryMsgId("a1", "ann")]: ["throw"], // the client refused it
    // no ack (a timeout); landed, its ack lost; no responders (503)
    [entryMsgId("a2", "ann")]: ["drop", "lost", { status: { code: 503, description: "No Responders" }, data: new Uint8Array() }],
    [entryMsgId("a3", "ann")]: [json({ error: { code: 500, description: "leader moving" } })],
  };
  link.policy = ({ msgIds, attempt }) => plan[msgIds[0]!]?.[attempt - 1] ?? "append";
  const calls = ["a1", "a2", "a3", "a4"].map((id) => d.dispatch(req(id, ["ann"])));
  const other = d.dispatch(req("b1", ["bob"]));
  const bob = ok((await driven(other))[0]);
  const ann = (await driven(Promise.all(calls))).map((r) => ok(r[0]));
  assert.equal(bob.offset, 1, "bob was not held behind ann's trouble");
  assert.deepEqual(link.ids().filter((id) => id.endsWith(":ann")), ["a1", "a2", "a3", "a4"].map((id) => entryMsgId(id, "ann")), "ann's entries once each, in call order");
  assert.deepEqual(ann.map((r) => r.duplicate), [false, false, false, false], "a2 landed on its own try whose ack was lost: not a duplicate for the caller");
  const order = link.published.map((p) => p.msgIds[0]!).filter((id) => id.endsWith(":ann"));
  assert.ok(order.indexOf(entryMsgId("a3", "ann")) > order.lastIndexOf(entryMsgId("a2", "ann")), "a3 waited for a2's last attempt");
  assert.equal(d.stats.retries, 5, "a1 once, a2 three times, a3 once");
  d.close();
});

test("dispatcher - a refusal not worth a retry is DISPATCH_REJECTED; no ack after every attempt is DISPATCH_TIMEOUT; the user's next entries go on", async () => {
  const { link, d } = rig({ attempts: 2 });
  link.policy = ({ msgIds }) => (msgIds[0]!.startsWith("r1:") ? json({ error: { code: 400, description: "bad subject" } }) : msgIds[0]!.startsWith("r2:") ? "drop" : "append");
  const [r1, r2, r3] = await driven(Promise.all(["r1", "r2", "r3"].map((id) => d.dispatch(req(id, ["ann"])))));
  assert.deepEqual(r1![0], { user: "ann", shard: 0, error: { code: "DISPATCH_REJECTED", message: "400 bad subject" } });
  const t = r2![0]!;
  assert.ok("error" in t && t.error.code === "DISPATCH_TIMEOUT");
  assert.match(t.error.message, /^not confirmed after 2 attempts \(ack timeout after 40 ms\): it may or may not have been appended/);
  assert.equal(ok(r3![0]).offset, 1);
  assert.equal(link.published.filter((p) => p.msgIds[0]!.startsWith("r1:")).length, 1, "a rejection is not retried");
  assert.equal(link.published.filter((p) => p.msgIds[0]!.startsWith("r2:")).length, 2);
  assert.deepEqual([d.stats.failed, d.stats.appended], [2, 1]);
  d.close();
});

test("dispatcher - an offset the registry numbers no seq for is DISPATCH_REJECTED, not a wrong seq", async () => {
  const { link, d } = rig();
  link.preload("filler");
  noSeqFrom = 2;
  const [r] = await driven(d.dispatch(req("late", ["ann"])));
  noSeqFrom = Infinity;
  assert.deepEqual(r, { user: "ann", shard: 0, error: { code: "DISPATCH_REJECTED", message: "appended at offset 2, but the registry numbers no such offset of shard 0" } });
  d.close();
});

test("dispatcher - a hot user's queue goes as atomic batches: consecutive offsets, each result at its entry's", async () => {
  const { link, d } = rig({ minBatch: 3, maxBatch: 4 });
  const ids = Array.from({ length: 10 }, (_, i) => `h${i}`);
  const results = (await driven(Promise.all(ids.map((id) => d.dispatch(req(id, ["ann"])))))).map((r) => ok(r[0]));
  assert.deepEqual(link.published.map((p) => [p.batch, p.msgIds.length]), [[false, 1], [true, 4], [true, 4], [false, 1]], "the first alone, then batches of maxBatch, the last one under minBatch alone");
  assert.deepEqual(link.ids(), ids.map((id) => entryMsgId(id, "ann")));
  assert.deepEqual(results.map((r) => r.offset), ids.map((_, i) => i + 1), "entry i of a batch at ack.seq - n + 1 + i");
  assert.deepEqual([d.stats.batches, d.stats.batchedEntries, d.stats.batchFallbacks], [2, 8, 0]);
  d.close();
});

test("dispatcher - a batch refused (an entry of it already landed) or unanswered: its entries one at a time, in order, before the user's later ones", async () => {
  const { link, d } = rig({ minBatch: 3, maxBatch: 3 });
  const ann = (ids: string[]) => Promise.all(ids.map((id) => d.dispatch(req(id, ["ann"])))).then((rs) => rs.map((r) => ok(r[0])));
  // refused: f2 landed before (from a batch whose answer was lost); g0 and g1 wait behind the batch
  link.preload(entryMsgId("f2", "ann"));
  const f = await driven(ann(["f0", "f1", "f2", "f3", "g0", "g1"]));
  assert.deepEqual(f.map((r) => r.duplicate), [false, false, true, false, false, false], "f2 answers duplicate at its offset");
  assert.equal(f[2]!.offset, 1);
  assert.deepEqual(link.published.map((p) => p.msgIds.length), [1, 3, 1, 1, 1, 1, 1], "f0 alone, the batch f1-f3 refused, then each alone");
  // unanswered (it may yet land; here it does not): h4 waits behind it
  link.policy = ({ msgIds, attempt }) => (msgIds.length > 1 && attempt === 1 ? "drop" : "append");
  await driven(ann(["h0", "h1", "h2", "h3", "h4"]));
  assert.deepEqual(link.ids(), ["f2", "f0", "f1", "f3", "g0", "g1", "h0", "h1", "h2", "h3", "h4"].map((id) => entryMsgId(id, "ann")), "each once, in call order");
  assert.deepEqual([d.stats.batches, d.stats.batchFallbacks], [0, 2]);
  d.close();
});

test("dispatcher - a stream that refuses atomic publish (10174): that batch one at a time, and no more batches to its shard", async () => {
  const { link, d } = rig({ minBatch: 2 });
  link.policy = ({ msgIds }) => (msgIds.length > 1 ? json({ error: { code: 400, err_code: 10174, description: "atomic publish is disabled" } }) : "append");
  const a = ["n0", "n1", "n2", "n3"].map((id) => d.dispatch(req(id, ["ann"])));
  await driven(Promise.all(a));
  const b = await driven(Promise.all(["n4", "n5", "n6"].map((id) => d.dispatch(req(id, ["ann"])))));
  assert.ok(b.every((r) => "seq" in r[0]!));
  assert.equal(link.published.filter((p) => p.batch).length, 1, "one batch tried, then none");
  assert.deepEqual(link.ids(), ["n0", "n1", "n2", "n3", "n4", "n5", "n6"].map((id) => entryMsgId(id, "ann")));
  assert.deepEqual([d.stats.batches, d.stats.batchFallbacks], [0, 1]);
  d.close();
});

test("dispatcher - the in-flight window: at most maxInFlight entries and maxInFlightBytes awaiting an ack, every entry appended", async () => {
  const { link, d } = rig({ maxInFlight: 3 });
  const results = await driven(d.dispatch(req("w", Array.from({ length: 20 }, (_, i) => `win${i}`))));
  assert.ok(results.every((r) => "seq" in r));
  assert.equal(link.peakUnanswered, 3);
  const bytes = rig({ maxInFlightBytes: 250 });
  let peak = 0;
  const sample = setInterval(() => (peak = Math.max(peak, bytes.d.inFlightBytes)), 0);
  const r2 = await driven(bytes.d.dispatch(req("wb", Array.from({ length: 10 }, (_, i) => `wb${i}`), new Uint8Array(100))));
  clearInterval(sample);
  assert.ok(r2.every((r) => "seq" in r));
  assert.ok(bytes.link.peakUnanswered <= 2, `entries of ~120 bytes through a 250-byte window (${bytes.link.peakUnanswered} at once)`);
  assert.ok(peak <= 250, `peak ${peak}`);
  assert.equal(bytes.d.inFlightBytes, 0);
  d.close();
  bytes.d.close();
});

test("dispatcher - a large dispatch is sliced over turns; a call made after it lands after it for a shared user", async () => {
  const { link, d } = rig();
  const many = Array.from({ length: 1200 }, (_, i) => `s${i}`);
  const big = d.dispatch(req("big", many));
  const small = d.dispatch(req("small", ["s1199"]));
  const [b, s] = await driven(Promise.all([big, small]));
  assert.ok(ok(s[0]).seq > ok(b[1199]).seq);
  assert.equal(link.ids().length, 1201);
  const many2 = await driven(d.dispatchMany([req("x1", ["ann", "ben"]), req("x2", ["ann"]), req("x1", ["ann", "ben"])]));
  assert.deepEqual(many2.map((rs) => rs.map((r) => ok(r).duplicate)), [[false, false], [false], [true, true]], "the same dispatch twice is a retry");
  assert.ok(ok(many2[1]![0]).seq > ok(many2[0]![0]).seq, "array order per user");
  d.close();
});

test("dispatch pure parts - nextUnit: alone or a batch of the head of a user's queue", () => {
  const q = (shards: number[], opts: { solo?: number[]; bytes?: number } = {}) => shards.map((shard, i) => ({ shard, data: new Uint8Array(opts.bytes ?? 10), solo: opts.solo?.includes(i) ?? false }));
  const limits: BatchLimits = { minBatch: 3, maxBatch: 5, maxInFlight: 100, maxInFlightBytes: 1 << 20, maxBatchesPerShard: 2 };
  const free = { atomicOff: false, open: 0 };
  const cases: [string, ReturnType<typeof q>, Partial<BatchLimits>, typeof free, number][] = [
    ["fewer than minBatch queued", q([0, 0]), {}, free, 1],
    ["minBatch queued", q([0, 0, 0]), {}, free, 3],
    ["at most maxBatch", q([0, 0, 0, 0, 0, 0, 0]), {}, free, 5],
    ["at most maxInFlight", q([0, 0, 0, 0, 0]), { maxInFlight: 4 }, free, 4],
    ["stops at another shard (a moved user)", q([0, 0, 0, 1, 1]), {}, free, 3],
    ["another shard too soon: alone", q([0, 0, 1, 1]), {}, free, 1],
    ["the head was in a failed batch", q([0, 0, 0, 0], { solo: [0] }), {}, free, 1],
    ["stops before one that was", q([0, 0, 0, 0], { solo: [3] }), {}, free, 3],
    ["the stream refuses atomic publish", q([0, 0, 0]), {}, { atomicOff: true, open: 0 }, 1],
    ["too many batches open on the shard", q([0, 0, 0]), {}, { atomicOff: false, open: 2 }, 1],
    ["bytes: within the window", q([0, 0, 0, 0], { bytes: 100 }), { maxInFlightBytes: 350 }, free, 3],
    ["bytes: 1 MiB at most", q([0, 0, 0, 0], { bytes: 400 * 1024 }), {}, free, 1],
  ];
  for (const [name, queue, l, shard, n] of cases) assert.equal(nextUnit(queue, { ...limits, ...l }, shard).n, n, name);
  assert.deepEqual(nextUnit(q([0, 0, 0], { bytes: 7 }), limits, free), { n: 3, bytes: 21 });
});

test("dispatch pure parts - what an answer means: appended, retry, reject; a batch committed or refused", () => {
  const cases: [string, AckAnswer, ReturnType<typeof entryAck>][] = [
    ["the common ack", { data: new TextEncoder().encode('{"stream":"MBX_0","seq":42}') }, { type: "appended", offset: 42, duplicate: false }],
    ["a duplicate", { data: new TextEncoder().encode('{"stream":"MBX_0","domain":"hub","seq":7,"duplicate":true}') }, { type: "appended", offset: 7, duplicate: true }],
    ["other JSON key order", json({ seq: 9, stream: "MBX_0" }), { type: "appended", offset: 9, duplicate: false }],
    ["no responders (no stream yet)", { status: { code: 503, description: "No Responders" }, data: new Uint8Array() }, { type: "failed", message: "503 No Responders", retryable: true }],
    ["another status", { status: { code: 408, description: "Request Timeout" }, data: new Uint8Array() }, { type: "failed", message: "408 Request Timeout", retryable: false }],
    ["a server error", json({ error: { code: 500, description: "x" } }), { type: "failed", message: "500 x", retryable: true }],
    ["a refusal", json({ error: { code: 400, description: "maximum payload exceeded" } }), { type: "failed", message: "400 maximum payload exceeded", retryable: false }],
    ["not JSON", { data: new TextEncoder().encode("garbage") }, { type: "failed", message: "unreadable ack", retryable: true }],
    ["no seq", json({ stream: "MBX_0" }), { type: "failed", message: "ack without seq", retryable: true }],
  ];
  for (const [name, a, want] of cases) assert.deepEqual(entryAck(a), want, name);
  assert.deepEqual(batchAck(json({ stream: "MBX_0", seq: 10, batch: "b", count: 4 }), 4), { type: "committed", first: 7 });
  assert.deepEqual(batchAck(json({ stream: "MBX_0", seq: 10, batch: "b", count: 3 }), 4), { type: "refused", why: "batch ack without seq or with count 3 for 4 entries", atomicOff: false });
  assert.deepEqual(batchAck(json({ error: { code: 400, err_code: 10174, description: "atomic publish is disabled" } }), 4), { type: "refused", why: "400 atomic publish is disabled", atomicOff: true });
  assert.deepEqual(batchAck(json({ error: { code: 400, err_code: 10201, description: "dup" } }), 4), { type: "refused", why: "400 dup", atomicOff: false });
  assert.deepEqual(batchAck({ status: { code: 503, description: "No Responders" }, data: new Uint8Array() }, 2), { type: "refused", why: "503 No Responders", atomicOff: false });
  assert.deepEqual([1, 2, 3, 5, 9].map(retryDelayMs), [100, 200, 400, 1000, 1000]);
});

test("dispatcher - timings: each entry's queue wait once, at its first publish, and its ack wait once, at the ack that settles it", async () => {
  const queued: number[] = [];
  const acked: number[] = [];
  const { link, d } = rig({ ackTimeoutMs: 5000, timings: { queued: (s) => queued.push(s), acked: (s) => acked.push(s) } });
  link.stall();
  const calls = [d.dispatch(req("t1", ["u"])), d.dispatch(req("t2", ["u"])), d.dispatch(req("t3", ["u", "v"]))];
  await pass(60);
  // u's first entry and v's went out at once; u's second and third wait behind u's first
  assert.equal(queued.length, 2, "queue waits of the entries published so far");
  assert.ok(queued.every((s) => s < 0.03), `published at once: ${String(queued)}`);
  assert.equal(acked.length, 0, "nothing acked while nats-server reads nothing");
  link.resume();
  for (const r of (await driven(Promise.all(calls))).flat()) ok(r);
  assert.equal(queued.length, 4, "one queue wait per entry");
  assert.ok(queued.filter((s) => s >= 0.03).length === 2, `u's second and third waited behind its first: ${String(queued)}`);
  assert.equal(acked.length, 4, "one ack wait per entry");
  assert.ok(acked.filter((s) => s >= 0.03).length === 2, `the first two publishes waited for nats-server: ${String(acked)}`);
  d.close();
});

test("dispatcher - timings: an entry that ends in an error has no ack wait", async () => {
  const acked: number[] = [];
  const { link, d } = rig({ attempts: 1, timings: { queued: () => undefined, acked: (s) => acked.push(s) } });
  link.policy = () => "drop";
  const [r] = await driven(d.dispatch(req("x", ["u"])));
  assert.equal(r !== undefined && "error" in r ? r.error.code : undefined, "DISPATCH_TIMEOUT");
  assert.deepEqual(acked, []);
  d.close();
});
