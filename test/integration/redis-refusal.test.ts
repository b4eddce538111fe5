/**
 * A Redis that answers but refuses writes (a full `noeviction` maxmemory: OOM; a replica:
 * READONLY) is not a Redis a worker can work with: the worker and the gateway say so on /readyz,
 * naming the refusal, the `redis_writable` gauge drops to 0, the worker's lag shows the backlog from
 * the first seconds, and the logs name the cause (not "lease vanished"). When Redis takes writes
 * again, everything is delivered. MISCONF and NOREPLICAS go through the same probe (writeRefusal
 * in test/unit/health.test.ts).
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { DispatchLoad, PushCollector, redisClient, startStack, spawnGateway, type JetgateProcess } from "../harness/stack.js";
import { RedisServer } from "../harness/servers.js";
import { sleep, waitFor } from "../harness/wait.js";

const stack = await startStack({
  env: { JETGATE_DEPENDENCY_TIMEOUT_MS: "1000", JETGATE_LEASE_MS: "3000" },
  worker: { JETGATE_WORKER_ACK_WAIT_S: "2" },
  gateway: {},
});
after(() => stack.dispose());

async function readyz(p: JetgateProcess): Promise<{ status: number; body: { ready: boolean; problems: string[]; detail?: Record<string, string> } }> {
  const r = await p.http("/readyz");
  return { status: r.status, body: JSON.parse(r.text) as { ready: boolean; problems: string[]; detail?: Record<string, string> } };
}

/** Waits until both processes are not ready for `why`, and checks what they say. */
async function refusedOn(procs: JetgateProcess[], why: string): Promise<void> {
  for (const p of procs) {
    await waitFor(`${p.name} not ready: redis ${why}`, async () => (await readyz(p)).status === 503, { timeoutMs: 10_000, intervalMs: 100 });
    const r = await readyz(p);
    assert.deepEqual(r.body.problems.filter((x) => x === "redis"), ["redis"], `${p.name}: ${JSON.stringify(r.body)}`);
    assert.match(r.body.detail?.redis ?? "", new RegExp(`^refuses writes \\(${why}\\): `), `${p.name}: ${JSON.stringify(r.body)}`);
    const prefix = p.name.startsWith("worker") ? "jetgate_worker_" : "jetgate_gateway_";
    assert.equal(await p.metric(`${prefix}redis_writable`), 0, `${p.name}: ${prefix}redis_writable`);
  }
}

async function readyAgain(procs: JetgateProcess[]): Promise<void> {
  for (const p of procs) {
    await waitFor(`${p.name} ready again`, async () => (await readyz(p)).status === 200, { timeoutMs: 15_000, intervalMs: 100 });
    const prefix = p.name.startsWith("worker") ? "jetgate_worker_" : "jetgate_gateway_";
    assert.equal(await p.metric(`${prefix}redis_writable`), 1);
  }
}

test("redis refusal - OOM under load (noeviction, maxmemory reached): not ready, named; lag visible at once; the logs say why; every entry pushed once after", async () => {
  const worker = stack.worker!;
  const gateway = stack.gateway!;
  const redis = await redisClient(stack.infra.redis.url);
  const collector = await PushCollector.start(stack.infra.nats.url, stack.infra.redis.url);
  const users = Array.from({ length: 20 }, (_, i) => `oom${i}`);
  await collector.watch(...users);
  const load = new DispatchLoad(stack.dispatcher, users, { perTick: 4, everyMs: 20, prefix: "oom" });
  try {
    await sleep(500);
    const outputBefore = worker.output.length;
    assert.equal(await redis.config("SET", "maxmemory-policy", "noeviction"), "OK");
    assert.equal(await redis.config("SET", "maxmemory", "1"), "OK");
    const t0 = Date.now();
    await refusedOn([worker, gateway], "oom");
    // the backlog shows within a few seconds (it once read 0 for the first half minute)
    await waitFor("the worker's lag gauge above 0", async () => (await worker.metric("jetgate_worker_lag_entries")) > 0, { timeoutMs: 4000, intervalMs: 100 });
    const lagMs = Date.now() - t0;
    // past the consumer's ack wait: its redeliveries must change nothing
    await sleep(4000);
    const lagDuring = await worker.metric("jetgate_worker_lag_entries");
    assert.equal(await redis.config("SET", "maxmemory", "0"), "OK");
    await readyAgain([worker, gateway]);
    await load.stop();
    const sent = load.allIds();
    await waitFor("every entry pushed", () => new Set(collector.pushes.map((p) => p.push.entry.id)).size >= sent.length, { timeoutMs: 30_000 });
    await sleep(300);
    const counts = new Map<string, number>();
    for (const p of collector.pushes) counts.set(p.push.entry.id, (counts.get(p.push.entry.id) ?? 0) + 1);
    console.log(`  OOM: not ready and lag > 0 within ${lagMs} ms; lag ${lagDuring} after 4 s more; ${sent.length} entries, ${collector.pushes.length} pushes`);
    assert.deepEqual(new Set(counts.keys()), new Set(sent), "every entry pushed");
    assert.deepEqual([...counts].filter(([, n]) => n > 1), [], "nothing pushed twice");
    assert.equal(await worker.metric("jetgate_mailbox_seq_regression_total"), 0);
    const logged = worker.output.slice(outputBefore).join("\n");
    assert.match(logged, /Redis refuses writes \(oom\)/, "the worker's log names the cause");
    assert.doesNotMatch(logged, /lease vanished/, "not a lost key");
    // each failure is logged when it starts, not every tick
    assert.ok(logged.split("\n").filter((l) => l.includes("worker tick failed")).length <= 2, logged);
  } finally {
    await redis.config("SET", "maxmemory", "0").catch(() => undefined);
    await load.stop();
    await collector.close();
    redis.disconnect();
  }
});

test("redis refusal - a replica (READONLY): a gateway started against it is not ready, named; writable again, ready (the worker runs the same probe)", async () => {
  const primary = await RedisServer.start();
  const replica = await RedisServer.start();
  const r = await redisClient(replica.url);
  let procs: JetgateProcess[] = [];
  try {
    const env = { ...stack.infra.env, JETGATE_REDIS_URL: replica.url };
    const gateway = await spawnGateway(env);
    procs = [gateway];
    assert.equal(await r.call("REPLICAOF", "127.0.0.1", String(primary.port)), "OK");
    await refusedOn(procs, "readonly");
    assert.equal(await r.call("REPLICAOF", "NO", "ONE"), "OK");
    await readyAgain(procs);
  } finally {
    for (const p of procs) await p.kill();
    r.disconnect();
    await Promise.all([primary.dispose(), replica.dispose()]);
  }
});
