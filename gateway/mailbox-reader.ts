/**
 * Reads a user's mailbox for catch-up, gap fills and PULL, cheapest source first (DESIGN section 9):
 *
 * 1. lane watermarks in Redis: whether anything is there at all (no read when nothing is);
 * 2. the user's hot cache in Redis, when its completeness marker `_ca` is at or below the start;
 * 3. the shard stream: an ephemeral `filter_subject` consumer for long reads, direct get
 *    (`next_by_subj`) for a few entries.
 *
 * Redis is only a cache: every path is correct after a FLUSHALL, just slower (watermarks are then
 * rebuilt from the stream with `last_by_subj`).
 */
import { randomBytes } from "node:crypto";
import { ClosedConnectionError, NoRespondersError, RequestError, TimeoutError, type NatsConnection } from "@nats-io/transport-node";
import { AckPolicy, DeliverPolicy, jetstream, jetstreamManager, type JetStreamManager, type MsgRequest } from "@nats-io/jetstream";
import {
  decodeCacheRecord,
  decodeStoredEntry,
  deriveSeq,
  parseEntrySubject,
  seqKey,
  seqOffset,
  shardStream,
  userSubjects,
  entrySubject,
  isNotFound,
  cacheStreamId,
  parseCacheRow,
  readerConsumerName,
  CACHE_COMPLETE_AFTER,
  WATERMARK_ALL,
  type Entry,
  type MailboxSeq,
  type RedisClient,
  type RedisKeys,
  type RegistryClient,
  type ShardState,
} from "../protocol/index.js";
import type { ShardBounds } from "./auth-decision.js";
import { ShardNotReadyError, UnavailableError } from "./gather.js";
import type { MailboxSource, ReadOptions, Source, Watermarks } from "./ports.js";
import { firstOffsetAbove } from "./positions.js";

type RaiseClient = RedisClient & { jgRaiseWatermark(key: string, lane: string, seq20: string, ttl: number): Promise<number> };

/**
 * One message by sequence or subject from the stream's leader (JetStream's STREAM.MSG.GET; null when
 * there is none). Never a direct get: any replica answers those, and a replica that is catching up
 * (a restarted node of an R3 cluster) says "nothing there" for an entry the leader acknowledged. A
 * gap fill believed it and sent the next entry over the gap (found by the NATS R3 fault scenario).
 */
function leaderGet(jsm: JetStreamManager, stream: string, query: { last_by_subj: string } | { seq: number; next_by_subj: string }) {
  // nats.js types STREAM.MSG.GET without next_by_subj, which nats-server has served since 2.9
  return jsm.streams.getMessage(stream, query as MsgRequest);
}

const BOUNDS_CACHE_MS = 1000;
/** How soon a device closed because its stream did not answer should come back. */
const NOT_ANSWERED_RETRY_MS = 2000;

/**
 * What a failed stream call of `shard` means to a session: a stream the registry names but that is
 * not there is not ready; NATS request and connection failures (JetStream did not answer, which
 * says nothing of the data) are unavailable; anything else stays as it is.
 */
export function streamCallError(err: unknown, shard: number, inRegistry: boolean): unknown {
  if (isNotFound(err) && inRegistry) return new ShardNotReadyError(shard, { cause: err });
  if (err instanceof TimeoutError || err instanceof RequestError || err instanceof NoRespondersError || err instanceof ClosedConnectionError) {
    return new UnavailableError(`shard ${shard}'s stream did not answer (${err.message}); reconnect`, NOT_ANSWERED_RETRY_MS, { cause: err });
  }
  return err;
}
/** Stream reads (each a short-lived consumer) at once per gateway. */
const STREAM_READS = 32;

/** A counting semaphore: waiters are served in arrival order. */
class Semaphore {
  private readonly waiters: (() => void)[] = [];
  constructor(private free: number) {}
  async acquire(): Promise<void> {
    if (this.free > 0) {
      this.free--;
      return;
    }
    await new Promise<void>((r) => this.waiters.push(r));
  }
  release(): void {
    const next = this.waiters.shift();
    if (next) next();
    else this.free++;
  }
}

export class MailboxReader implements MailboxSource {
  private jsm: JetStreamManager | undefined;
  private readonly boundsCache = new Map<number, { at: number; bounds: Promise<ShardBounds> }>();
  private readonly streamReads = new Semaphore(STREAM_READS);
  private readonly js;

