/** The stage histograms (protocol/stages.ts): counting, Prometheus's cumulative counts, quantiles, and the metric a process prints. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { Registry } from "prom-client";
import { STAGE_BUCKETS_S, StageTimes, emptyStageCounts, observeStage, stageCountsOf, stageQuantileMs } from "../../protocol/index.js";
import { registerStageMetric } from "../../protocol/io/index.js";

test("stages - an observation lands in the first bucket whose bound it does not exceed; above the last, in the overflow", () => {
  const c = emptyStageCounts();
  assert.equal(c.length, STAGE_BUCKETS_S.length + 1);
  observeStage(c, 0);
  observeStage(c, 0.0001);
  observeStage(c, 0.00011, 3);
  observeStage(c, 60);
  assert.equal(c[0], 2, "0 and exactly the first bound");
  assert.equal(c[1], 3, "just above the first bound, counted 3 times");
  assert.equal(c[STAGE_BUCKETS_S.length], 1, "over 10 s");
});

test("stages - quantiles are the upper bound of their bucket in ms; Infinity above the last; undefined when empty", () => {
  const c = emptyStageCounts();
  assert.equal(stageQuantileMs(c, 0.5), undefined);
  for (let i = 0; i < 98; i++) observeStage(c, 0.002);
  observeStage(c, 0.3);
  observeStage(c, 20);
  assert.equal(stageQuantileMs(c, 0.5), 2.5);
  assert.equal(stageQuantileMs(c, 0.99), 500);
  assert.equal(stageQuantileMs(c, 1), Infinity);
});

test("stages - Prometheus's cumulative bucket counts become per-bucket counts, a reading before subtracted", () => {
  const before = emptyStageCounts();
  const after = emptyStageCounts();
  observeStage(before, 0.001, 2);
  observeStage(after, 0.001, 5);
  observeStage(after, 1, 4);
  const cumulative = (c: number[]) => c.map((_, i) => c.slice(0, i + 1).reduce((a, b) => a + b, 0));
  assert.deepEqual(stageCountsOf(cumulative(after)), after);
  const between = stageCountsOf(cumulative(after), cumulative(before));
  assert.equal(between.reduce((a, b) => a + b, 0), 7);
  assert.equal(between[STAGE_BUCKETS_S.indexOf(0.001)], 3);
  assert.equal(between[STAGE_BUCKETS_S.indexOf(1)], 4);
});

test("stages - StageTimes counts a batch in one call and prints as a Prometheus histogram per stage", async () => {
  const times = new StageTimes();
  times.observe("worker_redis", 0.002, 400);
  times.observe("worker_redis", 20);
  times.observe("gateway_chain", 0.00005);
  const registry = new Registry();
  registerStageMetric(registry, "jetgate_test_stage_seconds", "help text", times);
  const text = await registry.metrics();
  assert.match(text, /^# TYPE jetgate_test_stage_seconds histogram$/m);
  assert.match(text, /^jetgate_test_stage_seconds_bucket\{stage="worker_redis",le="0.001"\} 0$/m);
  assert.match(text, /^jetgate_test_stage_seconds_bucket\{stage="worker_redis",le="0.0025"\} 400$/m);
  assert.match(text, /^jetgate_test_stage_seconds_bucket\{stage="worker_redis",le="10"\} 400$/m);
  assert.match(text, /^jetgate_test_stage_seconds_bucket\{stage="worker_redis",le="\+Inf"\} 401$/m);
  assert.match(text, /^jetgate_test_stage_seconds_count\{stage="worker_redis"\} 401$/m);
  assert.match(text, /^jetgate_test_stage_seconds_sum\{stage="worker_redis"\} 20.8$/m);
  assert.match(text, /^jetgate_test_stage_seconds_bucket\{stage="gateway_chain",le="0.0001"\} 1$/m);
  assert.doesNotMatch(text, /stage="dispatch_queue"/, "a stage never observed prints nothing");
});
