import { test } from "node:test";
import assert from "node:assert/strict";
import fc from "fast-check";
import {
  EMPTY_REGISTRY, applyRecord, bumpEpoch, composeSeq, evenRange, initialShards, userHash, seqOffset,
  type RegistryState, type ShardState,
} from "../../protocol/index.js";
import { decideAuth, type AuthDecision, type AuthInput, type CursorIn, type ShardBounds } from "../../gateway/mailbox/auth-decision.js";
import { shardsInvolved } from "../../gateway/mailbox/positions.js";

const U = "alice"; // userHash("alice") = 0x2bd806c9: shard 0 of 2
const state = (...shards: ShardState[]): RegistryState => applyRecord(EMPTY_REGISTRY, 1, { v: 1, op: "init", at: 0, by: "t", shards });
const [s0, s1] = initialShards(2, ["logA", "logZ"]) as [ShardState, ShardState];
const c = (epoch: number, log: string, seq: bigint, shard = 0, sigValid = true): CursorIn => ({ shard, epoch, log, seq, sigValid });
/** Bounds of every shard: nothing trimmed, 1,000 offsets written, unless a test says otherwise. */
const allBounds = (registry: RegistryState, trims: Map<number, bigint> = new Map(), last = 1000): Map<number, ShardBounds> =>
  new Map([...registry.shards.keys()].map((s) => [s, { trim: trims.get(s) ?? 0n, lastOffset: last }]));
const input = (registry: RegistryState, cursor: CursorIn | undefined, extra: Partial<AuthInput> & { trims?: Map<number, bigint>; last?: number } = {}): AuthInput => {
  const { trims, last, ...rest } = extra;
  return { user: U, cursor, registry, userShard: 0, bounds: allBounds(registry, trims, last), head: 0n, ...rest };
};
/** A field of one case of the decision (the test fails when the case has no such field). */
function field<K extends string>(d: AuthDecision, k: K): unknown {
  assert.ok(k in d, `${d.case} has no ${k}`);
  return (d as unknown as Record<K, unknown>)[k];
}

// shard 0: epoch 0 from offset 1, takeover to epoch 1 at offset 11
const e1 = bumpEpoch(s0, { cause: "takeover", start_offset: 11 });
// then rebuilt: epoch 2 on logB from offset 1 (old log ended at 30)
const e2 = bumpEpoch(e1, { cause: "rebuild", log: "logB", start_offset: 1, prev_end_offset: 30 });

test("auth - no cursor: fresh, from 0", () => {
  const d = decideAuth(input(state(e1, s1), undefined));
  assert.deepEqual([d.case, d.from, d.epoch, d.log, d.shard], ["fresh", 0n, 1, "logA", 0]);
});

test("auth - a bad signature, an unknown shard or a seq newer than its token: invalid, fresh start", () => {
  for (const [cur, why] of [
    [c(1, "logA", composeSeq(1, 12), 0, false), /signature/],
    [c(1, "logA", composeSeq(1, 12), 9), /unknown to the registry/],
    [c(0, "logA", composeSeq(5, 12)), /never had/],
    [c(0, "logQ", composeSeq(1, 12)), /never had/],
  ] as const) {
    const d = decideAuth(input(state(e1, s1), cur));
    assert.equal(d.case, "invalid");
    assert.equal(d.from, 0n);
    assert.match(field(d, "reason") as string, why);
  }
});

test("auth - same epoch and log: normal catch-up after the cursor", () => {
  const d = decideAuth(input(state(e1, s1), c(1, "logA", composeSeq(1, 20))));
  assert.deepEqual([d.case, d.from], ["normal", composeSeq(1, 20)]);
  // a seq of a newer epoch than the token (pushed before the new token arrived) is taken as is
  const newer = decideAuth(input(state(e1, s1), c(0, "logA", composeSeq(1, 20))));
  assert.deepEqual([newer.case, newer.from], ["normal", composeSeq(1, 20)]);
});

test("auth - an older epoch of the same log (E1): the offset in today's numbering, nothing skipped or repeated", () => {
  // the device got offset 15 pushed by the old owner under epoch 0; today offset 15 is epoch 1
  let d = decideAuth(input(state(e1, s1), c(0, "logA", composeSeq(0, 15))));
  assert.deepEqual([d.case, d.from], ["rebased", composeSeq(1, 15)]);
  // a cursor before the bump point keeps its value: offsets 6..10 (epoch 0) and 11.. (epoch 1) follow
  d = decideAuth(input(state(e1, s1), c(0, "logA", composeSeq(0, 5))));
  assert.deepEqual([d.case, d.from], ["rebased", composeSeq(0, 5)]);
});