  constructor(
    private readonly nc: NatsConnection,
    private readonly redis: RedisClient,
    private readonly keys: RedisKeys,
    private readonly registry: RegistryClient,
    private readonly lanes: readonly string[],
    private readonly watermarkTtlS: number,
  ) {
    this.js = jetstream(nc);
  }

  private async manager(): Promise<JetStreamManager> {
    this.jsm ??= await jetstreamManager(this.nc);
    return this.jsm;
  }

  private shard(shard: number): ShardState {
    const s = this.registry.state.shards.get(shard);
    if (s === undefined) throw new Error(`shard ${shard} is not in the registry`);
    return s;
  }

  /**
   * A stream call for a shard the registry names: a stream that is not there (yet) is "not ready",
   * and a JetStream that does not answer (a burst of requests timed out, a leader moving, the
   * connection down) is "unavailable": neither is an internal error. A split records its child
   * before some process sees its stream; a storm of first entries once timed 217 gap fills out.
   */
  private async onStream<T>(shard: number, call: () => Promise<T>): Promise<T> {
    try {
      return await call();
    } catch (err) {
      throw streamCallError(err, shard, this.registry.state.shards.has(shard));
    }
  }

  /**
   * Trim watermark (seq of the newest entry retention removed, 0 if none, in today's numbering)
   * and last offset of a shard's stream. Cached for a second unless `fresh`: a reconnect storm must
   * not become a storm of stream info requests.
   */
  bounds(shard: number, opts: { fresh?: boolean } = {}): Promise<ShardBounds> {
    const now = Date.now();
    const hit = this.boundsCache.get(shard);
    if (hit !== undefined && now - hit.at < BOUNDS_CACHE_MS && opts.fresh !== true) return hit.bounds;
    const bounds = (async () => {
      const info = await this.onStream(shard, async () => (await this.manager()).streams.info(shardStream(shard)));
      const first = info.state.first_seq;
      const s = this.shard(shard);
      const trim = first <= 1 ? 0n : (deriveSeq(s, s.log, first - 1) ?? 0n);
      return { trim, lastOffset: info.state.last_seq };
    })();
    this.boundsCache.set(shard, { at: now, bounds });
    bounds.catch(() => this.boundsCache.delete(shard));
    return bounds;
  }

  /**
   * The users' heads as Redis has them (`_all`; undefined where it has none): one pipeline for them
   * all, never the stream. The gateway's tail check asks for every live session's user this way.
   */
  async cachedHeads(users: readonly string[]): Promise<(MailboxSeq | undefined)[]> {
    if (users.length === 0) return [];
    const p = this.redis.pipeline();
    for (const u of users) p.hget(this.keys.watermarks(u), WATERMARK_ALL);
    const replies = (await p.exec()) ?? [];
    return users.map((_, i) => {
      const [err, v] = replies[i] ?? [null, null];
      return err === null && typeof v === "string" && /^\d{1,20}$/.test(v) ? BigInt(v) : undefined;
    });
  }

  /** Lane watermarks; rebuilt from the stream (and written back) when Redis has none. */
  async watermarks(shard: number, user: string): Promise<Watermarks> {
    const h = await this.redis.hgetall(this.keys.watermarks(user));
    const lanes = new Map<string, MailboxSeq>();
    let head = 0n;
    let ca: MailboxSeq | undefined;
    let any = false;
    for (const [k, v] of Object.entries(h)) {
      if (!/^\d{1,20}$/.test(v)) continue;
      if (k === WATERMARK_ALL) head = BigInt(v) > head ? BigInt(v) : head;
      else if (k === CACHE_COMPLETE_AFTER) ca = BigInt(v);
      else {
        lanes.set(k, BigInt(v));
        any = true;
      }
    }
    if (any) {
      for (const v of lanes.values()) if (v > head) head = v;
      return { lanes, head, cacheCompleteAfter: ca, from: "redis" };
    }
    return this.watermarksFromStream(shard, user);
  }

  private async watermarksFromStream(shard: number, user: string): Promise<Watermarks> {
    const jsm = await this.manager();
    const s = this.shard(shard);
    const lanes = new Map<string, MailboxSeq>();
    let head = 0n;
    await Promise.all(
      this.lanes.map(async (lane) => {
        const m = await leaderGet(jsm, shardStream(shard), { last_by_subj: entrySubject(shard, user, lane) });
        if (m === null) return;
        const seq = deriveSeq(s, s.log, m.seq);
        if (seq === undefined) return;
        lanes.set(lane, seq);
        if (seq > head) head = seq;
      }),
    );
    const r = this.redis as RaiseClient;
    await Promise.all([...lanes].map(([lane, seq]) => r.jgRaiseWatermark(this.keys.watermarks(user), lane, seqKey(seq), this.watermarkTtlS))).catch(() => undefined);
    return { lanes, head, cacheCompleteAfter: undefined, from: "stream" };
  }

