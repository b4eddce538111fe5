/**
 * What jetgate keeps in Redis per entry and per user, for sizing Redis (docs/operations.md,
 * "Redis memory"). One worker processes `--entries` entries to `--users` users with `--body`-byte
 * bodies, against its own redis-server; then every key is measured with MEMORY USAGE and grouped by
 * kind (the suffix after the user's hash tag, protocol/layout.ts).
 *
 *   npm run bench:redis-memory -- [--entries 50000] [--users 5000] [--body 100] [--maxlen 256] [--json]
 */
import { parseArgs } from "node:util";
import { connect } from "@nats-io/transport-node";
import { RedisKeys } from "../protocol/index.js";
import { loadConfig, Dispatcher, RegistryClient } from "../protocol/io/index.js";
import { initStack, redisClient, spawnWorker, startInfra } from "../test/harness/stack.js";
import { waitFor } from "../test/harness/wait.js";
import { Window } from "./window.js";

const { values } = parseArgs({
  options: {
    entries: { type: "string", default: "50000" },
    users: { type: "string", default: "5000" },
    body: { type: "string", default: "100" },
    maxlen: { type: "string", default: "256" },
    json: { type: "boolean", default: false },
  },
});
const entries = Number(values.entries);
const users = Array.from({ length: Number(values.users) }, (_, i) => `user${i}`);
const body = new Uint8Array(Number(values.body));

/** What a key is, from what follows `{u:<user>}:` (or the whole key for shard and process keys). */
function kindOf(key: string): string {
  const m = /\{u:[^}]+\}:([a-z]+)/.exec(key);
  if (m === null) return "other (leases, worker set, probes)";
  return { wm: "watermarks (hash per user)", hc: "hot cache (stream per user)", dd: "dedup (key per entry)", pr: "presence", ack: "device ACK", devs: "device set" }[m[1]!] ?? m[1]!;
}

const infra = await startInfra({ JETGATE_SHARDS: "4", JETGATE_HOT_CACHE_MAXLEN: values.maxlen, JETGATE_LOG_LEVEL: "warn" });
try {
  await initStack(infra.env);
  const worker = await spawnWorker(infra.env);
  const nc = await connect({ servers: infra.nats.url });
  const registry = await RegistryClient.open(nc);
  const dispatcher = new Dispatcher(nc, () => registry.shards, { lanes: ["default"] });
  const redis = await redisClient(infra.redis.url);
  const usedBefore = Number(/used_memory:(\d+)/.exec(await redis.info("memory"))![1]);
  const window = new Window(500);
  for (let i = 0; i < entries; i++) {
    const id = `m${i}`;
    await window.add(dispatcher.dispatch({ dispatch_id: id, message_id: id, lane: "default", recipients: [users[i % users.length]!], body }));
  }
  await window.drained();
  await waitFor("the worker processed every entry", async () => (await worker.metric("jetgate_worker_entries_processed_total")) >= entries, { timeoutMs: 600_000, intervalMs: 500 });
  const usedAfter = Number(/used_memory:(\d+)/.exec(await redis.info("memory"))![1]);
  const byKind = new Map<string, { keys: number; bytes: number }>();
  let cursor = "0";
  const prefix = new RedisKeys(loadConfig(infra.env).JETGATE_REDIS_PREFIX).userKeyParts()[0];
  do {
    const [next, keys] = await redis.scan(cursor, "MATCH", `${prefix.split(":")[0]}:*`, "COUNT", 1000);
    cursor = next;
    const p = redis.pipeline();
    for (const k of keys) p.memory("USAGE", k, "SAMPLES", "0");
    const sizes = (await p.exec()) ?? [];
    keys.forEach((k, i) => {
      const g = byKind.get(kindOf(k)) ?? { keys: 0, bytes: 0 };
      g.keys++;
      g.bytes += Number(sizes[i]?.[1] ?? 0);
      byKind.set(kindOf(k), g);
    });
  } while (cursor !== "0");
  const rows = [...byKind].map(([kind, g]) => ({ kind, keys: g.keys, bytes: g.bytes, perKey: Math.round(g.bytes / g.keys) }));
  const hc = byKind.get("hot cache (stream per user)");
  const summary = {
    entries, users: users.length, body: body.byteLength, maxlen: Number(values.maxlen),
    usedMemoryDelta: usedAfter - usedBefore,
    perEntry: Math.round((usedAfter - usedBefore) / entries),
    perCacheRow: hc === undefined ? 0 : Math.round(hc.bytes / Math.min(entries, users.length * Number(values.maxlen))),
  };
  if (values.json) console.log(JSON.stringify({ bench: "redis-memory", ...summary, rows }));
  else {
    console.log(`redis-memory ${Object.entries(summary).map(([k, v]) => `${k}=${v}`).join("  ")}`);
    for (const r of rows) console.log(`  ${r.kind.padEnd(36)} keys=${String(r.keys).padStart(7)}  bytes=${String(r.bytes).padStart(10)}  per key=${r.perKey}`);
  }
  dispatcher.close();
  redis.disconnect();
  await registry.close();
  await nc.close();
  await worker.kill();
} finally {
  await infra.dispose();
}
