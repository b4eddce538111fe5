/**
 * The Dispatcher while NATS reads nothing, and what `duplicate` means (issue 39, items 5 and 6),
 * over the in-memory link (test/harness/dispatch-fakes.ts): no publish goes again while
 * nats-server has not read the last one, so the client holds no more than the window; a late
 * answer settles the entry it was for; a duplicate answer that the Dispatcher's own earlier attempt
 * caused is not reported as one; and a call the queue has no room for is refused whole.
 * test/faults/dispatch-stall.test.ts runs the same against a stopped nats-server.
 */
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { composeSeq, entryMsgId } from "../../protocol/index.js";
import { afterDeadline, appendedByAnother } from "../../protocol/dispatch-ack.js";
import { DispatchUnavailableError, QUEUED_ENTRY_COST, queueRefusal, queuedCost, type DispatchRequest, type DispatchResult } from "../../protocol/dispatch-request.js";
import { LinkDispatcher, type DispatcherOptions } from "../../protocol/io/dispatch.js";
import { ManualClock, driven as drivenBy, pass as passBy, passUntil as passUntilBy } from "../harness/manual-clock.js";
import { FakeLink } from "../harness/dispatch-fakes.js";

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
const passUntil = (done: () => boolean) => passUntilBy(clock, done);
const driven = <T>(p: Promise<T>) => drivenBy(clock, p);

const view = { shardOf: () => 0, seqOf: (_s: number, offset: number) => composeSeq(0, offset) };
const ACK_MS = 40;

function rig(opts: Partial<DispatcherOptions> = {}) {
  const link = new FakeLink();
  const d = new LinkDispatcher(link, () => view, { lanes: ["default"], ackTimeoutMs: ACK_MS, clock, ...opts });
  return { link, d };
}

const req = (id: string, recipients: string[], body = new Uint8Array([1])): DispatchRequest => ({ dispatch_id: id, message_id: id, lane: "default", recipients, body });
const users = (n: number, prefix: string) => Array.from({ length: n }, (_, i) => `${prefix}${i}`);
const ok = (r: DispatchResult | undefined) => {
  assert.ok(r !== undefined && "seq" in r, JSON.stringify(r, (_, v: unknown) => (typeof v === "bigint" ? String(v) : v)));
  return r;
};

test("dispatcher stall - nothing is published again while nats-server reads nothing; entries that give up keep their places until read, so the client holds at most the window", async () => {
  const { link, d } = rig({ attempts: 3, maxInFlight: 4 });
  link.stall();
  const ids = users(10, "st");
  const pending = d.dispatch(req("st", ids, new Uint8Array(100)));
  // 3 deadlines and the give-up pass by 120 ms; the places stay taken after
  await pass(ACK_MS * 8);
  assert.equal(link.published.length, 4, "the window's four, once each");
  assert.equal(d.stats.retries, 0);
  assert.equal(d.stats.held, 4 * 2, "each held at its first two deadlines, given up at its third");
  assert.equal(link.peakHeldBytes, d.inFlightBytes, "the client holds what the window counts: the places stay taken");
  link.resume();
  const results = await driven(pending);
  const codes = results.map((r) => ("error" in r ? r.error.code : "ok"));
  assert.deepEqual(codes, [...Array<string>(4).fill("DISPATCH_TIMEOUT"), ...Array<string>(6).fill("ok")], "the first four gave up (they may or may not have landed); the rest went once the client's were read");
  assert.deepEqual(link.ids(), ids.map((u) => entryMsgId("st", u)), "each once, in order");
  for (const u of ids) assert.equal(link.sent(entryMsgId("st", u)), 1, `${u} published once`);
  assert.equal(d.inFlightBytes, 0);
  assert.equal(d.queuedBytes, 0);
  d.close();
});

test("dispatcher stall - a publish held through the stall is settled by its own late answer (an entry, and an atomic batch): appended once, not a duplicate", async () => {
  const { link, d } = rig({ attempts: 50, minBatch: 3 });
  // ann: h0 alone, then h1-h4 as one batch, which meets the stall
  let stalled = false;
  link.policy = ({ msgIds }) => (msgIds.length > 1 && !stalled ? ((stalled = true), "stall") : "append");
  const ann = ["h0", "h1", "h2", "h3", "h4"].map((id) => d.dispatch(req(id, ["ann"])));
  await passUntil(() => stalled);
  // bob's single entry meets the stall too
  const bob = d.dispatch(req("b0", ["bob"]));
  await pass(ACK_MS * 6);
  assert.deepEqual(link.published.map((p) => p.msgIds.length), [1, 4, 1], "nothing again: the batch is not broken up, bob's entry not sent twice");
  link.resume();
  const results = [...(await driven(Promise.all(ann))), await driven(bob)].map((r) => ok(r[0]));
  assert.deepEqual(results.map((r) => r.duplicate), [false, false, false, false, false, false]);
  assert.deepEqual(results.map((r) => r.offset), [1, 2, 3, 4, 5, 6]);
  assert.deepEqual([d.stats.retries, d.stats.batches, d.stats.batchFallbacks], [0, 1, 0]);
  d.close();
});

