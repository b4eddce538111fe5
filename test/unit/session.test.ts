/**
 * Session in memory: every cursor case answered through the ports, with a recording transport.
 * What needs real servers (uWS, NATS reads, Redis caches) is in test/integration/.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { CloseCode, Disconnect, ErrorCode, bumpEpoch, composeSeq, encodeFrame, halfRange, initialShards, splitShard, userHash, type ClientFrame, type DeviceCursor, type ErrorFrame, type MailboxSeq, type Push, type ShardState } from "../../protocol/index.js";
import { cursorSigner } from "../../protocol/io/index.js";
import { RequestError, TimeoutError } from "@nats-io/transport-node";
import { JetStreamApiError, JetStreamError } from "@nats-io/jetstream";
// the pull status error is exported on the package's internal path only
import { JetStreamStatusError } from "@nats-io/jetstream/internal";
import { UnavailableError } from "../../gateway/mailbox/gather.js";
import { streamCallError } from "../../gateway/mailbox/reader.js";
import type { Session } from "../../gateway/session/session.js";
import { CURSOR_KEY, ManualTimers, nextTurn, sessionRig, type RecordingTransport, type SessionRig } from "../harness/session-fakes.js";

const U = "alice"; // userHash("alice") = 0x2bd806c9: shard 0 of 2
const signer = cursorSigner([CURSOR_KEY]);

/** Turns of the event loop (never the wall clock) until `done`, at most `max`: the session's chain runs on promises. */
async function turnsUntil(done: () => boolean, max = 500): Promise<void> {
  for (let i = 0; i < max && !done(); i++) await nextTurn();
}

/** Steps the rig's manual clock `ms` at a time, letting the session work between steps, until `done` (at most `max` steps). */
async function stepUntil(r: SessionRig, done: () => boolean, ms = 100, max = 300): Promise<void> {
  const clock = r.ports.timers;
  if (!(clock instanceof ManualTimers)) throw new Error("stepUntil needs the rig's manual clock");
  for (let i = 0; i < max && !done(); i++) {
    clock.advance(ms);
    await turns(5);
  }
}

/** `n` turns of the event loop: what a step the session queued needs to run, when nothing shows that it did. */
async function turns(n = 50): Promise<void> {
  for (let i = 0; i < n; i++) await nextTurn();
}

function rig(env: Record<string, string> = {}, timers?: ManualTimers): SessionRig {
  return sessionRig(initialShards(2, ["logA", "logZ"]), env, timers);
}

function frame(s: Session, f: ClientFrame): void {
  s.onFrame(encodeFrame(f), true);
}

/** A cursor the gateway would have signed for shard `shard` at (epoch, log), holding `seq`. */
function cursor(shard: number, epoch: number, log: string, seq: MailboxSeq): DeviceCursor {
  return { ...signer.sign(U, shard, epoch, log), seq };
}

async function auth(r: SessionRig, c?: DeviceCursor, extra: Partial<Extract<ClientFrame, { t: "AUTH" }>> = {}): Promise<{ s: Session; t: RecordingTransport }> {
  const { session, t } = r.connect();
  frame(session, { t: "AUTH", v: 1, token: U, device: "d1", ...(c ? { cursor: c } : {}), ...extra });
  await t.until((f) => f.some((x) => x.t === "SYNCED") || t.closed !== undefined, "SYNCED");
  return { s: session, t };
}

function outcomes(m: { values: { labels: Record<string, unknown>; value: number }[] }, c: string): number {
  return m.values.find((v) => v.labels.case === c)?.value ?? 0;
}

async function regressions(r: SessionRig): Promise<number> {
  return (await r.ports.metrics.regressions.get()).values.find((v) => v.labels.component === "gateway")?.value ?? 0;
}

function errorOf(t: RecordingTransport, code: string): ErrorFrame | undefined {
  return t.of("ERROR").find((e) => e.code === code);
}

function shard(r: SessionRig, id: number): ShardState {
  return r.registry.state.shards.get(id)!;
}

/** Splits `parent` so that alice moves to `child` (a new log), cut at the parent's last offset. */
function splitForAlice(r: SessionRig, parent: number, child: number): void {
  const p = shard(r, parent);
  const mid = p.range.lo + Math.floor((p.range.hi - p.range.lo) / 2);
  const moved = halfRange(p.range, userHash(U) > mid);
  r.registry.apply(splitShard(p, { child, childLog: `log${child}`, moved, cutOffset: r.mailbox.lastOffset(parent) }), "split");
}

test("session - fresh device: AUTH_OK from 0, every entry, SYNCED, then live pushes", async () => {
  const r = rig();
  for (let i = 0; i < 5; i++) r.mailbox.append(0, U);
  r.mailbox.append(0, "bob"); // another user's entry in the same shard is never sent
  const { t } = await auth(r);
  const ok = t.of("AUTH_OK")[0]!;
  assert.deepEqual([ok.from, ok.shard, ok.epoch, ok.cursor.log], [0n, 0, 0, "logA"]);
  assert.deepEqual(t.liveSeqs(), [1n, 2n, 3n, 4n, 5n].map((o) => composeSeq(0, o)));
  assert.equal(t.of("SYNCED")[0]!.seq, composeSeq(0, 5));
  const p = r.mailbox.appendPush(0, U);
  r.push(p);
  await t.until(() => t.liveSeqs().length === 6, "the live push");
  assert.equal(t.liveSeqs()[5], p.entry.seq);
  assert.equal(t.of("ERROR").length, 0);
});

