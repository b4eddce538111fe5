/**
 * The worker's Redis work for one entry, as one Lua script over one user's keys (one cluster slot):
 *
 * 1. dedup `dispatch_id:user`: the first copy stores its `<log>:<offset>`. The same offset seen again
 *    (redelivery, takeover, a crash between steps) counts as the first copy again, so it is pushed
 *    again: a crash never loses a push. Another offset with the same key is a duplicate: it is not
 *    pushed, but it still is a position in the mailbox (a rebuilt stream re-appends many), so it
 *    goes into the watermarks and the hot cache like any entry; otherwise the rows' chain of
 *    `prevAll` would point past it and a reader could skip it.
 * 2. lane watermark, upward only; the previous value is returned and becomes the entry's `prev`.
 *    The same for the user over all lanes (`_all`): the push's `pa`, which gateways use to detect a
 *    lost push before sending anything after it. Seqs are 20-digit decimal strings, compared as
 *    strings: Lua numbers are doubles.
 * 3. routes: the gateways holding the user's sessions, which gateways write into the same hash
 *    (`HASH_FIELDS.routes`); the worker sends the entry's push to those only (worker/push-router.ts).
 * 4. hot cache: XADD with id `<epoch>-<offset>` (Redis keeps ids increasing, so a zombie's older
 *    epoch cannot write behind newer entries: its XADD fails and is ignored), bounded by MAXLEN and a
 *    TTL. Each row carries the user's previous seq (`prevAll`), so a reader sees from the rows alone
 *    whether the cache holds every entry of a range: any key may vanish on its own (its TTL, an
 *    eviction), and a completeness marker kept in another key would outlive what it describes.
 *
 * A batch goes to Redis as one script call per Redis node (APPLY_BATCH_LUA), not one per entry:
 * ioredis spends microseconds of CPU per call and per argument, and Redis per call too. The entries
 * keep their per-user keys (one hash tag per user, so a user's keys never move when shards split);
 * on a Redis Cluster the batch is split by the node that serves each user's slot, and the script
 * may touch many slots of its node (`allow-cross-slot-keys`). Arguments: one key that routes the
 * call, and three strings for the whole batch (shared fields, the entries' headers, their bodies).
 */
import clusterKeySlot from "cluster-key-slot";
import { Cluster } from "ioredis";
import { cacheStreamId, parseRoutes, seqKey, type MailboxSeq, type RedisKeys } from "../protocol/index.js";
import { scripted, type RedisClient } from "../protocol/io/index.js";


/** What every entry of a batch shares: its shard and log, and the settings. */
export interface BatchShared {
  /** The shard whose log holds the entries (a moved user's cache mixes parent and child rows). */
  shard: number;
  log: string;
  dedupTtlS: number;
  hotCacheMaxLen: number;
  hotCacheTtlS: number;
  watermarkTtlS: number;
}

export interface BatchEntry {
  user: string;
  dispatch: string;
  lane: string;
  /** Stream offset in the shard's current log. */
  offset: number;
  seq: MailboxSeq;
  /** The entry as stored in the shard stream; the hot cache keeps it as it is. */
  body: Uint8Array;
}

/**
 * `first`: false for a duplicate (not pushed). `prev`/`prevAll`: the previous seq of the lane and of
 * the user over all lanes (20-digit), each null when unknown. `routes`: the gateways that hold the
 * user's sessions (empty: none), undefined when Redis had no routes for the user (the push then
 * goes to every gateway).
 */
export interface ApplyEntryResult {
  first: boolean;
  prev: string | null;
  prevAll: string | null;
  routes: readonly string[] | undefined;
}

const NO_ROUTES: string[] = [];

/** Needs a client made with REDIS_SCRIPTS defined (connectRedis does it). Results in entry order. */
export async function applyBatch(redis: RedisClient, keys: RedisKeys, shared: BatchShared, entries: readonly BatchEntry[]): Promise<ApplyEntryResult[]> {
  const results = new Array<ApplyEntryResult>(entries.length);
  const [k1, k2] = keys.userKeyParts();
  const head = `${k1}|${k2}|${shared.log}|${shared.shard}|${shared.dedupTtlS}|${shared.hotCacheMaxLen}|${shared.hotCacheTtlS}|${shared.watermarkTtlS}`;
  await Promise.all(
    byNode(redis, keys, entries).map(async ({ indexes, route }) => {
      const headers = new Array<string>(indexes.length);
      const bodies = new Array<Uint8Array>(indexes.length);
      for (let j = 0; j < indexes.length; j++) {
        const e = entries[indexes[j]!]!;
        headers[j] = `${e.user}|${e.dispatch}|${e.offset}|${e.lane}|${seqKey(e.seq)}|${cacheStreamId(e.seq)}|${e.body.byteLength}`;
        bodies[j] = e.body;
      }
      const reply = await scripted(redis).jgApplyBatch(route, head, headers.join(";"), Buffer.concat(bodies));
      const rows = reply.split(";");
      if (rows.length !== indexes.length) throw new Error(`apply batch: ${rows.length} results for ${indexes.length} entries`);
      for (let j = 0; j < rows.length; j++) {
        const [first, prev, prevAll, routes] = rows[j]!.split("|");
        results[indexes[j]!] = {
          first: first === "1",
          prev: prev || null,
          prevAll: prevAll || null,
          routes: routes === "?" || routes === undefined ? undefined : routes === "" ? NO_ROUTES : parseRoutes(routes).gateways,
        };
      }
    }),
  );
  return results;
}

/**
 * The entries grouped by the Redis node that holds their user's keys: one group for a single Redis;
 * on a Cluster, by the slot map ioredis keeps (a stale map makes the call fail with MOVED or a
 * cross-slot error; the worker retries the batch and ioredis refreshes the map meanwhile).
 */
function byNode(redis: RedisClient, keys: RedisKeys, entries: readonly BatchEntry[]): { indexes: number[]; route: string }[] {
  if (!(redis instanceof Cluster)) return [{ indexes: entries.map((_, i) => i), route: keys.watermarks(entries[0]!.user) }];
  const groups = new Map<string, { indexes: number[]; route: string }>();
  for (let i = 0; i < entries.length; i++) {
    const wm = keys.watermarks(entries[i]!.user);
    const node = redis.slots[clusterKeySlot(wm)]?.[0] ?? "";
    const g = groups.get(node);
    if (g === undefined) groups.set(node, { indexes: [i], route: wm });
    else g.indexes.push(i);
  }
  return [...groups.values()];
}
