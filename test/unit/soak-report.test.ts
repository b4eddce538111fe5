import { test } from "node:test";
import assert from "node:assert/strict";
import { FAULTS, faultSchedule, finalLine, formatTable, maxIn, metricValue, rssGrowth, seededRandom, vmRssBytes, type Row, type Sample } from "../soak/report.js";

test("soak schedule: the same seed gives the same faults; every kind once in each FAULTS.length minutes", () => {
  assert.deepEqual(faultSchedule(42, 30), faultSchedule(42, 30));
  assert.notDeepEqual(faultSchedule(1, 30), faultSchedule(2, 30));
  const s = faultSchedule(7, 32);
  assert.equal(s.length, 32);
  const n = FAULTS.length;
  for (let i = 0; i + n <= 32; i += n) assert.deepEqual([...s.slice(i, i + n)].sort(), [...FAULTS].sort());
  assert.deepEqual(faultSchedule(7, 3), s.slice(0, 3));
  assert.equal(new Set(faultSchedule(7, 3)).size, 3);
});

test("soak random: seeded, in [0, 1)", () => {
  const a = seededRandom(5);
  const b = seededRandom(5);
  for (let i = 0; i < 1000; i++) {
    const x = a();
    assert.equal(x, b());
    assert.ok(x >= 0 && x < 1);
  }
});

test("soak metrics: sums label sets, names with digits, absent is undefined", () => {
  const text = [
    "# HELP jetgate_gateway_nodejs_eventloop_lag_p99_seconds The 99th percentile.",
    "# TYPE jetgate_gateway_nodejs_eventloop_lag_p99_seconds gauge",
    "jetgate_gateway_nodejs_eventloop_lag_p99_seconds 0.012",
    'jetgate_mailbox_seq_regression_total{component="gateway"} 0',
    'jetgate_mailbox_seq_regression_total{component="x"} 2',
    "jetgate_mailbox_seq_regression_total_other 5",
  ].join("\n");
  assert.equal(metricValue(text, "jetgate_gateway_nodejs_eventloop_lag_p99_seconds"), 0.012);
  assert.equal(metricValue(text, "jetgate_mailbox_seq_regression_total"), 2);
  assert.equal(metricValue(text, "nope"), undefined);
  assert.equal(vmRssBytes("Name:\tnode\nVmHWM:\t  90000 kB\nVmRSS:\t   81920 kB\n"), 81920 * 1024);
  assert.equal(vmRssBytes("Name:\tzombie\n"), undefined);
});

const MiB = 2 ** 20;

test("soak RSS: growth per process after warm-up; a replacement warms up a minute of its own", () => {
  const t0 = 1_000_000;
  const samples: Sample[] = [];
  for (let t = 0; t <= 300_000; t += 10_000) {
    samples.push({ t: t0 + t, slot: "gateway-1", pid: 1, rss: (100 + t / 60_000) * MiB, loopP99: 0.01 });
    // worker-1's first process dies at 2 min; its replacement starts then
    if (t < 120_000) samples.push({ t: t0 + t, slot: "worker-1", pid: 2, rss: (50 + t / 10_000) * MiB });
    else samples.push({ t: t0 + t, slot: "worker-1", pid: 3, rss: (60 + (t - 120_000) / 60_000) * MiB, loopP99: t === 200_000 ? 0.2 : 0.01 });
  }
  samples.push({ t: t0 + 310_000, slot: "worker-2", pid: 4, rss: 70 * MiB });
  assert.deepEqual(rssGrowth(samples, t0, t0 + 60_000), [
    "gateway-1 +4.0 MiB over 4.0 min",
    "worker-1 +5.0 MiB over 0.8 min, replaced at min 2: +2.0 MiB over 2.0 min",
    "worker-2 n/a (lived under a minute after warm-up)",
  ]);
  assert.equal(maxIn(samples, t0, t0 + 60_000, (s) => s.rss, "worker"), 55 * MiB);
  assert.equal(maxIn(samples, t0 + 180_000, t0 + 240_000, (s) => s.loopP99), 0.2);
  assert.equal(maxIn(samples, t0, t0 + 60_000, (s) => s.loopP99, "worker"), undefined);
});

test("soak report: a markdown table row per fault, and the final line", () => {
  const row: Row = { minute: 0, fault: "worker-kill", faultMs: 812, recoverMs: 1400, dispatched: 5000, delivered: 10000, missing: 0, duplicates: 3, gatewayRss: 120.25 * MiB, workerRss: 90 * MiB, loopP99: 0.0213 };
  const table = formatTable([row, { ...row, minute: 1, recoverMs: undefined, gatewayRss: undefined }]).split("\n");
  assert.equal(table.length, 4);
  assert.match(table[0]!, /^\| min \| fault \| fault ms \| recovery ms \|/);
  assert.equal(table[2], "| 0 | worker-kill | 812 | 1400 | 5000 | 10000 | 0 | 3 | 120.3 | 90.0 | 21.3 |");
  assert.equal(table[3], "| 1 | worker-kill | 812 | TIMEOUT | 5000 | 10000 | 0 | 3 | - | 90.0 | 21.3 |");
  assert.equal(
    finalLine({ minutes: 3, faults: 3, dispatched: 10, delivered: 20, missing: 0, duplicates: 1, regressions: 0, growth: ["gateway-1 +1.0 MiB over 2.0 min", "worker-1 n/a"] }),
    "soak: 3 min, 3 faults, dispatched 10 delivered 20 missing 0 duplicates 1 regressions 0; RSS growth after warm-up: gateway-1 +1.0 MiB over 2.0 min; worker-1 n/a",
  );
});