test("session - normal cursor: catch-up strictly after it, no ERROR frame", async () => {
  const r = rig();
  for (let i = 0; i < 6; i++) r.mailbox.append(0, U);
  const { t } = await auth(r, cursor(0, 0, "logA", composeSeq(0, 4)));
  assert.equal(t.of("ERROR").length, 0);
  assert.equal(t.of("AUTH_OK")[0]!.from, composeSeq(0, 4));
  assert.deepEqual(t.liveSeqs(), [composeSeq(0, 5), composeSeq(0, 6)]);
});

test("session - rebased on the same log (E1): the cursor's offset in today's numbering, nothing repeated", async () => {
  const r = rig();
  for (let i = 0; i < 6; i++) r.mailbox.append(0, U);
  r.registry.apply([bumpEpoch(shard(r, 0), { cause: "takeover", start_offset: 4 })]);
  const { t } = await auth(r, cursor(0, 0, "logA", composeSeq(0, 5)));
  const e = errorOf(t, ErrorCode.CURSOR_REBASED)!;
  assert.equal(e.fatal, false);
  assert.equal(e.replay_from_seq, composeSeq(1, 5));
  assert.deepEqual([e.new_cursor!.epoch, e.new_cursor!.log], [1, "logA"]);
  assert.deepEqual(t.liveSeqs(), [composeSeq(1, 6)], "offset 6 only: 4 and 5 were the device's already");
  assert.equal(t.frames.findIndex((f) => f.t === "ERROR") < t.frames.findIndex((f) => f.t === "AUTH_OK"), true, "the ERROR comes before AUTH_OK");
});

test("session - rebased onto a new log (E3): the whole new log is replayed, never below the cursor", async () => {
  const r = rig();
  for (let i = 0; i < 3; i++) r.mailbox.append(0, U);
  r.registry.apply([bumpEpoch(shard(r, 0), { cause: "rebuild", log: "logB", start_offset: 4, prev_end_offset: 3 })], "rebuild");
  r.mailbox.append(0, U); // offset 4, the new log's first
  const { t } = await auth(r, cursor(0, 0, "logA", composeSeq(0, 3)));
  const e = errorOf(t, ErrorCode.CURSOR_REBASED)!;
  assert.equal(e.replay_from_seq, composeSeq(1, 3));
  assert.equal(e.new_cursor!.log, "logB");
  assert.deepEqual(t.liveSeqs(), [composeSeq(1, 4)]);
});

test("session - split with one, two and three hops: each old range in order, then the new shard", async () => {
  for (const n of [1, 2, 3]) {
    const r = rig();
    const sent: MailboxSeq[] = [];
    r.mailbox.append(0, U);
    const dev = cursor(0, 0, "logA", composeSeq(0, 1));
    let from = 0;
    for (let i = 0; i < n; i++) {
      for (let k = 0; k < 2; k++) sent.push(r.mailbox.append(from, U).seq);
      splitForAlice(r, from, 2 + i);
      from = 2 + i;
    }
    for (let k = 0; k < 2; k++) sent.push(r.mailbox.append(from, U).seq);
    const { t } = await auth(r, dev);
    const e = errorOf(t, ErrorCode.CURSOR_REBASED)!;
    assert.equal(e.old_ranges!.length, n, `${n} hops`);
    assert.deepEqual(e.old_ranges!.map((x) => x.shard), [0, 2, 3].slice(0, n));
    assert.deepEqual(e.old_range, e.old_ranges![0], "old SDKs still get the first hop");
    for (const x of e.old_ranges!) assert.equal(signer.verify(U, x.cursor!), true, "each hop carries its shard's token");
    assert.equal(e.new_cursor!.shard, from);
    assert.deepEqual(t.liveSeqs(), sent, `every entry once, rising, over ${n} hops`);
    assert.deepEqual(t.of("MSGS").filter((f) => f.e.length > 0).map((f) => f.shard), [...new Set(t.of("MSGS").filter((f) => f.e.length > 0).map((f) => f.shard))], "one shard after the other");
    assert.equal(await regressions(r), 0);
  }
});

test("session - expired in the shard and in a split's parent: CURSOR_EXPIRED, then from the head", async () => {
  const r = rig();
  for (let i = 0; i < 6; i++) r.mailbox.append(0, U);
  r.mailbox.trimmed.set(0, 4);
  let { t } = await auth(r, cursor(0, 0, "logA", composeSeq(0, 2)));
  let e = errorOf(t, ErrorCode.CURSOR_EXPIRED)!;
  assert.deepEqual([e.trim_watermark, e.rebuild_required], [composeSeq(0, 4), true]);
  assert.equal(t.of("AUTH_OK")[0]!.from, composeSeq(0, 6));
  assert.deepEqual(t.liveSeqs(), []);
  // the parent's retention after a split: the parent's trim is read, not taken as 0
  splitForAlice(r, 0, 2);
  r.mailbox.append(2, U);
  ({ t } = await auth(r, cursor(0, 0, "logA", composeSeq(0, 2))));
  e = errorOf(t, ErrorCode.CURSOR_EXPIRED)!;
  assert.match(e.msg, /shard 0/);
  assert.equal(errorOf(t, ErrorCode.CURSOR_REBASED), undefined);
});

test("session - invalid cursors: a bad signature, mixed coordinates, a cursor from the future; each a fresh start from 0", async () => {
  const r = rig();
  for (let i = 0; i < 4; i++) r.mailbox.append(0, U);
  r.registry.apply([bumpEpoch(shard(r, 0), { cause: "takeover", start_offset: 3 })]);
  const cases: [DeviceCursor, RegExp][] = [
    [{ ...cursor(0, 1, "logA", composeSeq(1, 3)), sig: new Uint8Array(16) }, /signature/],
    [cursor(0, 1, "logA", composeSeq(0, 4)), /numbers/], // epoch 0's seq at an offset epoch 1 numbers
    [cursor(0, 1, "logA", composeSeq(1, 9)), /never produced/], // offset 9 was never written
  ];
  for (const [c, why] of cases) {
    const { t } = await auth(r, c);
    const e = errorOf(t, ErrorCode.CURSOR_INVALID)!;
    assert.match(e.msg, why);
    assert.equal(t.of("AUTH_OK")[0]!.from, 0n);
    assert.equal(t.liveSeqs().length, 4, "everything retained, so the device loses nothing");
  }
});