test("dispatcher stall - duplicate after an unanswered attempt of its own (an entry, a batch) is not a duplicate; after a caller's earlier append it is", async () => {
  const { link, d } = rig({ minBatch: 3 });
  // u1: its first publish lands and the answer is lost; the retry answers duplicate
  // ann: a0 alone, then the batch a1-a3 lands with its answer lost; each alone answers duplicate
  // c1: a caller's earlier request appended it; c2 too, and this call's first publish is dropped
  link.preload(entryMsgId("c1", "cat"));
  link.preload(entryMsgId("c2", "cat"));
  link.policy = ({ msgIds, attempt }) => {
    if (attempt > 1) return "append";
    if (msgIds[0] === entryMsgId("u1", "uma") || msgIds.length > 1) return "lost";
    return msgIds[0] === entryMsgId("c2", "cat") ? "drop" : "append";
  };
  const [u1, a, c1, c2] = await driven(Promise.all([
    d.dispatch(req("u1", ["uma"])),
    Promise.all(["a0", "a1", "a2", "a3"].map((id) => d.dispatch(req(id, ["ann"])))),
    d.dispatch(req("c1", ["cat"])),
    d.dispatch(req("c2", ["cat"])),
  ]));
  assert.equal(ok(u1[0]).duplicate, false, "its own lost answer");
  assert.deepEqual(a.map((r) => ok(r[0]).duplicate), [false, false, false, false], "its own batch, landed with its answer lost");
  assert.equal(d.stats.batchFallbacks, 1);
  assert.equal(ok(c1[0]).duplicate, true, "a caller's earlier request");
  assert.equal(ok(c2[0]).duplicate, true, "a caller's earlier request, though this call's first publish went unanswered");
  assert.deepEqual(link.ids().filter((id) => id.endsWith(":ann")), ["a0", "a1", "a2", "a3"].map((id) => entryMsgId(id, "ann")));
  d.close();
});

test("dispatcher stall - a call the queue has no room for is refused whole (DispatchUnavailableError), nothing of it published; an empty queue takes any call", async () => {
  const body = new Uint8Array(100);
  const { link, d } = rig({ maxQueuedBytes: 500 });
  link.stall();
  // over the limit alone, but the queue is empty: taken
  const first = d.dispatch(req("q1", ["qa", "qb"], body));
  assert.ok(d.queuedBytes > 500, `${d.queuedBytes} bytes queued`);
  const full = (e: unknown) => e instanceof DispatchUnavailableError && e.retryAfterMs === 2000 && /^the dispatch queue is full \(\d+ bytes queued or in flight, this request \d+, limit 500\): nothing was published$/.test(e.message);
  await assert.rejects(d.dispatch(req("q2", ["qc"], body)), full);
  await assert.rejects(d.dispatch(req("q3", users(600, "big"), body)), full, "the sliced path too");
  await assert.rejects(d.dispatchMany([req("q4", ["qd"]), req("q5", ["qe"])]), full, "a batch: all or nothing");
  await pass(ACK_MS);
  assert.deepEqual(link.published.map((p) => p.msgIds[0]!.split(":")[0]), ["q1", "q1"], "only the first call's");
  link.resume();
  assert.ok((await driven(first)).every((r) => "seq" in r));
  assert.equal(d.queuedBytes, 0);
  assert.ok((await driven(d.dispatch(req("q2", ["qc"], body)))).every((r) => "seq" in r), "room again");
  d.close();
});

test("dispatch pure parts - after a deadline: retry what was read a deadline ago, hold what was not (or only since), give up at the last", () => {
  const cases: [boolean, boolean, number, number, ReturnType<typeof afterDeadline>][] = [
    [true, false, 1, 5, "retry"],
    [false, false, 1, 5, "hold"],
    [false, true, 4, 5, "hold"],
    // read only since its last deadline (a stall ended): a whole deadline for its answer
    [true, true, 2, 5, "hold"],
    [false, true, 5, 5, "give up"],
    [true, true, 5, 5, "give up"],
    [true, false, 1, 1, "give up"],
  ];
  for (const [read, heldLast, attempt, attempts, want] of cases) {
    assert.equal(afterDeadline(read, heldLast, attempt, attempts), want, `read ${read}, held at the last deadline ${heldLast}, attempt ${attempt} of ${attempts}`);
  }
});

test("dispatch pure parts - a duplicate is another's when the stored bytes differ from the entry's; unknown is not a duplicate", () => {
  const sent = new Uint8Array([1, 2, 3]);
  assert.equal(appendedByAnother(new Uint8Array([1, 2, 3]), sent), false);
  assert.equal(appendedByAnother(new Uint8Array([1, 2, 4]), sent), true);
  assert.equal(appendedByAnother(new Uint8Array([1, 2]), sent), true);
  assert.equal(appendedByAnother(undefined, sent), false);
});

test("dispatch pure parts - the queue: what an entry counts, and the refusal of what does not fit", () => {
  assert.equal(queuedCost(10, 100), 10 * (100 + QUEUED_ENTRY_COST));
  assert.equal(queueRefusal(0, 10_000, 100), undefined, "an empty queue takes any call");
  assert.equal(queueRefusal(50, 50, 100), undefined, "at the limit");
  const e = queueRefusal(50, 51, 100);
  assert.ok(e instanceof DispatchUnavailableError);
  assert.equal(e.code, "DISPATCH_UNAVAILABLE");
  assert.equal(e.message, "the dispatch queue is full (50 bytes queued or in flight, this request 51, limit 100): nothing was published");
});
