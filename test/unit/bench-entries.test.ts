/**
 * What the benchmark's delivery checks rest on (bench/compare/entries.ts): every body carries its
 * stamp and an id unique over the run, and latency histograms merged from several generator
 * processes give the quantiles of all their samples.
 */
import { dueAt, pace } from "../../bench/compare/pace.js";
import { test } from "node:test";
import assert from "node:assert/strict";
import fc from "fast-check";
import { idSource, merge, quantile, readStamp, record, SeenIds, stampedBody, type Histogram } from "../../bench/compare/entries.js";

test("bench entries - a body gives back its id and stamp; ids of different producers never meet", () => {
  const a = idSource(0);
  const b = idSource(1);
  const ids = new Set<number>();
  for (let i = 0; i < 1000; i++) for (const next of [a, b]) ids.add(next());
  assert.equal(ids.size, 2000);
  const before = performance.timeOrigin + performance.now();
  const body = stampedBody(2 ** 32 + 7);
  const s = readStamp(body)!;
  assert.equal(s.id, 2 ** 32 + 7);
  assert.ok(s.sentAt >= before && s.sentAt <= performance.timeOrigin + performance.now());
  assert.equal(readStamp(new Uint8Array(8)), undefined, "too short to carry an id");
});

test("bench entries - a device's seen ids: a duplicate is found whatever the order, as a Set finds it", () => {
  fc.assert(
    fc.property(fc.array(fc.tuple(fc.integer({ min: 0, max: 3 }), fc.integer({ min: 1, max: 400 })), { maxLength: 600 }), (pairs) => {
      const seen = new SeenIds();
      const reference = new Set<number>();
      for (const [producer, n] of pairs) {
        const id = producer * 2 ** 32 + n;
        assert.equal(seen.add(id), !reference.has(id), `id ${id}`);
        reference.add(id);
      }
    }),
  );
  // in order, as nearly every delivery comes: appends, past the first growth
  const inOrder = new SeenIds();
  for (let n = 1; n <= 1000; n++) assert.equal(inOrder.add(2 ** 32 + n), true);
  assert.equal(inOrder.add(2 ** 32 + 500), false);
  assert.equal(inOrder.add(2 ** 32 + 1001), true);
});

test("bench entries - merged histograms: quantiles within 2% of the exact ones over all samples", () => {
  fc.assert(
    fc.property(fc.array(fc.array(fc.double({ min: 0.01, max: 5000, noNaN: true }), { minLength: 1, maxLength: 200 }), { minLength: 1, maxLength: 4 }), (parts) => {
      const all = parts.flat().sort((x, y) => x - y);
      const merged = parts.reduce((h, part) => {
        const own: Histogram = {};
        for (const v of part) record(own, v);
        return merge(h, own);
      }, {} as Histogram);
      for (const q of [0.5, 0.99, 1]) {
        const exact = all[Math.min(all.length, Math.max(1, Math.ceil(q * all.length))) - 1]!;
        const got = quantile(merged, q);
        // the bucket's upper bound: at or above the sample, by at most one bucket (2%, +1 ms at 0)
        assert.ok(got >= exact - 0.01 && got <= (exact + 1) * 1.02 - 1 + 0.01, `q${q}: ${got} for ${exact}`);
      }
    }),
  );
  assert.equal(quantile({}, 0.99), 0);
});

test("bench pace - what is due by the clock: a late tick is made up at the next, never lost", async () => {
  assert.equal(dueAt(1000, 0), 0);
  assert.equal(dueAt(1000, 10), 10);
  assert.equal(dueAt(333, 1000), 333);
  const sends: number[] = [];
  let blocked = false;
  const sent = await pace(0.3, 1000, (n) => {
    sends.push(n);
    // one tick holds the event loop for 40 ms, as a busy producer's would
    if (!blocked && sends.length === 5) {
      blocked = true;
      const until = performance.now() + 40;
      while (performance.now() < until);
    }
  });
  assert.equal(sent, sends.reduce((a, b) => a + b, 0));
  // 300 ms at 1000/s, plus the tick sent ahead
  assert.ok(sent >= 295 && sent <= 315, `sent ${sent}`);
  assert.ok(Math.max(...sends) >= 30, `the tick after the 40 ms stall makes it up: ${String(sends)}`);
});