test("session - a cursor from the future: entries appended next are delivered, not dropped as duplicates", async () => {
  const r = rig();
  r.mailbox.append(0, U);
  const { s, t } = await auth(r, cursor(0, 0, "logA", composeSeq(0, 50)));
  assert.ok(errorOf(t, ErrorCode.CURSOR_INVALID));
  const p = r.mailbox.appendPush(0, U);
  r.push(p);
  await t.until(() => t.liveSeqs().includes(p.entry.seq), "the next entry");
  assert.equal(s.state.type, "live");
});

test("session - catch-up merged with live pushes: held while syncing, sent once after, in order", async () => {
  const r = rig();
  for (let i = 0; i < 9; i++) r.mailbox.append(0, U);
  const { session, t } = r.connect();
  frame(session, { t: "AUTH", v: 1, token: U, device: "d1" });
  // pushes land while the catch-up runs: one already in the catch-up's range, two after it
  await t.until((f) => f.some((x) => x.t === "AUTH_OK"), "AUTH_OK");
  const p1 = r.mailbox.appendPush(0, U);
  const p2 = r.mailbox.appendPush(0, U);
  r.push(p1);
  r.push(p2);
  r.push(p1); // a repeat
  await t.until(() => t.liveSeqs().includes(p2.entry.seq), "both pushes");
  const seqs = t.liveSeqs();
  assert.deepEqual(seqs, [...seqs].sort((a, b) => (a < b ? -1 : 1)));
  assert.equal(new Set(seqs).size, seqs.length, "no entry twice");
  assert.equal(seqs.length, 11);
});

test("session - a push of a newer epoch during catch-up waits behind the rebase: never sent under the older epoch's token", async () => {
  const r = rig();
  for (let i = 0; i < 9; i++) r.mailbox.append(0, U);
  const { session, t } = r.connect();
  frame(session, { t: "AUTH", v: 1, token: U, device: "d1" });
  await t.until((f) => f.some((x) => x.t === "AUTH_OK"), "AUTH_OK");
  assert.equal(t.frames.some((f) => f.t === "SYNCED"), false, "still catching up");
  // a rebuild lands, and the new log's first push with it, while the session catches up
  r.registry.apply([bumpEpoch(shard(r, 0), { cause: "rebuild", log: "logB", start_offset: 10, prev_end_offset: 9 })], "rebuild");
  const p = r.mailbox.appendPush(0, U);
  assert.equal(p.epoch, 1);
  r.push(p);
  await t.until(() => t.liveSeqs().includes(p.entry.seq), "the new epoch's push");
  const rebase = t.frames.findIndex((f) => f.t === "ERROR" && f.code === ErrorCode.CURSOR_REBASED);
  const pushed = t.frames.findIndex((f) => f.t === "MSGS" && f.e.some((e) => e.seq === p.entry.seq));
  assert.ok(rebase >= 0 && rebase < pushed, `CURSOR_REBASED (frame ${rebase}) before the epoch-1 entry (frame ${pushed})`);
  assert.equal(errorOf(t, ErrorCode.CURSOR_REBASED)!.new_cursor!.log, "logB");
});

test("session - a fenced worker's push (an epoch below the registry's) is dropped by the hub's rule, never sent; the owner's next push is", async () => {
  const r = rig();
  r.mailbox.append(0, U);
  const { s, t } = await auth(r);
  r.registry.apply([bumpEpoch(shard(r, 0), { cause: "takeover", start_offset: 2 })]);
  await turnsUntil(() => s.where?.epoch === 1 && s.tailPosition() !== undefined);
  assert.equal(s.where?.epoch, 1, "rebased onto epoch 1");
  const known = s.tailPosition()!;
  const zombie: Push = {
    user: U, shard: 0, epoch: 0, prevAll: known,
    entry: { seq: known + 1n, id: "zombie", lane: "default", prev: known, ts: Date.now(), b: new Uint8Array([1]) },
  };
  r.push(zombie);
  const next = r.mailbox.appendPush(0, U);
  r.push(next);
  await t.until(() => t.liveSeqs().includes(next.entry.seq), "the owner's push");
  assert.equal(t.liveSeqs().includes(zombie.entry.seq), false, "the fenced worker's entry never went out");
  assert.equal(await r.ports.metrics.stalePushes.get().then((m) => m.values[0]!.value), 1);
});

test("session - a push after a lost one: the gap is filled from the mailbox first", async () => {
  const r = rig();
  r.mailbox.append(0, U);
  const { t } = await auth(r);
  const lost = r.mailbox.appendPush(0, U);
  const next = r.mailbox.appendPush(0, U);
  r.push(next);
  await t.until(() => t.liveSeqs().includes(next.entry.seq), "the push after the gap");
  assert.deepEqual(t.liveSeqs().slice(-2), [lost.entry.seq, next.entry.seq]);
  assert.equal(await r.ports.metrics.gapFills.get().then((m) => m.values[0]!.value), 1);
});