test("auth - a rebuilt log (E3): the whole new log is replayed", () => {
  const d = decideAuth(input(state(e2, s1), c(1, "logA", composeSeq(1, 25))));
  assert.deepEqual([d.case, d.from, d.epoch, d.log], ["rebased_new_log", composeSeq(2, 0), 2, "logB"]);
});

test("auth - an (epoch, log) the registry does not know (a lagged failover copy)", () => {
  // the same epoch number names another log, and the cursor's seq is below the current log: replay it all
  const e3 = bumpEpoch(e2, { cause: "failover", log: "logC", start_offset: 1 });
  let d = decideAuth(input(state(e3, s1), c(2, "logX", composeSeq(2, 40))));
  assert.deepEqual([d.case, d.from], ["rebased_new_log", composeSeq(3, 0)]);
  // the cursor's seq overlaps the current log's numbering: nothing but a rebuild is safe
  d = decideAuth(input(state(e3, s1), c(3, "logX", composeSeq(3, 40)), { head: composeSeq(3, 9) }));
  assert.equal(d.case, "expired");
  assert.match(field(d, "reason") as string, /overlaps/);
  // a cursor epoch the registry has never reached
  d = decideAuth(input(state(e1, s1), c(7, "logA", composeSeq(7, 3)), { head: composeSeq(1, 30) }));
  assert.deepEqual([d.case, d.from], ["expired", composeSeq(1, 30)]);
  assert.match(field(d, "reason") as string, /ahead/);
});

test("auth - below the trim watermark: expired, continues from the head with a new cursor", () => {
  const trims = new Map([[0, composeSeq(1, 18)]]);
  const d = decideAuth(input(state(e1, s1), c(1, "logA", composeSeq(1, 12)), { trims, head: composeSeq(1, 40) }));
  assert.deepEqual([d.case, d.from, field(d, "trim"), d.epoch], ["expired", composeSeq(1, 40), composeSeq(1, 18), 1]);
  // at the watermark exactly, nothing was lost
  const ok = decideAuth(input(state(e1, s1), c(1, "logA", composeSeq(1, 18)), { trims }));
  assert.equal(ok.case, "normal");
});

/** Parent 0 keeps the lower half of its range; child 2 takes the upper half from split_at. */
function splitState(): RegistryState {
  const r = evenRange(0, 2);
  const mid = r.lo + Math.floor((r.hi - r.lo) / 2);
  const lowHalf = userHash(U) <= mid;
  const moved = lowHalf ? { lo: r.lo, hi: mid } : { lo: mid + 1, hi: r.hi };
  const kept = lowHalf ? { lo: mid + 1, hi: r.hi } : { lo: r.lo, hi: mid };
  const split = { parent: 0, child: 2, range: moved, split_at_seq: composeSeq(1, 50), child_start_seq: composeSeq(2, 1) };
  const parent = { ...bumpEpoch(e1, { cause: "split", start_offset: 51 }), range: kept, splits: [split] };
  const child: ShardState = {
    shard: 2, range: moved, status: "active", epoch: 2, log: "logK",
    boundaries: [{ epoch: 2, cause: "split", log: "logK", start_offset: 1, start_seq: composeSeq(2, 1), prev_end_seq: composeSeq(1, 50) }],
    splits: [split],
  };
  return state(parent, s1, child);
}

test("auth - a user moved by a split: old range first, then the child from its start, then a new cursor", () => {
  const reg = splitState();
  let d = decideAuth(input(reg, c(1, "logA", composeSeq(1, 30)), { userShard: 2 }));
  assert.equal(d.case, "split");
  assert.deepEqual(field(d, "oldRanges"), [{ shard: 0, after: composeSeq(1, 30), until: composeSeq(1, 50) }]);
  assert.deepEqual([d.from, d.shard, d.epoch, d.log], [composeSeq(2, 0), 2, 2, "logK"]);
  // already at the cut: nothing of the old shard is left to send
  d = decideAuth(input(reg, c(1, "logA", composeSeq(1, 50)), { userShard: 2 }));
  assert.deepEqual(field(d, "oldRanges"), []);
  // the parent's retention passed the cursor: expired
  d = decideAuth(input(reg, c(1, "logA", composeSeq(1, 30)), { userShard: 2, trims: new Map([[0, composeSeq(1, 35)]]) }));
  assert.equal(d.case, "expired");
  // a cursor on a shard that never split toward the user's: invalid
  d = decideAuth(input(reg, c(0, "logZ", composeSeq(0, 3), 1), { userShard: 2 }));
  assert.equal(d.case, "invalid");
});

