import { test } from "node:test";
import assert from "node:assert/strict";
import fc from "fast-check";
import { followChain, type ChainRow } from "../../gateway/mailbox/cache-coverage.js";

/** Rows of shard 0 with seqs `seqs`, each naming the one before it (the first names `first`). */
function chained(seqs: number[], first: number | null): ChainRow[] {
  return seqs.map((s, i) => ({ seq: BigInt(s), prevAll: i === 0 ? (first === null ? null : BigInt(first)) : BigInt(seqs[i - 1]!), shard: 0 }));
}

const seqsOf = (rows: ChainRow[]) => rows.map((r) => Number(r.seq));

test("cache coverage - an unbroken chain from the cursor to the head is complete", () => {
  const c = followChain(chained([5, 7, 9], 3), 0, 3n, 9n);
  assert.deepEqual(seqsOf(c.kept), [5, 7, 9]);
  assert.equal(c.at, 9n);
  assert.deepEqual(c.stop, { type: "complete" });
});

test("cache coverage - a cursor between entries: the first row's prevAll at or below it is enough", () => {
  // the device was rebased to 4 (no entry there); the user's entry before 5 is 3
  const c = followChain(chained([5, 7], 3), 0, 4n, 7n);
  assert.deepEqual(c.stop, { type: "complete" });
  assert.deepEqual(seqsOf(c.kept), [5, 7]);
});

test("cache coverage - no rows at all (the key vanished) is not 'nothing there'", () => {
  const c = followChain([], 0, 3n, 9n);
  assert.deepEqual(c.kept, []);
  assert.equal(c.at, 3n);
  assert.deepEqual(c.stop, { type: "rows_end" }, "the reader must ask the stream");
});

test("cache coverage - a trimmed cache: its first row follows an entry past the cursor", () => {
  const c = followChain(chained([7, 9], 5), 0, 3n, 9n);
  assert.deepEqual(c.kept, []);
  assert.deepEqual(c.stop, { type: "break", index: 0, vouchable: true });
});

test("cache coverage - a row written while the hash was gone (no prevAll) breaks the chain; the stream may vouch for it", () => {
  const rows = chained([5, 7, 9], 3);
  rows[1] = { ...rows[1]!, prevAll: null };
  const c = followChain(rows, 0, 3n, 9n);
  assert.deepEqual(seqsOf(c.kept), [5]);
  assert.equal(c.at, 5n);
  assert.deepEqual(c.stop, { type: "break", index: 1, vouchable: true });
  const vouched = followChain(rows.slice(1), 0, c.at, 9n, true);
  assert.deepEqual(seqsOf(vouched.kept), [7, 9]);
  assert.deepEqual(vouched.stop, { type: "complete" });
});

test("cache coverage - a missing row inside the cache (its prevAll skips one) breaks the chain there", () => {
  const rows: ChainRow[] = [
    { seq: 5n, prevAll: 3n, shard: 0 },
    { seq: 9n, prevAll: 7n, shard: 0 }, // 7 is not in the cache
  ];
  const c = followChain(rows, 0, 3n, 9n);
  assert.deepEqual(seqsOf(c.kept), [5]);
  assert.deepEqual(c.stop, { type: "break", index: 1, vouchable: true });
});

test("cache coverage - a row of another shard is never vouched for", () => {
  const rows = chained([5, 7], 3);
  rows[1] = { ...rows[1]!, shard: 1 };
  const c = followChain(rows, 0, 3n, 9n, false);
  assert.deepEqual(c.stop, { type: "break", index: 1, vouchable: false });
  assert.deepEqual(followChain(rows.slice(1), 0, 5n, 9n, true).stop, { type: "break", index: 0, vouchable: false }, "not even when told to");
});

test("cache coverage - rows past the head: a following one proves the range, the entry at the head itself is not needed", () => {
  // target 8 (a split's until, say): 9 follows 7, so nothing lies in (7, 8]
  const c = followChain(chained([5, 7, 9], 3), 0, 3n, 8n);
  assert.deepEqual(seqsOf(c.kept), [5, 7]);
  assert.deepEqual(c.stop, { type: "complete" });
  // the head's row missing, the next one does not follow: no proof
  const gap: ChainRow[] = [{ seq: 5n, prevAll: 3n, shard: 0 }, { seq: 11n, prevAll: 9n, shard: 0 }];
  assert.deepEqual(followChain(gap, 0, 3n, 9n).stop, { type: "break", index: 1, vouchable: true });
});

test("cache coverage - a prevAll at or above its own seq (a re-processed or out-of-order write) proves nothing", () => {
  const rows: ChainRow[] = [{ seq: 5n, prevAll: 5n, shard: 0 }];
  assert.deepEqual(followChain(rows, 0, 5n, 9n).stop, { type: "rows_end" }, "rows at or below the cursor are skipped");
  assert.deepEqual(followChain([{ seq: 6n, prevAll: 6n, shard: 0 }], 0, 5n, 9n).stop, { type: "break", index: 0, vouchable: true });
});

test("cache coverage - property: whatever rows are lost, what is kept is exactly the user's entries in (after, at], and 'complete' means at reaches the target", () => {
  fc.assert(
    fc.property(
      fc.uniqueArray(fc.integer({ min: 1, max: 60 }), { minLength: 0, maxLength: 25 }).map((a) => a.sort((x, y) => x - y)),
      fc.array(fc.boolean(), { minLength: 25, maxLength: 25 }),
      fc.array(fc.boolean(), { minLength: 25, maxLength: 25 }),
      fc.integer({ min: 0, max: 60 }),
      fc.integer({ min: 0, max: 70 }),
      (entries, lost, unknownPrev, after, target) => {
        // the worker wrote a row per entry naming the entry before it; some rows are lost since
        // (trim, eviction), some were written while the hash was gone (prevAll unknown)
        const rows: ChainRow[] = [];
        entries.forEach((s, i) => {
          if (lost[i]) return;
          const prevAll = unknownPrev[i] || i === 0 ? (i === 0 && !unknownPrev[i] ? 0n : null) : BigInt(entries[i - 1]!);
          rows.push({ seq: BigInt(s), prevAll, shard: 0 });
        });
        const above = rows.filter((r) => r.seq > BigInt(after));
        const c = followChain(above, 0, BigInt(after), BigInt(target));
        const truth = entries.filter((s) => s > after && BigInt(s) <= c.at);
        assert.deepEqual(seqsOf(c.kept), truth, "the kept rows are every entry up to `at`");
        if (c.stop.type === "complete") {
          assert.deepEqual(seqsOf(c.kept), entries.filter((s) => s > after && s <= target), "complete: every entry up to the target");
        }
      },
    ),
    { numRuns: 3000 },
  );
});