test("session - a lost last push (no later entry): the tail check's fill sends it; nothing when the session is up to date", async () => {
  const r = rig();
  r.mailbox.append(0, U);
  const { s, t } = await auth(r);
  const settled = async () => {
    await turnsUntil(() => s.tailPosition() !== undefined); // its chain's step ends
    return s.tailPosition();
  };
  const known = await settled();
  assert.ok(known !== undefined && known > 0n, "a live, idle session has a tail position");
  const before = t.liveSeqs();
  s.fillTail(known + 1n); // a head read a moment ago; the mailbox says the session is up to date: nothing sent
  await turns();
  assert.deepEqual(t.liveSeqs(), before);
  const lost = r.mailbox.appendPush(0, U); // stored, its push never arrives
  assert.equal(s.tailPosition(), known, "the session does not know of it");
  s.fillTail(lost.entry.seq);
  await t.until(() => t.liveSeqs().includes(lost.entry.seq), "the lost entry");
  assert.deepEqual(t.liveSeqs(), [...before, lost.entry.seq]);
  assert.equal(await settled(), lost.entry.seq);
  assert.equal(await r.ports.metrics.tailFills.get().then((m) => m.values[0]!.value), 1);
});

test("session - a tail check with no head in Redis (the user's hash vanished) asks the mailbox once per position, and sends what it lacks", async () => {
  const r = rig();
  r.mailbox.append(0, U);
  const { s, t } = await auth(r);
  const settled = async () => {
    await turnsUntil(() => s.tailPosition() !== undefined);
    return s.tailPosition();
  };
  await settled();
  const lost = r.mailbox.appendPush(0, U); // its push is lost, and Redis lost the head with it
  const asked = r.mailbox.watermarkCalls;
  s.fillTail(undefined);
  await t.until(() => t.liveSeqs().includes(lost.entry.seq), "the lost entry, found by asking the mailbox");
  assert.equal(r.mailbox.watermarkCalls, asked + 1);
  await settled();
  s.fillTail(undefined);
  s.fillTail(undefined);
  await turns();
  assert.equal(r.mailbox.watermarkCalls, asked + 2, "asked once more at the new position, then not again");
  assert.equal(t.liveSeqs().filter((x) => x === lost.entry.seq).length, 1);
});

test("session - a gap fill whose stream does not answer (the port's UnavailableError): UNAVAILABLE and 4503, never 4500; what was queued behind it reads nothing", async () => {
  const r = rig();
  r.mailbox.append(0, U);
  const { t } = await auth(r);
  r.mailbox.appendPush(0, U); // lost
  const next = r.mailbox.appendPush(0, U);
  r.mailbox.fillErrors.push(new UnavailableError("shard 0's stream did not answer (timeout); reconnect", 2000));
  r.push(next);
  // queued behind the failing fill: each would be a gap of its own
  const behind = [r.mailbox.appendPush(0, U), r.mailbox.appendPush(0, U)];
  r.mailbox.appendPush(0, U); // lost too
  behind.push(r.mailbox.appendPush(0, U));
  for (const p of behind) r.push(p);
  await t.until(() => t.closed !== undefined, "the close");
  await turns();
  assert.equal(r.mailbox.fills, 1, "the steps queued behind the close read nothing");
  assert.equal(t.closed!.code, CloseCode.UNAVAILABLE);
  const err = t.of("ERROR").at(-1)!;
  assert.equal(err.code, ErrorCode.UNAVAILABLE);
  assert.equal(err.retry_ms, 2000);
  assert.ok(!t.liveSeqs().includes(next.entry.seq), "nothing sent over the gap");
});

test("session - more pushes than it holds while syncing: the mailbox is read again, nothing lost", async () => {
  const r = rig();
  const { session, t } = r.connect();
  frame(session, { t: "AUTH", v: 1, token: U, device: "d1" });
  const pushes = Array.from({ length: 10_050 }, () => r.mailbox.appendPush(0, U));
  for (const p of pushes) r.push(p);
  await t.until((f) => f.some((x) => x.t === "SYNCED"), "SYNCED", 10_000);
  assert.equal(t.liveSeqs().length, 10_050);
  assert.equal(new Set(t.liveSeqs()).size, 10_050);
});

test("session - PULL: pages by lane; an unknown lane is an error, not an empty page; after a parent seq reads the parent's rest", async () => {
  const r = rig({ JETGATE_LANES: "default,chat" });
  r.mailbox.append(0, U, "chat");
  r.mailbox.append(0, U, "default");
  r.mailbox.append(0, U, "chat");
  const { s, t } = await auth(r);
  frame(s, { t: "PULL", id: 7, after: 0n, limit: 1, lane: "chat" });
  await t.until(() => t.of("MSGS").some((f) => f.id === 7), "PULL 7");
  const page = t.of("MSGS").find((f) => f.id === 7)!;
  assert.deepEqual([page.e.map((e) => e.lane), page.more], [["chat"], true]);
  frame(s, { t: "PULL", id: 8, after: 0n, limit: 5, lane: "nope" });
  await t.until(() => t.of("ERROR").some((e) => e.id === 8), "PULL 8 refused");
  assert.equal(t.of("ERROR").find((e) => e.id === 8)!.code, ErrorCode.BAD_REQUEST);
  assert.equal(t.closed, undefined, "not fatal");
  // moved by a split: PULL after the last parent seq it had reads the parent's rest, then the child
  splitForAlice(r, 0, 2);
  const childEntry = r.mailbox.append(2, U, "chat");
  await t.until(() => t.of("ERROR").some((e) => e.code === ErrorCode.CURSOR_REBASED), "mid-session rebase");
  frame(s, { t: "PULL", id: 9, after: composeSeq(0, 1), limit: 10 });
  await t.until(() => t.of("MSGS").some((f) => f.id === 9), "PULL 9");
  assert.deepEqual(t.of("MSGS").find((f) => f.id === 9)!.e.map((e) => e.seq), [composeSeq(0, 2), composeSeq(0, 3), childEntry.seq]);
});