test("auth - a child's token with a seq still in the parent's numbering: read as the parent's cursor", () => {
  const reg = splitState();
  const child = reg.shards.get(2)!;
  // an SDK cut off inside the old range saved the child's token with a parent seq
  const d = decideAuth(input(reg, c(2, "logK", composeSeq(1, 30), 2), { userShard: 2 }));
  assert.equal(d.case, "split");
  assert.deepEqual(field(d, "oldRanges"), [{ shard: 0, after: composeSeq(1, 30), until: composeSeq(1, 50) }], "the rest of the old range, not a skip into the child");
  assert.equal(d.from, child.boundaries[0]!.start_seq - 1n);
  // the same after a takeover of the child (the case that skipped: the offset was translated)
  const taken = state(reg.shards.get(0)!, s1, bumpEpoch(child, { cause: "takeover", start_offset: 1 }));
  const t = decideAuth(input(taken, c(2, "logK", composeSeq(1, 30), 2), { userShard: 2 }));
  assert.deepEqual([t.case, (field(t, "oldRanges") as unknown[]).length, t.from], ["split", 1, composeSeq(2, 0)]);
  // the child's own replay point (nothing of the child yet) stays the child's
  const z = decideAuth(input(reg, c(2, "logK", composeSeq(2, 0), 2), { userShard: 2 }));
  assert.deepEqual([z.case, z.from], ["normal", composeSeq(2, 0)]);
});

test("auth - rebasing never goes below the cursor's seq (property over takeover histories)", () => {
  fc.assert(fc.property(
    fc.array(fc.integer({ min: 0, max: 40 }), { minLength: 1, maxLength: 12 }),
    fc.nat(), fc.nat(),
    (gaps, pickEpoch, pickOffset) => {
      let s = s0;
      let offset = 1;
      for (const g of gaps) {
        offset += g;
        s = bumpEpoch(s, { cause: "takeover", start_offset: offset });
      }
      const b = s.boundaries[pickEpoch % s.boundaries.length]!;
      const next = s.boundaries.find((x) => x.epoch > b.epoch);
      // a seq the device can hold: an offset processed under epoch b (possibly past the next bump: zombie pushes)
      const o = b.start_offset - 1 + (pickOffset % ((next?.start_offset ?? offset + 5) - b.start_offset + 10));
      const seq = composeSeq(b.epoch, o);
      const d = decideAuth(input(state(s, s1), c(b.epoch, "logA", seq)));
      assert.ok(d.case === "normal" || d.case === "rebased", d.case);
      assert.ok(d.from >= seq, "never below the cursor");
      // nothing skipped: the first entry after `from` is the offset right after the cursor's
      assert.equal(seqOffset(d.from), BigInt(o));
    },
  ), { numRuns: 500 });
});

test("auth - a cursor from the future (beyond the shard's head in its own epoch and log): invalid, a fresh start from 0", () => {
  const reg = state(e1, s1);
  // the stream's last offset is 40: offset 41 was never produced
  let d = decideAuth(input(reg, c(1, "logA", composeSeq(1, 41)), { last: 40, head: composeSeq(1, 40) }));
  assert.deepEqual([d.case, field(d, "check"), d.from], ["invalid", "beyond_head", 0n]);
  // the head itself is a position the server produced
  d = decideAuth(input(reg, c(1, "logA", composeSeq(1, 40)), { last: 40 }));
  assert.deepEqual([d.case, d.from], ["normal", composeSeq(1, 40)]);
  // an older epoch's seq beyond the head: the same
  d = decideAuth(input(reg, c(0, "logA", composeSeq(0, 99)), { last: 40 }));
  assert.deepEqual([d.case, field(d, "check")], ["invalid", "beyond_head"]);
  // beyond the recorded end of a rebuilt (old) log
  d = decideAuth(input(state(e2, s1), c(1, "logA", composeSeq(1, 31)), { last: 5 }));
  assert.deepEqual([d.case, field(d, "check")], ["invalid", "beyond_head"]);
  d = decideAuth(input(state(e2, s1), c(1, "logA", composeSeq(1, 30)), { last: 5 }));
  assert.deepEqual([d.case, d.from], ["rebased_new_log", composeSeq(2, 0)]);
});

