// The handover between the push source and the sessions (gateway/hub/push-handover.ts): batches of one
// event-loop turn go over together, in order, once per turn; routed and broadcast ones apart.
import { test } from "node:test";
import assert from "node:assert/strict";
import { composeSeq, type Push } from "../../protocol/index.js";
import { MAX_HANDOVER_BYTES, MAX_HANDOVER_PUSHES, PushHandover } from "../../gateway/hub/push-handover.js";

const push = (user: string, offset: number, bodyBytes = 0): Push => ({
  user,
  shard: 0,
  epoch: 0,
  prevAll: offset > 1 ? composeSeq(0, offset - 1) : null,
  entry: { seq: composeSeq(0, offset), id: `m${offset}`, lane: "default", prev: null, ts: 0, b: new Uint8Array(bodyBytes) },
});

/** A handover whose turns the test runs by hand. */
function rig() {
  const turns: (() => void)[] = [];
  const got: { offsets: number[]; broadcast: boolean }[] = [];
  const h = new PushHandover((pushes, broadcast) => got.push({ offsets: pushes.map((p) => Number(p.entry.seq)), broadcast }), (fn) => turns.push(fn));
  const turn = () => turns.shift()?.();
  return { h, got, turns, turn };
}

test("push handover - the batches of one turn go over as one, in arrival order, at the next turn", () => {
  const r = rig();
  r.h.take([push("ann", 1), push("bob", 2)], false);
  r.h.take([push("ann", 3)], false);
  assert.deepEqual(r.got, [], "nothing handed over within the turn");
  assert.equal(r.turns.length, 1, "one turn asked for, however many batches");
  r.turn();
  assert.deepEqual(r.got, [{ offsets: [1, 2, 3], broadcast: false }]);
  assert.equal(r.turns.length, 0, "nothing left: no further turn");
});

test("push handover - routed and broadcast batches are not merged, and keep their order, one per turn", () => {
  const r = rig();
  r.h.take([push("ann", 1)], false);
  r.h.take([push("bob", 2)], true);
  r.h.take([push("ann", 3)], false);
  r.turn();
  r.turn();
  r.turn();
  assert.deepEqual(r.got, [
    { offsets: [1], broadcast: false },
    { offsets: [2], broadcast: true },
    { offsets: [3], broadcast: false },
  ]);
  assert.equal(r.turns.length, 0);
});

test("push handover - a backlog goes over in handovers of at most MAX_HANDOVER_PUSHES, a turn each", () => {
  const r = rig();
  const n = MAX_HANDOVER_PUSHES * 2 + 10;
  for (let i = 1; i <= n; i += 10) r.h.take(Array.from({ length: Math.min(10, n - i + 1) }, (_, k) => push(`u${(i + k) % 20}`, i + k)), false);
  let turns = 0;
  while (r.turns.length > 0) {
    r.turn();
    turns++;
  }
  assert.equal(turns, 3);
  assert.ok(r.got.every((g) => g.offsets.length <= MAX_HANDOVER_PUSHES));
  assert.deepEqual(r.got.flatMap((g) => g.offsets), Array.from({ length: n }, (_, i) => i + 1), "every push once, in order");
});

test("push handover - merged handovers stay under MAX_HANDOVER_BYTES of entries; a larger batch goes alone", () => {
  const r = rig();
  const quarter = MAX_HANDOVER_BYTES / 4;
  for (let i = 1; i <= 6; i++) r.h.take([push("ann", i, quarter)], false);
  r.h.take([push("ann", 7, MAX_HANDOVER_BYTES * 2)], false);
  r.h.take([push("ann", 8, 1)], false);
  while (r.turns.length > 0) r.turn();
  assert.deepEqual(r.got.map((g) => g.offsets), [[1, 2, 3, 4], [5, 6], [7], [8]]);
});

test("push handover - an empty batch asks for no turn; clear drops what waits", () => {
  const r = rig();
  r.h.take([], false);
  assert.equal(r.turns.length, 0);
  r.h.take([push("ann", 1)], false);
  r.h.clear();
  r.turn();
  assert.deepEqual(r.got, []);
});