test("session - ACK: stored up to what was sent; beyond it refused with BAD_REQUEST and not stored", async () => {
  const r = rig();
  r.mailbox.append(0, U);
  r.mailbox.append(0, U);
  const { s, t } = await auth(r);
  frame(s, { t: "ACK", seq: composeSeq(0, 9) });
  await t.until(() => t.of("ERROR").some((e) => e.code === ErrorCode.BAD_REQUEST), "ACK refused");
  frame(s, { t: "ACK", seq: composeSeq(0, 2) });
  s.close(Disconnect.GOING_AWAY);
  assert.deepEqual(r.acks, [{ user: U, device: "d1", seq: composeSeq(0, 2) }]);
});

test("session - a slow consumer is closed with 4408", async () => {
  const r = rig({ JETGATE_MAX_BACKPRESSURE: "65536" });
  r.mailbox.append(0, U);
  const { session, t } = r.connect();
  t.bufferedBytes = 100_000;
  frame(session, { t: "AUTH", v: 1, token: U, device: "d1" });
  await t.until(() => t.closed !== undefined, "the close");
  assert.equal(t.closed!.code, CloseCode.SLOW_CONSUMER);
});

/**
 * 40 entries of 8 KiB (MSGS frames of 64 KiB and more) for a device under a 64 KiB slow-consumer
 * limit whose socket takes half of each frame at once, the rest buffered until the device reads; AUTH sent.
 */
function slowReaderCatchUp(timers?: ManualTimers): { session: Session; t: RecordingTransport; r: SessionRig } {
  const r = rig({ JETGATE_MAX_BACKPRESSURE: "65536" }, timers);
  r.mailbox.bodyBytes = 8 * 1024;
  for (let i = 0; i < 40; i++) r.mailbox.append(0, U);
  const { session, t } = r.connect();
  const send = t.send.bind(t);
  t.send = (bytes) => {
    t.bufferedBytes += Math.ceil(bytes.byteLength / 2);
    return send(bytes);
  };
  frame(session, { t: "AUTH", v: 1, token: U, device: "d1" });
  return { session, t, r };
}

test("session - a catch-up is paced under a low slow-consumer limit: a device that reads slowly gets it all, never 4408", async () => {
  const { session, t } = slowReaderCatchUp();
  let drains = 0;
  for (let turn = 0; turn < 200 && !t.frames.some((f) => f.t === "SYNCED") && t.closed === undefined; turn++) {
    await nextTurn();
    if (t.bufferedBytes > 0) {
      // the device reads what was buffered
      t.bufferedBytes = 0;
      drains++;
      session.onDrain();
    }
  }
  assert.equal(t.closed, undefined, "not closed by its own catch-up");
  assert.equal(t.of("MSGS").flatMap((m) => m.e).length, 40, "every entry");
  assert.equal(t.of("SYNCED").length, 1);
  assert.ok(drains >= 4, `the catch-up waited for the socket (${drains} drains)`);
});

test("session - a paced catch-up does not wait on a drain event alone: bytes that leave without one, it sees on its next look", async () => {
  const { t, r } = slowReaderCatchUp(new ManualTimers());
  // the buffer empties with no drain event (as bytes a send had not yet written out do)
  await stepUntil(r, () => {
    t.bufferedBytes = 0;
    return t.frames.some((f) => f.t === "SYNCED") || t.closed !== undefined;
  }, 10);
  assert.equal(t.closed, undefined);
  assert.equal(t.of("MSGS").flatMap((m) => m.e).length, 40, "every entry");
  assert.equal(t.of("SYNCED").length, 1);
});

test("session - a registry ahead of the streams (a split's child not answering yet): retried, then CURSOR_REBASED, never 4500", async () => {
  const r = rig();
  r.mailbox.append(0, U);
  const { s, t } = await auth(r);
  r.mailbox.notReady.set(2, 3);
  splitForAlice(r, 0, 2);
  // the child's stream answers after three not-ready reads, each after a backoff on the session's clock
  await stepUntil(r, () => t.of("ERROR").some((e) => e.code === ErrorCode.CURSOR_REBASED));
  assert.ok(t.of("ERROR").some((e) => e.code === ErrorCode.CURSOR_REBASED), "CURSOR_REBASED");
  assert.equal(t.closed, undefined);
  assert.equal(s.shard, 2);
  // never ready: the device is told to come back (UNAVAILABLE, 4503), not an internal error
  const r2 = rig();
  r2.mailbox.notReady.set(0, 1_000);
  const { session, t: t2 } = r2.connect();
  frame(session, { t: "AUTH", v: 1, token: U, device: "d1" });
  await stepUntil(r2, () => t2.closed !== undefined);
  assert.notEqual(t2.closed, undefined, "closed");
  assert.deepEqual([t2.closed!.code, t2.of("ERROR")[0]!.code, typeof t2.of("ERROR")[0]!.retry_ms], [CloseCode.UNAVAILABLE, ErrorCode.UNAVAILABLE, "number"]);
});

