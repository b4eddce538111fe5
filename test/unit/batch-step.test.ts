import { test } from "node:test";
import assert from "node:assert/strict";
import fc from "fast-check";
import { composeSeq } from "../../protocol/index.js";
import { planBatch, pushesOf, type BatchItem } from "../../worker/batch-step.js";

test("batch step - in order: every message taken, the last acknowledged", () => {
  assert.deepEqual(planBatch([5, 6, 7], 4), { take: [0, 1, 2], holes: new Map(), ack: 2, maxOffset: 7 });
});

test("batch step - redeliveries of what is done are skipped, and the ack goes to the highest offset, not the last message", () => {
  // a Redis stall outlasted the ack wait: 3 and 4 come again after 6
  const plan = planBatch([5, 6, 3, 4], 4);
  assert.deepEqual(plan.take, [0, 1]);
  assert.equal(plan.ack, 1, "offset 6, not the redelivered 4");
  assert.equal(plan.maxOffset, 6);
});

test("batch step - a batch of redeliveries only: nothing taken, the last acknowledged again, the offset unchanged", () => {
  assert.deepEqual(planBatch([2, 3], 4), { take: [], holes: new Map(), ack: 1, maxOffset: 4 });
});

test("batch step - a hole in the offsets is fetched before the message after it", () => {
  const plan = planBatch([5, 9, 10], 4);
  assert.deepEqual([...plan.holes], [[1, [6, 8]]]);
  assert.deepEqual(plan.take, [0, 1, 2]);
  assert.deepEqual(planBatch([8], 4).holes.get(0), [5, 7], "the hole can come first");
});

test("batch step - property: taken offsets and holes cover lastOffset+1..maxOffset exactly once, increasing; the ack is at maxOffset", () => {
  fc.assert(
    fc.property(fc.array(fc.integer({ min: 1, max: 40 }), { minLength: 1, maxLength: 30 }), fc.integer({ min: 0, max: 20 }), (offsets, last) => {
      const plan = planBatch(offsets, last);
      const covered: number[] = [];
      for (const i of plan.take) {
        const h = plan.holes.get(i);
        if (h) for (let o = h[0]; o <= h[1]; o++) covered.push(o);
        covered.push(offsets[i]!);
      }
      const want = Array.from({ length: plan.maxOffset - last }, (_, k) => last + 1 + k);
      assert.deepEqual(covered, want);
      assert.equal(plan.maxOffset, Math.max(last, ...offsets));
      if (plan.take.length > 0) assert.equal(offsets[plan.ack], plan.maxOffset);
    }),
  );
});

test("batch step - pushes of first copies with their prevs as seqs and their routes; duplicates counted, not pushed", () => {
  const item = (o: number, user = "ann"): BatchItem => ({ user, lane: "default", seq: composeSeq(3, o), id: `m${o}`, ts: 1, b: new Uint8Array() });
  const { pushes, duplicates } = pushesOf(
    [item(1), item(2), item(3, "bob")],
    [
      { first: true, prev: null, prevAll: null, routes: ["g1"] },
      { first: false, prev: "1", prevAll: "1", routes: ["g1"] },
      { first: true, prev: String(composeSeq(3, 1)), prevAll: String(composeSeq(3, 2)), routes: undefined },
    ],
    7,
    3,
  );
  assert.equal(duplicates, 1);
  assert.deepEqual(pushes.map((p) => [p.push.user, p.push.entry.id, p.push.entry.prev, p.push.prevAll, p.routes]), [
    ["ann", "m1", null, null, ["g1"]],
    ["bob", "m3", composeSeq(3, 1), composeSeq(3, 2), undefined],
  ]);
  assert.ok(pushes.every((p) => p.push.shard === 7 && p.push.epoch === 3));
  assert.throws(() => pushesOf([item(1)], [], 7, 3), /0 Redis results for 1 entries/);
});
