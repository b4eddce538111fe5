/**
 * What the gateway's push latency histogram costs on the per-entry hot path: N `observe` calls of
 * prom-client's Histogram with jetgate_gateway_push_latency_seconds' buckets (GatewayMetrics'
 * own), and the whole line sessions.ts runs (Date.now, clamp, observe). Values are drawn ahead of
 * time over the 1 ms..10 s range, so the bucket search sees realistic spread.
 *
 *   node --import tsx bench/metric-observe.ts [--calls 2000000] [--rounds 7] [--json]
 */
import { parseArgs } from "node:util";
import { GatewayMetrics } from "../gateway/metrics.js";

const { values } = parseArgs({
  options: {
    calls: { type: "string", default: "2000000" },
    rounds: { type: "string", default: "7" },
    json: { type: "boolean", default: false },
  },
});
const N = Number(values.calls);
const rounds = Number(values.rounds);

const hist = new GatewayMetrics().pushLatency;
// log-uniform over 0.5 ms..12 s (a few beyond the last bucket); a power of two for cheap indexing
const samples = Float64Array.from({ length: 1 << 16 }, () => 0.0005 * Math.pow(24_000, Math.random()));
const mask = samples.length - 1;
const tsMs = new Float64Array(samples.length);

function time(body: (i: number) => void): number {
  // entry timestamps relative to this round's start, so the latencies keep their spread
  const now = Date.now();
  for (let i = 0; i < samples.length; i++) tsMs[i] = now - samples[i]! * 1000;
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < N; i++) body(i);
  return Number(process.hrtime.bigint() - t0) / N;
}

const cases: Record<string, (i: number) => void> = {
  observe: (i) => hist.observe(samples[i & mask]!),
  hot_path_line: (i) => hist.observe(Math.max(0, Date.now() - tsMs[i & mask]!) / 1000),
  // the loop and array read alone, to subtract
  baseline: (i) => void samples[i & mask],
};

// the median round of each, after a warm-up round (JIT)
const result: Record<string, number> = {};
for (const [name, body] of Object.entries(cases)) {
  time(body);
  const ns = Array.from({ length: rounds }, () => time(body)).sort((a, b) => a - b);
  result[name] = Number(ns[Math.floor(rounds / 2)]!.toFixed(1));
}

if (values.json) console.log(JSON.stringify({ calls: N, rounds, node: process.version, ns_per_call: result }));
else for (const [name, ns] of Object.entries(result)) console.log(`${name.padEnd(14)} ${ns.toFixed(1)} ns/call (median of ${rounds} x ${N})`);
