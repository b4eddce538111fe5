/**
 * Redis out of memory, under load, with devices that reconnect all along and a quarter of them
 * offline through the fault (their apps closed, reopened with their cursors afterwards):
 * - `allkeys-lru` and `volatile-lru` at a maxmemory just above what Redis holds: it evicts any key
 *   (a user's hot cache, watermarks, dedup keys, presence, leases) while entries keep coming, then,
 *   with the load paused and the heads read (as tail checks do), 512 KiB of other data evicts the
 *   coldest keys, and nothing re-creates it before the
 *   offline devices come back;
 * - `noeviction` with maxmemory reached: every write refused (OOM) for longer than the worker
 *   consumer's ack wait, then memory freed.
 * Every device must end with every entry of its user, in order, with 0 regressions; duplicates
 * only where an evicted lease moved a shard (an epoch change). docs/operations.md says which policy
 * to run and why.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import type { Redis } from "ioredis";
import { RedisKeys, WATERMARK_ALL } from "../../protocol/index.js";
import { loadConfig } from "../../protocol/io/index.js";
import { scenarioOnInfra, type FaultRun } from "../harness/faults.js";
import { redisClient } from "../harness/stack.js";
import { sleep, waitFor } from "../harness/wait.js";

async function info(r: Redis, field: string): Promise<number> {
  const m = new RegExp(`^${field}:(\\d+)`, "m").exec(await r.info());
  return m === null ? 0 : Number(m[1]);
}

/**
 * A quarter of the devices offline while `during` runs with the load going on. Then, with the load
 * paused and everything sent processed (the devices still online have it), they come back with
 * their cursors: at SYNCED each must hold every entry of its user. No later entry is coming to
 * reveal a gap, so nothing but the catch-up can bring what it missed (the probe's phone, offline
 * for a day).
 */
async function offlineThrough(run: FaultRun, during: () => Promise<void>): Promise<void> {
  const away = run.devices.filter((_, i) => i % 4 === 0);
  for (const d of away) await run.closeApp(d);
  await during();
  run.pauseLoad();
  const online = run.devices.filter((d) => !away.includes(d));
  await waitFor("the devices still online have every entry", () => online.every((d) => (run.sent.get(d.user) ?? []).every((id) => d.ids.has(id))), { timeoutMs: 60_000, intervalMs: 100 });
  for (const d of away) await run.reopen(d);
  await waitFor("the devices that were away are live (synced)", () => away.every((d) => d.client.state.type === "live"), { timeoutMs: 30_000, intervalMs: 20 });
  for (const d of away) {
    const missing = (run.sent.get(d.user) ?? []).filter((id) => !d.ids.has(id));
    assert.deepEqual(missing, [], `${d.user}/${d.name}: every entry of its user by SYNCED`);
  }
  run.resumeLoad();
}

/** Runs a memory scenario; returns the keys Redis evicted during it. */
async function memoryScenario(name: string, policy: string, squeeze: (r: Redis) => Promise<void>, holdMs: number): Promise<number> {
  let evicted = 0;
  const r = await scenarioOnInfra((infra) => ({
    name,
    // the consumer's ack wait (2 s) is shorter than the hold: the redeliveries must change nothing
    env: { ...infra.env, JETGATE_WORKER_ACK_WAIT_S: "2", JETGATE_DEPENDENCY_TIMEOUT_MS: "1000" },
    duplicates: "allowed",
    fault: async (run) => {
      const redis = await redisClient(infra.redis.url);
      try {
        const before = await info(redis, "evicted_keys");
        await offlineThrough(run, async () => {
          await sleep(500); // entries arrive for the offline devices' users
          assert.equal(await redis.config("SET", "maxmemory-policy", policy), "OK");
          await squeeze(redis);
          await sleep(holdMs);
          if (policy !== "noeviction") {
            // with no entries coming, nothing re-creates what is evicted: the devices come back to
            // users some of whose keys are gone and some not
            run.pauseLoad();
            await sleep(300);
            await pad(run, redis, new RedisKeys(loadConfig(infra.env).JETGATE_REDIS_PREFIX));
          }
          assert.equal(await redis.config("SET", "maxmemory", "0"), "OK");
        });
        evicted = (await info(redis, "evicted_keys")) - before;
      } finally {
        await redis.config("SET", "maxmemory", "0").catch(() => undefined);
        redis.disconnect();
      }
    },
  }));
  // duplicates only with an epoch change (an evicted lease let the other worker take a shard)
  assert.ok(r.duplicates === 0 || r.epochChanges > 0, `${r.duplicates} duplicates without an epoch change`);
  console.log(`  ${name}: ${evicted} keys evicted`);
  return evicted;
}

/**
 * Reads every user's head, as the gateways' tail checks do each period for the users of live
 * sessions (so in production a watermark hash stays warm while its user's hot cache goes cold),
 * then writes 512 KiB of other data at the tight maxmemory: Redis evicts the coldest of jetgate's
 * keys to make room, hot caches and dedup keys first.
 */
async function pad(run: FaultRun, r: Redis, keys: RedisKeys): Promise<void> {
  for (const u of run.users) await r.hget(keys.watermarks(u), WATERMARK_ALL);
  const chunk = "x".repeat(4096);
  for (let i = 0; i < 128; i++) await r.set(`padding:${i}`, chunk, "EX", 60);
  await r.del(...Array.from({ length: 128 }, (_, i) => `padding:${i}`));
}

/** maxmemory just above what Redis holds now: the load makes it evict from the first write on. */
async function tight(r: Redis): Promise<void> {
  const used = await info(r, "used_memory");
  assert.equal(await r.config("SET", "maxmemory", String(used + 256 * 1024)), "OK");
}

test("redis memory - allkeys-lru at a tight maxmemory under load: any key evicted, offline devices come back to every entry", async () => {
  assert.ok((await memoryScenario("Redis allkeys-lru, tight", "allkeys-lru", tight, 5000)) > 0, "Redis evicted keys");
});

test("redis memory - volatile-lru at a tight maxmemory under load: keys with a TTL evicted, every entry delivered", async () => {
  assert.ok((await memoryScenario("Redis volatile-lru, tight", "volatile-lru", tight, 5000)) > 0, "Redis evicted keys");
});

test("redis memory - noeviction with maxmemory reached (OOM) for 2.5x the ack wait under load: writes refused, then every entry delivered", async () => {
  await memoryScenario("Redis noeviction, full (OOM)", "noeviction", async (r) => {
    assert.equal(await r.config("SET", "maxmemory", "1"), "OK");
  }, 5000);
});
