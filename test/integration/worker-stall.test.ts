/**
 * A Redis stall longer than the worker consumer's ack wait (shortened here with
 * JETGATE_WORKER_ACK_WAIT_S): JetStream delivers every unacknowledged entry again while the worker
 * waits for Redis. Afterwards nothing is pushed twice, no regression is counted and no offset is
 * taken for a skipped one. (It once did all three: the batch acked its last message, an older
 * redelivery, and took that for the last offset done.)
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { DispatchLoad, PushCollector, redisClient, startStack } from "../harness/stack.js";
import { sleep, waitFor } from "../harness/wait.js";

const stack = await startStack({
  // one worker, leases far longer than the stall: no takeover, no epoch change, nothing else moves
  env: { JETGATE_LEASE_MS: "60000" },
  worker: { JETGATE_WORKER_ACK_WAIT_S: "1", JETGATE_WORKER_BATCH: "20" },
});
after(() => stack.dispose());

test("worker stall - Redis stalled 3x the consumer's ack wait under load: every entry pushed once, no regression, no skipped offset", async () => {
  const worker = stack.worker!;
  const collector = await PushCollector.start(stack.infra.nats.url, stack.infra.redis.url);
  const redis = await redisClient(stack.infra.redis.url);
  const users = Array.from({ length: 20 }, (_, i) => `st${i}`);
  await collector.watch(...users);
  const load = new DispatchLoad(stack.dispatcher, users, { perTick: 5, everyMs: 20, prefix: "st" });
  try {
    await sleep(1000);
    // write commands (the worker's batch script among them) wait; the dispatches go on
    assert.equal(await redis.call("CLIENT", "PAUSE", "3500", "WRITE"), "OK");
    await sleep(3500);
    await sleep(1500);
    await load.stop();
    assert.deepEqual(load.failed, []);
    const sent = load.allIds();
    await waitFor("every entry pushed", () => new Set(collector.pushes.map((p) => p.push.entry.id)).size >= sent.length, { timeoutMs: 30_000 });
    await sleep(500);
    const counts = new Map<string, number>();
    for (const p of collector.pushes) counts.set(p.push.entry.id, (counts.get(p.push.entry.id) ?? 0) + 1);
    const twice = [...counts].filter(([, n]) => n > 1);
    console.log(`  ${sent.length} entries, ${collector.pushes.length} pushes, ${twice.length} pushed more than once`);
    assert.deepEqual(new Set(counts.keys()), new Set(sent), "every entry pushed");
    assert.deepEqual(twice, [], "nothing pushed twice");
    assert.equal(await worker.metric("jetgate_mailbox_seq_regression_total", { component: "worker" }), 0, "no regression counted");
    assert.equal(await worker.metric("jetgate_worker_delivery_gaps_total"), 0, "no offset taken for skipped");
    assert.equal(await worker.metric("jetgate_worker_takeovers_total"), 2, "no takeover beyond the first of each shard");
  } finally {
    await load.stop();
    redis.disconnect();
    await collector.close();
  }
});