test("session - mid-session rebases across two splits: each hop in order, no entry lost or repeated", async () => {
  const r = rig();
  const want: MailboxSeq[] = [r.mailbox.append(0, U).seq];
  const { t } = await auth(r);
  splitForAlice(r, 0, 2);
  await t.until(() => t.of("ERROR").filter((e) => e.code === ErrorCode.CURSOR_REBASED).length === 1, "first rebase");
  for (let i = 0; i < 2; i++) {
    const p = r.mailbox.appendPush(2, U);
    want.push(p.entry.seq);
    r.push(p);
  }
  await t.until(() => t.liveSeqs().length === 3, "child entries");
  splitForAlice(r, 2, 3);
  await t.until(() => t.of("ERROR").filter((e) => e.code === ErrorCode.CURSOR_REBASED).length === 2, "second rebase");
  const p = r.mailbox.appendPush(3, U);
  want.push(p.entry.seq);
  r.push(p);
  await t.until(() => t.liveSeqs().length === 4, "grandchild entry");
  assert.deepEqual(t.liveSeqs(), want);
  const rebases = t.of("ERROR").filter((e) => e.code === ErrorCode.CURSOR_REBASED);
  assert.deepEqual(rebases.map((e) => e.new_cursor!.shard), [2, 3]);
});