test("auth - mixed coordinates: a seq whose epoch bits disagree with the cursor's (epoch, log) is invalid", () => {
  const reg = state(e1, s1); // epoch 0 numbers offsets 1..10, epoch 1 from 11
  for (const [cur, why] of [
    // epoch 0's seq at an offset epoch 1 numbers, under an epoch-1 token: the device would get 11..20 again
    [c(1, "logA", composeSeq(0, 20)), /numbers/],
    // an offset before its own epoch began
    [c(1, "logA", composeSeq(1, 4)), /before epoch 1 began/],
    // a seq of an epoch the shard never had
    [c(1, "logA", composeSeq(3, 4)), /never had/],
  ] as const) {
    const d = decideAuth(input(reg, cur, { last: 40 }));
    assert.deepEqual([d.case, field(d, "check"), d.from], ["invalid", "mixed_coordinates", 0n], `${cur.seq}`);
    assert.match(field(d, "reason") as string, why);
  }
  // what the gateway itself hands out stays valid: a rebase before the bump point keeps epoch 0's
  // numbering under an epoch-1 token, and epoch 1's replay point is its start - 1
  assert.equal(decideAuth(input(reg, c(1, "logA", composeSeq(0, 5)), { last: 40 })).case, "normal");
  assert.equal(decideAuth(input(reg, c(1, "logA", composeSeq(1, 10)), { last: 40 })).case, "normal");
  // a newer epoch's seq than the token on the same log: the device got the new epoch's pushes first
  assert.deepEqual(decideAuth(input(reg, c(0, "logA", composeSeq(1, 20)), { last: 40 })).from, composeSeq(1, 20));
});

/** Shard 0 splits into 2 (the user moves), then 2 splits into 3 (the user moves again), then 3 into 4. */
function hops(n: 1 | 2 | 3): RegistryState {
  let reg = state(e1, s1);
  let from = 0;
  for (let i = 0; i < n; i++) {
    const p = reg.shards.get(from)!;
    const mid = p.range.lo + Math.floor((p.range.hi - p.range.lo) / 2);
    const moved = userHash(U) <= mid ? { lo: p.range.lo, hi: mid } : { lo: mid + 1, hi: p.range.hi };
    const kept = moved.lo === p.range.lo ? { lo: mid + 1, hi: p.range.hi } : { lo: p.range.lo, hi: mid };
    const cut = 50 + i * 10; // the parent's last offset at the split
    const childId = 2 + i;
    const split = { parent: from, child: childId, range: moved, split_at_seq: composeSeq(p.epoch, cut), child_start_seq: composeSeq(p.epoch + 1, 1) };
    const parent = { ...bumpEpoch(p, { cause: "split", start_offset: cut + 1 }), range: kept, splits: [...p.splits, split] };
    const child: ShardState = {
      shard: childId, range: moved, status: "active", epoch: p.epoch + 1, log: `logC${i}`,
      boundaries: [{ epoch: p.epoch + 1, cause: "split", log: `logC${i}`, start_offset: 1, start_seq: composeSeq(p.epoch + 1, 1), prev_end_seq: split.split_at_seq }],
      splits: [split],
    };
    reg = applyRecord(reg, reg.seq + 1, { v: 1, op: "split", at: 0, by: "t", shards: [parent, child] });
    from = childId;
  }
  return reg;
}

test("auth - moved by two and three splits: one old range per hop, in order, then the last child", () => {
  // P (epoch 1) -> C1 = shard 2 (epoch 2) -> C2 = shard 3 (epoch 3) -> C3 = shard 4 (epoch 4)
  let d = decideAuth(input(hops(2), c(1, "logA", composeSeq(1, 30)), { userShard: 3 }));
  assert.equal(d.case, "split");
  assert.deepEqual(field(d, "oldRanges"), [
    { shard: 0, after: composeSeq(1, 30), until: composeSeq(1, 50) },
    { shard: 2, after: composeSeq(2, 0), until: composeSeq(2, 60) },
  ]);
  assert.deepEqual([d.shard, d.from], [3, composeSeq(3, 0)]);
  d = decideAuth(input(hops(3), c(1, "logA", composeSeq(1, 30)), { userShard: 4 }));
  assert.deepEqual((field(d, "oldRanges") as { shard: number }[]).map((r) => r.shard), [0, 2, 3]);
  assert.deepEqual([d.shard, d.from], [4, composeSeq(4, 0)]);
  // a cursor inside the middle hop (the device was cut off there, holding C1's token)
  const c1 = hops(2).shards.get(2)!;
  d = decideAuth(input(hops(2), c(c1.epoch, c1.log, composeSeq(2, 7), 2), { userShard: 3 }));
  assert.deepEqual(field(d, "oldRanges"), [{ shard: 2, after: composeSeq(2, 7), until: composeSeq(2, 60) }]);
});