  /**
   * Entries of `user` in `shard` with seq > `after`, oldest first, in pages. From the hot cache when
   * `wm` says it covers the range, else from the stream. `until` bounds the range (inclusive).
   */
  async *read(
    shard: number,
    user: string,
    after: MailboxSeq,
    opts: ReadOptions & { pageSize?: number } = {},
  ): AsyncGenerator<{ entries: Entry[]; source: Source }> {
    const limit = opts.limit ?? Number.MAX_SAFE_INTEGER;
    const ca = opts.wm?.cacheCompleteAfter;
    // The cache starts after the cursor (a device with nothing yet, or a cache begun after a flush):
    // one direct get says whether the stream holds anything of the user in between. Without it, a
    // reconnect storm of such devices is a storm of stream consumers.
    const covered = ca !== undefined && opts.wm?.from === "redis" && (ca <= after || (await this.nothingBetween(shard, user, after, ca)));
    if (covered) {
      const got = await this.readCache(shard, user, after, ca > after ? ca : after, opts.until, limit);
      if (got !== undefined) {
        for (let i = 0; i < got.length; i += opts.pageSize ?? 256) yield { entries: got.slice(i, i + (opts.pageSize ?? 256)), source: "cache" };
        return;
      }
    }
    yield* this.readStream(shard, user, after, opts.until, limit, opts.pageSize ?? 256);
  }

  /** True when the stream has no entry of `user` with seq in (after, until]. */
  private async nothingBetween(shard: number, user: string, after: MailboxSeq, until: MailboxSeq): Promise<boolean> {
    const s = this.shard(shard);
    const jsm = await this.manager();
    // next_by_subj scans the stream from the cursor's offset: bounded like stream reads, so a storm
    // of fresh devices queues here rather than timing out in nats-server
    await this.streamReads.acquire();
    const m = await this.onStream(shard, () => leaderGet(jsm, shardStream(shard), { seq: firstOffsetAbove(s, after), next_by_subj: userSubjects(shard, user) })).finally(() => this.streamReads.release());
    if (m === null) return true;
    const seq = deriveSeq(s, s.log, m.seq);
    return seq !== undefined && seq > until;
  }

  /**
   * The cached entries after `after`, or undefined when the cache turned out not to cover it. A
   * row of another shard (a moved user's cache holds parent and child rows, whose seqs interleave
   * and whose XADDs may have failed behind each other) means the cache cannot say: the stream can.
   */
  private async readCache(shard: number, user: string, after: MailboxSeq, verified: MailboxSeq, until: MailboxSeq | undefined, limit: number): Promise<Entry[] | undefined> {
    const start = `(${cacheStreamId(after)}`;
    const end = until === undefined ? "+" : cacheStreamId(until);
    const rows = await this.redis.xrangeBuffer(this.keys.hotCache(user), start, end, "COUNT", Math.min(limit, 100_000));
    // The cache may have been trimmed or flushed between reading `_ca` and here: check it again
    // (`verified`: the point up to which the stream was seen to hold nothing the cache lacks).
    const ca = await this.redis.hget(this.keys.watermarks(user), CACHE_COMPLETE_AFTER);
    if (ca === null || BigInt(ca) > verified) return undefined;
    const out: Entry[] = [];
    for (const [, f] of rows) {
      const row = parseCacheRow(f);
      if (row === undefined || row.shard !== String(shard)) return undefined;
      out.push(decodeCacheRecord(row.seq, row.prev, row.lane, row.entry));
    }
    return out;
  }

