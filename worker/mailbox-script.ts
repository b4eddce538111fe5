/**
 * The worker's Redis work for one entry, as one Lua script over one user's keys (one cluster slot):
 *
 * 1. dedup `dispatch_id:user`: the first copy stores its `<log>:<offset>`. The same offset seen again
 *    (redelivery, takeover, a crash between steps) counts as the first copy again, so it is pushed
 *    again: a crash never loses a push. Another offset with the same key is a duplicate: it is not
 *    pushed, but it still is a position in the mailbox (a rebuilt stream re-appends many), so it
 *    goes into the watermarks and the hot cache like any entry; otherwise the cache's promise
 *    "every entry after `_ca` is here" would break and a reader could skip it.
 * 2. lane watermark, upward only; the previous value is returned and becomes the entry's `prev`.
 *    The same for the user over all lanes (`_all`): the push's `pa`, which gateways use to detect a
 *    lost push before sending anything after it. Seqs are 20-digit decimal strings, compared as
 *    strings: Lua numbers are doubles.
 * 3. hot cache: XADD with id `<epoch>-<offset>` (Redis keeps ids increasing, so a zombie's older
 *    epoch cannot write behind newer entries: its XADD fails and is ignored), bounded by MAXLEN and a
 *    TTL. `_ca` in the watermark hash records the seq after which the cache is complete.
 *
 * Batches are sent as concurrent calls that the client auto-pipelines (one round trip per node);
 * never one script over many users, which would cross slots on a cluster.
 *
 * Arguments: the scalar ones travel as one `|`-separated header (every field is an id or a number,
 * none can contain `|`) and the cache body as a second: ioredis spends about 1.5 us of CPU per
 * argument, so 2 arguments instead of 10 is most of the worker's Redis cost (bench/README.md).
 */
import type { RedisClient } from "../protocol/index.js";


export interface ApplyEntryArgs {
  dedupKey: string;
  watermarkKey: string;
  hotCacheKey: string;
  /** `<log>:<offset>` of this copy. */
  token: string;
  dedupTtlS: number;
  lane: string;
  /** 20-digit seq of this entry, and of seq - 1. */
  seq20: string;
  seqMinus1_20: string;
  /** Hot cache stream id `<epoch>-<offset>`. */
  streamId: string;
  /**
   * The shard whose log holds the entry. A moved user's cache holds entries of parent and child
   * (seqs of two logs): a reader takes only rows of the shard it reads.
   */
  shard: number;
  /** The entry body as stored in the shard stream; the hot cache keeps it as it is. */
  body: Uint8Array;
  hotCacheMaxLen: number;
  hotCacheTtlS: number;
  watermarkTtlS: number;
}

/**
 * `first`: false for a duplicate (not pushed). `prev`/`prevAll`: the previous seq of the lane and of
 * the user over all lanes (20-digit), each null when unknown.
 */
export interface ApplyEntryResult {
  first: boolean;
  prev: string | null;
  prevAll: string | null;
}

type ScriptClient = RedisClient & {
  jgApplyEntry(dedup: string, wm: string, hc: string, header: string, body: Buffer): Promise<[number, string | null | undefined, string | null | undefined]>;
};

/** Needs a client made with REDIS_SCRIPTS defined (connectRedis does it). */
export function applyEntry(redis: RedisClient, a: ApplyEntryArgs): Promise<ApplyEntryResult> {
  return (redis as ScriptClient)
    .jgApplyEntry(
      a.dedupKey,
      a.watermarkKey,
      a.hotCacheKey,
      `${a.token}|${a.dedupTtlS}|${a.lane}|${a.seq20}|${a.streamId}|${a.hotCacheMaxLen}|${a.hotCacheTtlS}|${a.watermarkTtlS}|${a.seqMinus1_20}|${a.shard}`,
      Buffer.from(a.body.buffer, a.body.byteOffset, a.body.byteLength),
    )
    .then(([status, prev, prevAll]) => ({ first: status === 1, prev: prev ?? null, prevAll: prevAll ?? null }));
}
