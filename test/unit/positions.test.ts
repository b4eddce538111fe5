import { test } from "node:test";
import assert from "node:assert/strict";
import fc from "fast-check";
import { bumpEpoch, composeSeq, deriveSeq, initialShards, applyRecord, EMPTY_REGISTRY, userHash, type ShardState } from "../../protocol/index.js";
import { checkPosition, firstOffsetAbove, pullRanges } from "../../gateway/mailbox/positions.js";

const [s0, s1] = initialShards(2, ["logA", "logZ"]) as [ShardState, ShardState];
// epoch 0: offsets 1..10; epoch 1: 11..24; epoch 2: 25.. (same log); then a rebuild onto logB
const e2 = bumpEpoch(bumpEpoch(s0, { cause: "takeover", start_offset: 11 }), { cause: "takeover", start_offset: 25 });
const rebuilt = bumpEpoch(e2, { cause: "rebuild", log: "logB", start_offset: 1, prev_end_offset: 40 });

test("positions - firstOffsetAbove compares whole seqs, never offset bits alone", () => {
  const table: [bigint, number, string][] = [
    [0n, 1, "nothing yet: from the first offset"],
    [composeSeq(0, 5), 6, "inside epoch 0"],
    [composeSeq(0, 15), 11, "epoch 0's seq past its end (a zombie's): epoch 1's offsets are all above it"],
    [composeSeq(1, 11), 12, "inside epoch 1"],
    [composeSeq(1, 30), 25, "past epoch 1's end: epoch 2 starts at 25"],
    [composeSeq(2, 40), 41, "inside the current epoch"],
  ];
  for (const [after, want, why] of table) assert.equal(firstOffsetAbove(e2, after), want, why);
  // a seq of the log before a rebuild: the whole new log is above it
  assert.equal(firstOffsetAbove(rebuilt, composeSeq(2, 39)), 1);
  assert.equal(firstOffsetAbove(rebuilt, composeSeq(3, 7)), 8);
});

test("positions - firstOffsetAbove is the first offset whose derived seq is above (property)", () => {
  fc.assert(fc.property(fc.integer({ min: 0, max: 2 }), fc.integer({ min: 0, max: 60 }), (ep, off) => {
    const after = composeSeq(ep, off);
    const first = firstOffsetAbove(e2, after);
    for (let o = 1; o < first; o++) assert.ok(deriveSeq(e2, "logA", o)! <= after, `offset ${o} is above ${after} but skipped`);
    assert.ok(deriveSeq(e2, "logA", first)! > after);
  }), { numRuns: 500 });
});

test("positions - checkPosition: zombie seqs of the token's epoch are fine up to the log's end", () => {
  assert.deepEqual(checkPosition(e2, 0, "logA", composeSeq(0, 20), 40), { epoch: 0 });
  assert.deepEqual(checkPosition(e2, 1, "logA", composeSeq(2, 30), 40), { epoch: 2 });
  assert.equal((checkPosition(e2, 0, "logA", composeSeq(0, 41), 40) as { problem: string }).problem, "beyond_head");
});

test("positions - pullRanges: a PULL after a parent's seq on a moved user's session reads the parent's rest first", () => {
  const U = "alice";
  const p = bumpEpoch(s0, { cause: "takeover", start_offset: 11 });
  const r = p.range;
  const mid = r.lo + Math.floor((r.hi - r.lo) / 2);
  const moved = userHash(U) <= mid ? { lo: r.lo, hi: mid } : { lo: mid + 1, hi: r.hi };
  const split = { parent: 0, child: 2, range: moved, split_at_seq: composeSeq(1, 50), child_start_seq: composeSeq(2, 1) };
  const parent = { ...bumpEpoch(p, { cause: "split", start_offset: 51 }), splits: [split] };
  const child: ShardState = {
    shard: 2, range: moved, status: "active", epoch: 2, log: "logK", splits: [split],
    boundaries: [{ epoch: 2, cause: "split", log: "logK", start_offset: 1, start_seq: composeSeq(2, 1), prev_end_seq: composeSeq(1, 50) }],
  };
  const reg = applyRecord(EMPTY_REGISTRY, 1, { v: 1, op: "init", at: 0, by: "t", shards: [parent, s1, child] });
  assert.deepEqual(pullRanges(reg, U, 2, composeSeq(1, 40)), [
    { shard: 0, after: composeSeq(1, 40), until: composeSeq(1, 50) },
    { shard: 2, after: composeSeq(2, 0) },
  ]);
  assert.deepEqual(pullRanges(reg, U, 2, composeSeq(2, 5)), [{ shard: 2, after: composeSeq(2, 5) }]);
  assert.deepEqual(pullRanges(reg, U, 2, composeSeq(1, 50)), [{ shard: 2, after: composeSeq(2, 0) }], "at the cut: nothing of the parent left");
});