  /**
   * Reads the shard stream for the user's subjects, offsets after `after`'s, deriving seqs. The
   * consumer set-up (the JetStream API calls) runs at most STREAM_READS at a time per gateway, so a
   * reconnect storm queues here instead of timing out in the API (the storm benchmark found that);
   * the reading itself is not limited, so a slow device never holds up others.
   */
  private async *readStream(
    shard: number,
    user: string,
    after: MailboxSeq,
    until: MailboxSeq | undefined,
    limit: number,
    pageSize: number,
  ): AsyncGenerator<{ entries: Entry[]; source: Source }> {
    const s = this.shard(shard);
    const jsm = await this.manager();
    const stream = shardStream(shard);
    const name = readerConsumerName(randomBytes(6).toString("hex"));
    await this.streamReads.acquire();
    let created;
    let consumer;
    let untilOffset;
    try {
      const info = await this.onStream(shard, () => jsm.streams.info(stream));
      const last = info.state.last_seq;
      const startOffset = Math.max(firstOffsetAbove(s, after), info.state.first_seq);
      untilOffset = until === undefined ? last : Math.min(last, Number(seqOffset(until)));
      if (startOffset > untilOffset || limit <= 0) return;
      created = await this.onStream(shard, () => jsm.consumers.add(stream, {
        name,
        filter_subject: userSubjects(shard, user),
        deliver_policy: DeliverPolicy.StartSequence,
        opt_start_seq: startOffset,
        ack_policy: AckPolicy.None,
        mem_storage: true,
        inactive_threshold: 30_000_000_000,
      }));
      consumer = await this.onStream(shard, () => this.js.consumers.get(stream, name));
    } catch (err) {
      if (created !== undefined) await jsm.consumers.delete(stream, name).catch(() => undefined);
      throw err;
    } finally {
      this.streamReads.release();
    }
    // The consumer knows how many of the user's entries lie ahead: read exactly those, so a read
    // never waits for a fetch to expire (and a user with nothing there costs one request).
    let remaining = created.num_pending;
    let sent = 0;
    // prev of a stream-read entry: the previous one of its lane in this read, or the read's start
    // for the first of a lane (the receiver has everything up to there; 0 means nothing before).
    const lastInLane = new Map<string, MailboxSeq>();
    try {
      let done = remaining === 0;
      while (!done && sent < limit) {
        const page: Entry[] = [];
        const batch = await consumer.fetch({ max_messages: Math.min(pageSize, remaining, limit - sent), expires: 5000 });
        let got = 0;
        for await (const m of batch) {
          got++;
          remaining--;
          if (m.seq > untilOffset) {
            done = true;
            break;
          }
          const subj = parseEntrySubject(m.subject);
          const seq = deriveSeq(s, s.log, m.seq);
          if (subj !== undefined && seq !== undefined && seq > after) {
            const body = decodeStoredEntry(m.data);
            page.push({ seq, id: body.id, lane: subj.lane, prev: lastInLane.get(subj.lane) ?? after, ts: body.ts, b: body.b });
            lastInLane.set(subj.lane, seq);
            sent++;
          }
          if (remaining <= 0 || m.info.pending === 0 || m.seq >= untilOffset || sent >= limit) {
            done = true;
            break;
          }
        }
        if (page.length > 0) yield { entries: page, source: "stream" };
        if (got === 0) done = true;
      }
    } finally {
      await jsm.consumers.delete(stream, name).catch(() => undefined);
    }
  }

  /**
   * A few entries with seq in (after, before), by leader gets: for gap fills of a live session.
   * Bounded like stream reads: a burst of first entries (every push whose predecessor the worker
   * cannot know is a gap) once sent 10,000 leader gets at once, and JetStream timed many out.
   */
  async fill(shard: number, user: string, after: MailboxSeq, before: MailboxSeq, max = 32): Promise<Entry[] | "too_many"> {
    await this.streamReads.acquire();
    try {
      return await this.fillNow(shard, user, after, before, max);
    } finally {
      this.streamReads.release();
    }
  }

  private async fillNow(shard: number, user: string, after: MailboxSeq, before: MailboxSeq, max: number): Promise<Entry[] | "too_many"> {
    const s = this.shard(shard);
    const jsm = await this.manager();
    const stream = shardStream(shard);
    const out: Entry[] = [];
    const lastInLane = new Map<string, MailboxSeq>();
    let offset = firstOffsetAbove(s, after);
    const end = Number(seqOffset(before));
    while (offset < end) {
      const m = await this.onStream(shard, () => leaderGet(jsm, stream, { seq: offset, next_by_subj: userSubjects(shard, user) }));
      if (m === null || m.seq >= end) break;
      const subj = parseEntrySubject(m.subject);
      const seq = deriveSeq(s, s.log, m.seq);
      if (subj !== undefined && seq !== undefined && seq > after && seq < before) {
        const body = decodeStoredEntry(m.data);
        out.push({ seq, id: body.id, lane: subj.lane, prev: lastInLane.get(subj.lane) ?? after, ts: body.ts, b: body.b });
        lastInLane.set(subj.lane, seq);
        if (out.length >= max) return "too_many";
      }
      offset = m.seq + 1;
    }
    return out;
  }
}
