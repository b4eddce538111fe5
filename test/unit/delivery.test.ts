import { test } from "node:test";
import assert from "node:assert/strict";
import { composeSeq, type Entry, type Push } from "../../protocol/index.js";
import { Delivery } from "../../gateway/session/delivery.js";
import { TokenBucket } from "../../gateway/rate-limit.js";

const S = (o: number) => composeSeq(1, o);
const entry = (o: number, lane = "a"): Entry => ({ seq: S(o), id: `m${o}`, lane, prev: null, ts: 1, b: new Uint8Array() });
const push = (o: number, prevAll: number | null): Push => ({ user: "u", shard: 0, epoch: 1, entry: entry(o), prevAll: prevAll === null ? null : S(prevAll) });

test("delivery - select sends only seqs above the last sent; the rest is counted, never sent", () => {
  const d = new Delivery(undefined, 10);
  d.moveTo(S(3));
  const out = d.select([entry(2), entry(3), entry(4), entry(5)]);
  assert.deepEqual(out.map((e) => e.seq), [S(4), S(5)]);
  assert.deepEqual([d.lastSent, d.lastKnown, d.regressions], [S(5), S(5), 2]);
});

test("delivery - lanes: entries of other lanes are accounted for, not sent", () => {
  const d = new Delivery(new Set(["a"]), 10);
  const out = d.select([entry(1, "a"), entry(2, "b"), entry(3, "a")]);
  assert.deepEqual(out.map((e) => e.seq), [S(1), S(3)]);
  assert.equal(d.select([entry(4, "b")]).length, 0);
  assert.deepEqual([d.lastSent, d.lastKnown], [S(3), S(4)]);
  assert.deepEqual([d.wants("a"), d.wants("b"), d.allLanes], [true, false, false]);
});

test("delivery - takeAll: all of a batch taken as select would send them; else nothing changes and select decides", () => {
  const d = new Delivery(undefined, 10);
  d.moveTo(S(3));
  assert.equal(d.takeAll([push(4, 3), push(5, 4)]), true);
  assert.deepEqual([d.lastSent, d.lastKnown, d.regressions], [S(5), S(5), 0]);
  // one at or below the last sent: not all, and nothing taken
  assert.equal(d.takeAll([push(5, 4), push(6, 5)]), false);
  assert.deepEqual([d.lastSent, d.lastKnown, d.regressions], [S(5), S(5), 0]);
  const lanes = new Delivery(new Set(["a"]), 10);
  const other = { ...push(4, 3), entry: entry(4, "b") };
  assert.equal(lanes.takeAll([push(2, 1)]), true);
  assert.equal(lanes.takeAll([push(3, 2), other]), false, "an entry of a lane the device did not ask for");
  assert.deepEqual([lanes.lastSent, lanes.lastKnown], [S(2), S(2)]);
});

test("delivery - a push is next, a duplicate, or after a gap (table)", () => {
  const table: [number, number | null, string][] = [
    [6, 5, "next"], // follows what was accounted for
    [5, 4, "duplicate"], // at the last known
    [3, 2, "duplicate"], // below it
    [7, 6, "gap"], // its predecessor (6) never came
    [6, null, "gap"], // the worker could not know its predecessor
    [6, 2, "next"], // pa below what is known: nothing missing
  ];
  for (const [seq, pa, want] of table) {
    const d = new Delivery(undefined, 10);
    d.moveTo(S(5));
    assert.equal(d.classify(push(seq, pa)), want, `seq ${seq} pa ${pa}`);
  }
});

test("delivery - held pushes come back in order; past the bound the session is told to re-read", () => {
  const d = new Delivery(undefined, 2);
  d.hold(push(1, 0));
  d.hold(push(2, 1));
  assert.equal((d.nextHeld() as Push).entry.seq, S(1));
  d.hold(push(3, 2));
  d.hold(push(4, 3)); // over the bound
  assert.equal(d.nextHeld(), "overflow");
  assert.equal(d.nextHeld(), undefined, "the held pushes were dropped: the mailbox has them");
});

test("delivery - an ACK may name only what the device could have: its start, what was sent, PULL replies", () => {
  const d = new Delivery(undefined, 2);
  d.moveTo(S(4));
  assert.deepEqual([d.canAck(S(4)), d.canAck(S(5))], [true, false]);
  d.select([entry(5)]);
  assert.equal(d.canAck(S(5)), true);
  d.pulled(S(9));
  assert.deepEqual([d.canAck(S(9)), d.canAck(S(10)), d.ackBound], [true, false, S(9)]);
});

test("rate limit - a bucket refills at its rate; with debt, a caller that keeps taking is exhausted", () => {
  const plain = new TokenBucket(2, 1, 0);
  assert.deepEqual([plain.take(0), plain.take(0), plain.take(0), plain.take(1000)], [true, true, false, true]);
  assert.equal(plain.exhausted, false);
  const debt = new TokenBucket(2, 1, 0, 2);
  const got = Array.from({ length: 6 }, () => debt.take(0));
  assert.deepEqual(got, [true, true, false, false, false, false]);
  assert.equal(debt.exhausted, true);
  // backing off pays the debt back
  assert.equal(debt.take(10_000), true);
  assert.equal(debt.exhausted, false);
});