test("session - the stream reader's errors: not there is not ready, not answered is unavailable, the rest unchanged", () => {
  const timeout = streamCallError(new TimeoutError(), 3, true);
  assert.ok(timeout instanceof UnavailableError);
  assert.equal(timeout.retryMs, 2000);
  assert.match(timeout.message, /^shard 3's stream did not answer \(timeout\); reconnect$/);
  assert.ok(streamCallError(new RequestError("request failed"), 3, true) instanceof UnavailableError);
  // a read's consumer that went quiet (this process too busy to see its heartbeats): 4503, not 4500
  assert.ok(streamCallError(new JetStreamError("heartbeats missed"), 3, true) instanceof UnavailableError);
  assert.equal(streamCallError(new JetStreamError("something else"), 3, true) instanceof UnavailableError, false);
  // a clustered JetStream that cannot serve now (a busy or moving leader, a stream offline, the
  // consumer limit, a pull's leadership change): 4503, not 4500
  const api = (code: number, err_code: number, description: string) => new JetStreamApiError({ code, err_code, description });
  for (const busy of [api(503, 10008, "JetStream system temporarily unavailable"), api(500, 10118, "stream is offline"), api(503, 10023, "insufficient resources"), api(400, 10026, "maximum consumers limit reached"), new JetStreamStatusError("leadership change", 409), new JetStreamStatusError("no responders", 503), new JetStreamStatusError("request timeout", 408)]) {
    const e = streamCallError(busy, 3, true);
    assert.ok(e instanceof UnavailableError, `${busy.message}: ${String(e)}`);
    assert.match(e.message, new RegExp(`^shard 3's stream did not answer \\(${busy.message}\\); reconnect$`));
  }
  // a request JetStream refused as wrong stays what it is: a bug to see, not a retry
  const wrong = api(400, 10025, "bad request");
  assert.equal(streamCallError(wrong, 3, true), wrong);
  const bug = new TypeError("a bug");
  assert.equal(streamCallError(bug, 3, true), bug);
});

test("session - a batch of pushes that follow each other goes out as one MSGS frame; a gap in it is filled first, in order", async () => {
  const r = rig();
  r.mailbox.append(0, U);
  const { s, t } = await auth(r);
  await turnsUntil(() => s.tailPosition() !== undefined);
  const msgsBefore = t.of("MSGS").length;
  const batch = [r.mailbox.appendPush(0, U), r.mailbox.appendPush(0, U), r.mailbox.appendPush(0, U)];
  s.onPushes(batch);
  assert.equal(t.of("MSGS").length, msgsBefore + 1, "one frame, sent at once (no await on the live path)");
  assert.deepEqual(t.of("MSGS").at(-1)!.e.map((e) => e.seq), batch.map((p) => p.entry.seq));
  // the second push of the next batch was lost: the first goes out, the gap is filled, then the rest
  const [a, lost, c, d] = [r.mailbox.appendPush(0, U), r.mailbox.appendPush(0, U), r.mailbox.appendPush(0, U), r.mailbox.appendPush(0, U)];
  s.onPushes([a!, c!, d!]);
  await t.until(() => t.liveSeqs().includes(d!.entry.seq), "the batch after the gap");
  assert.deepEqual(t.liveSeqs().slice(-4), [a!, lost!, c!, d!].map((p) => p.entry.seq));
  assert.equal(await regressions(r), 0);
});

test("session - a live batch sent in part (the device's lanes): one frame of the rest, the others accounted for", async () => {
  const r = rig();
  r.mailbox.append(0, U);
  const { s, t } = await auth(r, undefined, { lanes: ["default"] });
  await turnsUntil(() => s.tailPosition() !== undefined);
  const msgsBefore = t.of("MSGS").length;
  const batch = [r.mailbox.appendPush(0, U), r.mailbox.appendPush(0, U, "other"), r.mailbox.appendPush(0, U)];
  s.onPushes(batch);
  assert.equal(t.of("MSGS").length, msgsBefore + 1, "one frame");
  assert.deepEqual(t.of("MSGS").at(-1)!.e.map((e) => e.seq), [batch[0]!.entry.seq, batch[2]!.entry.seq]);
  assert.equal(s.tailPosition(), batch[2]!.entry.seq, "the other lane's entry is accounted for");
});

test("session - sessions of one user that send a whole batch send the same bytes (encoded once)", async () => {
  const r = rig();
  r.mailbox.append(0, U);
  const one = await auth(r);
  const two = r.connect();
  frame(two.session, { t: "AUTH", v: 1, token: U, device: "d2" });
  await two.t.until((f) => f.some((x) => x.t === "SYNCED"), "SYNCED");
  for (const s of [one.s, two.session]) await turnsUntil(() => s.tailPosition() !== undefined);
  const sent: Uint8Array[][] = [[], []];
  const orig = [one.t, two.t].map((t) => t.send.bind(t));
  one.t.send = (b) => (sent[0]!.push(b), orig[0]!(b));
  two.t.send = (b) => (sent[1]!.push(b), orig[1]!(b));
  const batch = [r.mailbox.appendPush(0, U), r.mailbox.appendPush(0, U)];
  one.s.onPushes(batch, true);
  two.session.onPushes(batch, true);
  assert.equal(sent[0]!.length, 1);
  assert.equal(sent[0]![0], sent[1]![0], "the very same bytes");
});

test("session - its user's route is acquired before the mailbox is read and released when it closes", async () => {
  const r = rig();
  r.mailbox.append(0, U);
  const { s } = await auth(r);
  assert.equal(r.routes.held.get(U), 1);
  s.close(Disconnect.GOING_AWAY);
  assert.equal(r.routes.held.has(U), false);
  // a session refused before AUTH completes holds no route
  const bad = r.connect();
  frame(bad.session, { t: "AUTH", v: 1, token: "not a token", device: "d1" });
  await bad.t.until(() => bad.t.closed !== undefined, "closed");
  assert.equal(r.routes.held.size, 0);
});

test("session - a route registered again (Redis had lost it): what the session missed below the head is read and sent, even while busy", async () => {
  const r = rig();
  r.mailbox.append(0, U);
  const { s, t } = await auth(r);
  await turnsUntil(() => s.tailPosition() !== undefined);
  const missed = [r.mailbox.appendPush(0, U), r.mailbox.appendPush(0, U)]; // routed nowhere: Redis had lost the route
  s.catchUpTo(missed[1]!.entry.seq);
  await t.until(() => t.liveSeqs().includes(missed[1]!.entry.seq), "the missed entries");
  assert.deepEqual(t.liveSeqs().slice(-2), missed.map((p) => p.entry.seq));
  const before = t.liveSeqs().length;
  s.catchUpTo(missed[1]!.entry.seq); // nothing below that head is missing any more: nothing read
  await turns();
  assert.equal(t.liveSeqs().length, before);
});

test("session - token expiry: open until its token's time, then closed 4401 by its clock; a REFRESH moves it", async () => {
  const timers = new ManualTimers();
  const r = rig({}, timers);
  // the fake verifier's tokens expire an hour from AUTH, on the sessions' clock
  const expiry = timers.now() + 3_600_000;
  const { s, t } = await auth(r);
  timers.advance(1);
  assert.equal(t.closed, undefined);
  frame(s, { t: "REFRESH", id: 1, token: U });
  await t.until((f) => f.some((x) => x.t === "REFRESH_OK"), "REFRESH_OK");
  const moved = t.of("REFRESH_OK")[0]!.exp;
  assert.ok(moved >= expiry);
  timers.advanceTo(moved - 1);
  assert.equal(t.closed, undefined, "not before the refreshed expiry");
  timers.advance(1);
  assert.deepEqual(t.closed, { code: 4401, reason: "token expired" });
  assert.equal(timers.armed, 0, "no timer left once closed");
});

test("session - AUTH timeout: no AUTH within JETGATE_AUTH_TIMEOUT_MS closes 4401 \"auth timeout\"; an AUTH in time is not closed by it", async () => {
  const timers = new ManualTimers();
  const r = rig({ JETGATE_AUTH_TIMEOUT_MS: "2000" }, timers);
  const silent = r.connect();
  timers.advance(1999);
  assert.equal(silent.t.closed, undefined);
  timers.advance(1);
  assert.deepEqual(silent.t.closed, { code: 4401, reason: "auth timeout" });
  assert.equal(outcomes(await r.ports.metrics.authOutcomes.get(), "timeout"), 1);
  // still authenticating at the deadline (a slow token check): closed as well
  r.tokenPlan.set("slow.token", { user: U, until: new Promise<void>(() => undefined), expiresAt: Date.now() + 3_600_000 });
  const slow = r.connect();
  frame(slow.session, { t: "AUTH", v: 1, token: "slow.token", device: "d1" });
  timers.advance(2000);
  assert.deepEqual(slow.t.closed, { code: 4401, reason: "auth timeout" });
  // in time: the deadline is gone with the AUTH
  const { t } = await auth(r);
  timers.advance(5000);
  assert.equal(t.closed, undefined);
});

test("session - ACKs are written once a flush period after the first of them, the highest only, and on close", async () => {
  const timers = new ManualTimers();
  const r = rig({}, timers);
  for (let i = 0; i < 3; i++) r.mailbox.append(0, U);
  const { s, t } = await auth(r);
  frame(s, { t: "ACK", seq: composeSeq(0, 1) });
  timers.advance(500);
  frame(s, { t: "ACK", seq: composeSeq(0, 2) });
  timers.advance(499);
  assert.deepEqual(r.acks, [], "not before a second after the first ACK");
  timers.advance(1);
  assert.deepEqual(r.acks, [{ user: U, device: "d1", seq: composeSeq(0, 2) }]);
  timers.advance(5000);
  assert.equal(r.acks.length, 1, "nothing new: nothing written");
  frame(s, { t: "ACK", seq: composeSeq(0, 3) });
  s.close(Disconnect.GOING_AWAY);
  assert.deepEqual(r.acks.at(-1), { user: U, device: "d1", seq: composeSeq(0, 3) }, "written on close");
  assert.equal(t.of("ERROR").length, 0);
});

test("session - revoked tokens: refused at AUTH (4401), at REFRESH, and any AUTH while the revocations were never loaded (4503)", async () => {
  const r = rig();
  const now = Math.floor(Date.now() / 1000);
  r.issued.at = now - 100;
  r.revocations.add({ user: U, before: now - 10, expires: Date.now() + 60_000 });
  const refused = r.connect();
  frame(refused.session, { t: "AUTH", v: 1, token: U, device: "d1" });
  await refused.t.until(() => refused.t.closed !== undefined, "close");
  assert.equal(errorOf(refused.t, ErrorCode.UNAUTHORIZED)!.msg, "token revoked");
  assert.equal(refused.t.closed!.code, CloseCode.UNAUTHENTICATED);

  // a newer token gets in; a REFRESH with an older one is refused
  r.issued.at = now;
  const { s, t } = await auth(r);
  r.issued.at = now - 100;
  frame(s, { t: "REFRESH", id: 1, token: U });
  await t.until(() => t.closed !== undefined, "close");
  assert.equal(errorOf(t, ErrorCode.UNAUTHORIZED)!.msg, "refresh refused: token revoked");

  // a gateway that could not read the revocations yet lets nobody in
  const blind = rig();
  (blind.revocations as { loaded: boolean }).loaded = false;
  const b = blind.connect();
  frame(b.session, { t: "AUTH", v: 1, token: U, device: "d1" });
  await b.t.until(() => b.t.closed !== undefined, "close");
  assert.equal(errorOf(b.t, ErrorCode.UNAVAILABLE)!.msg, "token revocations not loaded yet: reconnect");
  assert.equal(b.t.closed!.code, CloseCode.UNAVAILABLE);
});

test("session - two REFRESH frames take effect in the order they were sent, however long each verification takes", async () => {
  const timers = new ManualTimers();
  const r = rig({}, timers);
  const { s, t } = await auth(r);
  const now = Date.now();
  // the first takes longer to verify than the second
  let releaseFirst = () => undefined as void;
  r.tokenPlan.set("first.token", { user: U, until: new Promise<void>((res) => (releaseFirst = res)), expiresAt: now + 2 * 3_600_000 });
  r.tokenPlan.set("second.token", { user: U, expiresAt: now + 3 * 3_600_000 });
  frame(s, { t: "REFRESH", id: 1, token: "first.token" });
  frame(s, { t: "REFRESH", id: 2, token: "second.token" });
  await turns(); // the second token is checked by now; the first is not
  assert.equal(t.of("REFRESH_OK").length, 0, "the second waits for the first");
  releaseFirst();
  await t.until((f) => f.filter((x) => x.t === "REFRESH_OK").length === 2, "both REFRESH_OK");
  assert.deepEqual(t.of("REFRESH_OK").map((x) => x.id), [1, 2], "answered in order");
  timers.advanceTo(now + 2 * 3_600_000 + 1);
  assert.equal(t.closed, undefined, "the expiry is the second token's, sent last");
  timers.advanceTo(now + 3 * 3_600_000);
  assert.deepEqual(t.closed, { code: 4401, reason: "token expired" });
});

test("session - SEND: each publish starts at once, and the answers go out in the order the frames came, however the acks return", async () => {
  const r = rig();
  const started: string[] = [];
  const acks = new Map<string, (dup: boolean) => void>();
  r.ports.ingress = {
    publish: (_user, _device, cmid) => {
      started.push(cmid);
      return new Promise((resolve) => acks.set(cmid, (duplicate) => resolve({ duplicate })));
    },
  };
  const { s, t } = await auth(r);
  const body = new Uint8Array([1]);
  frame(s, { t: "SEND", id: 1, cmid: "c1", b: body });
  frame(s, { t: "SEND", id: 2, cmid: "c2", b: body });
  frame(s, { t: "SEND", id: 3, cmid: "c3", b: new Uint8Array(r.ports.config.JETGATE_MAX_BODY_BYTES + 1) });
  assert.deepEqual(started, ["c1", "c2"], "both published at once (the third is refused: too large)");
  acks.get("c2")!(true);
  await turns();
  assert.deepEqual(t.frames.filter((f) => f.t === "SEND_OK" || f.t === "ERROR").length, 0, "the second's answer waits for the first's");
  acks.get("c1")!(false);
  await t.until((f) => f.filter((x) => x.t === "SEND_OK" || x.t === "ERROR").length === 3, "three answers");
  const answers = t.frames.flatMap((f) => (f.t === "SEND_OK" ? [`ok ${f.id} ${f.dup}`] : f.t === "ERROR" ? [`${f.code} ${f.id}`] : []));
  assert.deepEqual(answers, ["ok 1 false", "ok 2 true", "TOO_LARGE 3"]);
});

test("session - a read queued before a rebuild's rebase, done on the new view: its entries wait for the rebase, never go out under the old log's token", async () => {
  const r = rig();
  r.mailbox.append(0, U);
  const { s, t } = await auth(r);
  r.mailbox.append(0, U); // its push was lost: the tail check finds it
  await turnsUntil(() => s.tailPosition() !== undefined); // the AUTH step has left the chain
  assert.notEqual(s.tailPosition(), undefined, "live and idle");
  s.fillTail(undefined);
  // the rebuild lands before the queued read runs; the rebase is queued behind the read
  r.registry.apply([bumpEpoch(shard(r, 0), { cause: "rebuild", log: "logB", start_offset: 1, prev_end_offset: 2 })], "rebuild");
  await t.until(() => errorOf(t, ErrorCode.CURSOR_REBASED) !== undefined && t.liveSeqs().some((q) => q >> 48n === 1n), "the rebase and the new log's entries");
  const rebase = t.frames.findIndex((f) => f.t === "ERROR" && f.code === ErrorCode.CURSOR_REBASED);
  const early = t.frames.slice(0, rebase).flatMap((f) => (f.t === "MSGS" ? f.e.map((e) => e.seq) : []));
  assert.ok(early.every((q) => q >> 48n === 0n), `before the rebase only epoch 0 went out: ${early.map(String).join(",")}`);
  assert.equal(errorOf(t, ErrorCode.CURSOR_REBASED)!.new_cursor!.log, "logB");
});