test("auth - retention of a parent (and of every hop) counts: expired, never a silent skip", () => {
  const reg = hops(2);
  // the parent's retention passed the cursor
  let d = decideAuth(input(reg, c(1, "logA", composeSeq(1, 30)), { userShard: 3, trims: new Map([[0, composeSeq(1, 35)]]) }));
  assert.equal(d.case, "expired");
  assert.match(field(d, "reason") as string, /shard 0/);
  // the middle hop's retention removed some of its range
  d = decideAuth(input(reg, c(1, "logA", composeSeq(1, 30)), { userShard: 3, trims: new Map([[2, composeSeq(2, 3)]]) }));
  assert.match(field(d, "reason") as string, /shard 2/);
  // a child's token with a parent seq walks to the parent: the parent's trim is read
  const c2 = reg.shards.get(3)!;
  d = decideAuth(input(reg, c(c2.epoch, c2.log, composeSeq(1, 30), 3), { userShard: 3, trims: new Map([[0, composeSeq(1, 35)]]) }));
  assert.equal(d.case, "expired");
  // bounds of a shard the decision needs but nobody read: a programming error, never a default of 0
  assert.throws(() => decideAuth({ ...input(reg, c(1, "logA", composeSeq(1, 30)), { userShard: 3 }), bounds: new Map([[3, { trim: 0n, lastOffset: 9 }]]) }), /no bounds for shard 0/);
});

test("auth - shardsInvolved names the cursor's shard, its ancestors, every hop and the user's shard", () => {
  const reg = hops(3);
  assert.deepEqual(shardsInvolved(reg, U, 0, 4).sort(), [0, 2, 3, 4]);
  assert.deepEqual(shardsInvolved(reg, U, 4, 4).sort(), [0, 2, 3, 4], "a child's token may carry an ancestor's seq");
  assert.deepEqual(shardsInvolved(reg, U, undefined, 4), [4]);
  // every shard the decision reads is among them (no default trims anywhere)
  fc.assert(fc.property(fc.constantFrom(0, 2, 3, 4), fc.integer({ min: 0, max: 60 }), fc.constantFrom(1, 2, 3, 4), (from, off, ep) => {
    const s = reg.shards.get(from)!;
    const only = new Map([...allBounds(reg)].filter(([k]) => shardsInvolved(reg, U, from, 4).includes(k)));
    const d = decideAuth({ user: U, cursor: c(s.epoch, s.log, composeSeq(ep, off), from), registry: reg, userShard: 4, bounds: only, head: 0n });
    assert.ok(d.case !== undefined);
  }), { numRuns: 300 });
});

test("auth - a head beyond the stream's last offset (a Redis older than the log) is never where an expired session continues", () => {
  // a new log at offset 1; Redis still says the user's head is 0:5 from the log it described before
  const fresh = initialShards(2, ["logNew", "logZ"]) as [ShardState, ShardState];
  const registry = state(...fresh);
  const d = decideAuth(input(registry, c(0, "logOld", composeSeq(0, 5)), { head: composeSeq(0, 5), last: 1 }));
  assert.equal(d.case, "expired");
  assert.equal(d.from, composeSeq(0, 1), "at most the stream's newest seq");
  // the session's position is then one a later rebase accepts: same epoch and log, within the stream
  const after = decideAuth(input(registry, c(0, "logNew", d.from), { head: composeSeq(0, 5), last: 1 }));
  assert.deepEqual([after.case, after.from], ["normal", composeSeq(0, 1)]);
  // a head the bounds have not seen yet (read a moment earlier) costs a replay, never a skip
  const behind = decideAuth(input(registry, c(0, "logOld", composeSeq(0, 5)), { head: composeSeq(0, 3), last: 2 }));
  assert.equal(behind.from, composeSeq(0, 2));
});
