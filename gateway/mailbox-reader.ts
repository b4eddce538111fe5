/**
 * Reads a user's mailbox for catch-up, gap fills and PULL, cheapest source first (DESIGN section 9):
 *
 * 1. the user's head in Redis (`_all`, which only the worker writes): no read when nothing is new;
 * 2. the user's hot cache in Redis, as far as its rows prove themselves complete (cache-coverage.ts);
 * 3. the shard stream for the rest: an ephemeral `filter_subject` consumer for long reads, leader
 *    gets (`next_by_subj`) for a few entries or to vouch for a break in the cache's rows.
 *
 * Redis is only a cache, and any of its keys may vanish alone: a missing key reads as "unknown, ask
 * the stream", never as "nothing there". Every path is correct after a FLUSHALL, just slower.
 */
import { randomBytes } from "node:crypto";
import { ClosedConnectionError, NoRespondersError, RequestError, TimeoutError, type NatsConnection } from "@nats-io/transport-node";
import { AckPolicy, DeliverPolicy, JetStreamError, jetstream, jetstreamManager, type JetStreamManager, type MsgRequest } from "@nats-io/jetstream";
import {
  decodeCacheRecord,
  decodeStoredEntry,
  deriveSeq,
  parseEntrySubject,
  seqEpoch,
  seqOffset,
  shardStream,
  userSubjects,
  entrySubject,
  cacheStreamId,
  parseCacheRow,
  readerConsumerName,
  WATERMARK_ALL,
  HASH_FIELDS,
  parseRoutes,
  type CacheRow,
  type Entry,
  type MailboxSeq,
  type RedisKeys,
  type ShardState,
} from "../protocol/index.js";
import { isNotFound, logOfStream, type RedisClient, type RegistryClient } from "../protocol/io/index.js";
import type { ShardBounds } from "./auth-decision.js";
import { followChain, type ChainRow } from "./cache-coverage.js";
import { RETRY_LATER_MS, ShardNotReadyError, UnavailableError } from "./gather.js";
import type { MailboxSource, ReadOptions, Source, Watermarks } from "./ports.js";
import { firstOffsetAbove } from "./positions.js";

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
/** How soon a device closed because this gateway's registry view is behind its shard's stream should come back. */
const VIEW_BEHIND_RETRY_MS = 1000;

/**
 * What a failed stream call of `shard` means to a session: a stream the registry names but that is
 * not there is not ready; NATS request and connection failures (JetStream did not answer, which
 * says nothing of the data) are unavailable; anything else stays as it is.
 */
export function streamCallError(err: unknown, shard: number, inRegistry: boolean): unknown {
  if (isNotFound(err) && inRegistry) return new ShardNotReadyError(shard, { cause: err });
  // "heartbeats missed": a read's consumer went quiet for two heartbeats, as when this process's
  // event loop was too busy to see them (the hot benchmark); the device resumes by cursor
  const missed = err instanceof JetStreamError && err.message === "heartbeats missed";
  if (err instanceof TimeoutError || err instanceof RequestError || err instanceof NoRespondersError || err instanceof ClosedConnectionError || missed) {
    return new UnavailableError(`shard ${shard}'s stream did not answer (${(err as Error).message}); reconnect`, RETRY_LATER_MS, { cause: err });
  }
  return err;
}
/** Stream reads (each a short-lived consumer) at once per gateway. */
const STREAM_READS = 32;
/** Most rows one cache read asks for. */
const CACHE_READ_MAX = 100_000;
/** Leader gets one read may spend vouching for breaks in the cache's rows before it reads the stream. */
const VOUCH_CHECKS = 2;
/** Above every seq: "no bound". */
const NO_BOUND = (1n << 64n) - 1n;

const SEQ_TEXT = /^\d{1,20}$/;

function parseSeq(v: unknown): MailboxSeq | undefined {
  return typeof v === "string" && SEQ_TEXT.test(v) ? BigInt(v) : undefined;
}

type Row = ChainRow & { row: CacheRow };

/** XRANGE's rows as chain rows; an unreadable row ends the list (the cache says nothing past it). */
function chainRows(replies: readonly [Buffer, Buffer[]][]): Row[] {
  const out: Row[] = [];
  for (const [, fields] of replies) {
    const row = parseCacheRow(fields);
    const seq = parseSeq(row?.seq);
    if (row === undefined || seq === undefined || (row.prevAll !== "" && parseSeq(row.prevAll) === undefined) || !/^\d+$/.test(row.shard)) break;
    out.push({ seq, prevAll: row.prevAll === "" ? null : BigInt(row.prevAll), shard: Number(row.shard), row });
  }
  return out;
}

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

function toEntry(r: Row): Entry {
  return decodeCacheRecord(r.row.seq, r.row.prev, r.row.lane, r.row.entry);
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
   * The registry view of the shard, if the stream holds the log that view numbers. Otherwise this
   * gateway has not seen a rebuild or failover yet (the stream is already the new log): offsets read
   * now would get the old log's seqs, which the device's next AUTH refuses (CURSOR_INVALID, a replay
   * of the whole mailbox). The device is sent away briefly instead while the view catches up.
   */
  private sameLog(shard: number, streamLog: string | undefined): ShardState {
    const s = this.shard(shard);
    if (streamLog === undefined || streamLog === s.log) return s;
    return this.viewBehind(shard, `its stream holds log ${streamLog}, not ${s.log}`);
  }

  private viewBehind(shard: number, what: string): never {
    void this.registry.sync().catch(() => undefined);
    throw new UnavailableError(`shard ${shard}: ${what} (a change this gateway's registry view has not seen yet); reconnect`, VIEW_BEHIND_RETRY_MS);
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
      const s = this.sameLog(shard, logOfStream(info));
      const trim = first <= 1 ? 0n : (deriveSeq(s, s.log, first - 1) ?? 0n);
      return { trim, lastOffset: info.state.last_seq };
    })();
    this.boundsCache.set(shard, { at: now, bounds });
    bounds.catch(() => this.boundsCache.delete(shard));
    return bounds;
  }

  /**
   * The users' heads as Redis has them (`_all`; undefined where it has none) and their routes, in
   * one round trip per Redis node, never the stream. The gateway's tail check asks for every live
   * session's user this way.
   */
  async cachedHeads(users: readonly string[]): Promise<({ head: MailboxSeq | undefined; routes: string[] } | undefined)[]> {
    // one command per user, auto-pipelined: one round trip per Redis node. An explicit pipeline of
    // keys in many slots is refused by a Redis Cluster ("same slots allocation group"), and the tail
    // check read nothing there
    const replies = await Promise.all(users.map((u) => this.redis.hmget(this.keys.watermarks(u), WATERMARK_ALL, HASH_FIELDS.routes).catch(() => null)));
    if (replies.every((r) => r === null) && users.length > 0) throw new Error("no user's head could be read");
    // a user whose read failed is left out of this check (undefined), not taken as having no head
    return replies.map((v) => {
      if (v === null) return undefined;
      const [all, routes] = v;
      return { head: typeof all === "string" && SEQ_TEXT.test(all) ? BigInt(all) : undefined, routes: routes ? parseRoutes(routes).gateways : [] };
    });
  }

  /**
   * Lane watermarks and the user's head. Redis's when it has the head (`_all`): lanes it lacks are
   * unknown, not empty (the worker re-creates a lost hash with the lanes it writes from then on).
   * Without the head, read from the stream (`last_by_subj` per lane) and not written back: only the
   * worker writes watermarks, in stream order, so none is ever older than an entry it processed.
   */
  async watermarks(shard: number, user: string): Promise<Watermarks> {
    const h = await this.redis.hgetall(this.keys.watermarks(user));
    const all = parseSeq(h[WATERMARK_ALL]);
    if (all === undefined) return this.watermarksFromStream(shard, user);
    const lanes = new Map<string, MailboxSeq>();
    let head = all;
    for (const [k, v] of Object.entries(h)) {
      const seq = parseSeq(v);
      // `_all`, and the fields that are not lanes (HASH_FIELDS: routes, expiry stamps; a `:` no lane has)
      if (k === WATERMARK_ALL || k.includes(":") || seq === undefined) continue;
      lanes.set(k, seq);
      if (seq > head) head = seq;
    }
    return { lanes, head, from: "redis" };
  }

  private async watermarksFromStream(shard: number, user: string): Promise<Watermarks> {
    const jsm = await this.manager();
    const s = this.shard(shard);
    const lanes = new Map<string, MailboxSeq>();
    let head = 0n;
    await Promise.all(
      this.lanes.map(async (lane) => {
        const m = await this.onStream(shard, () => leaderGet(jsm, shardStream(shard), { last_by_subj: entrySubject(shard, user, lane) }));
        if (m === null) return;
        const seq = deriveSeq(s, s.log, m.seq);
        if (seq === undefined) return;
        lanes.set(lane, seq);
        if (seq > head) head = seq;
      }),
    );
    return { lanes, head, from: "stream" };
  }

  /**
   * Entries of `user` in `shard` with seq > `after`, oldest first, in pages: from the hot cache as
   * far as its rows prove complete, the rest from the stream. `until` bounds the range (inclusive);
   * `wm`, when the caller read it, is a head the read must reach.
   */
  async *read(
    shard: number,
    user: string,
    after: MailboxSeq,
    opts: ReadOptions & { pageSize?: number } = {},
  ): AsyncGenerator<{ entries: Entry[]; source: Source }> {
    const limit = opts.limit ?? Number.MAX_SAFE_INTEGER;
    const pageSize = opts.pageSize ?? 256;
    if (limit <= 0) return;
    const cached = await this.readCache(shard, user, after, opts.until, opts.wm?.head, limit);
    if (cached === "nothing") return;
    // the worker writes the cache under its epoch: one this gateway's registry view has not seen
    // yet must not reach a device under a token of the older epoch's log
    const newest = cached.entries[cached.entries.length - 1];
    if (newest !== undefined && seqEpoch(newest.seq) > this.shard(shard).epoch) this.viewBehind(shard, `the hot cache holds epoch ${seqEpoch(newest.seq)}`);
    for (let i = 0; i < cached.entries.length; i += pageSize) yield { entries: cached.entries.slice(i, i + pageSize), source: "cache" };
    if (cached.complete || cached.entries.length >= limit) return;
    yield* this.readStream(shard, user, cached.at, opts.until, limit - cached.entries.length, pageSize);
  }

  /**
   * The part of (after, until] the hot cache proves it holds, with the user's head read before its
   * rows (a row written after the head only makes the cache look longer, never shorter). "nothing"
   * when, unbounded, the head says no entry lies after `after`. A break in the rows (a trimmed or re-created
   * cache, a row written while the hash was gone) is vouched for by a leader get when it costs no
   * more than VOUCH_CHECKS of them; otherwise the stream reads on from where the rows stop.
   */
  private async readCache(
    shard: number,
    user: string,
    after: MailboxSeq,
    until: MailboxSeq | undefined,
    knownHead: MailboxSeq | undefined,
    limit: number,
  ): Promise<{ entries: Entry[]; at: MailboxSeq; complete: boolean } | "nothing"> {
    const count = Math.min(limit, CACHE_READ_MAX);
    const replies = await this.redis
      .pipeline()
      .hget(this.keys.watermarks(user), WATERMARK_ALL)
      .xrangeBuffer(this.keys.hotCache(user), `(${cacheStreamId(after)}`, until === undefined ? "+" : cacheStreamId(until), "COUNT", count)
      .exec();
    const [headReply, rowsReply] = replies ?? [];
    if (headReply?.[0] || rowsReply?.[0]) throw (headReply?.[0] ?? rowsReply?.[0])!;
    let head = parseSeq(headReply?.[1]);
    if (knownHead !== undefined && (head === undefined || knownHead > head)) head = knownHead;
    // A bounded read (a split parent's range a session is leaving, a PULL) must reach `until` in the
    // stream itself: the head counts only what the worker has processed, and an entry appended
    // before the cut but not processed yet would later be pushed as the parent's, which a session
    // on the child ignores (the E2 fault scenario lost one that way). Unbounded, what is not
    // processed yet is pushed to the session later, so the head is far enough.
    if (until === undefined && head !== undefined && head <= after) return "nothing";
    const target = until ?? head ?? NO_BOUND;
    let rows = chainRows((rowsReply?.[1] ?? []) as [Buffer, Buffer[]][]);
    const cutByCount = rows.length === count;
    const kept: Row[] = [];
    let at = after;
    let vouched = false;
    for (let checks = 0; checks <= VOUCH_CHECKS; checks++) {
      const chain = followChain(rows, shard, at, target, vouched);
      kept.push(...chain.kept);
      at = chain.at;
      const stop = chain.stop;
      if (stop.type === "complete") return { entries: kept.map(toEntry), at, complete: true };
      if (checks === VOUCH_CHECKS || (stop.type === "break" && !stop.vouchable) || (stop.type === "rows_end" && cutByCount)) break;
      // one leader get: does the stream hold anything of the user between `at` and the next row (or the target)?
      const nextIndex = stop.type === "break" ? stop.index : undefined;
      const next = nextIndex === undefined ? undefined : rows[nextIndex]!;
      const upTo = next !== undefined && next.seq - 1n < target ? next.seq - 1n : target;
      if (!(await this.nothingBetween(shard, user, at, upTo))) break;
      if (next === undefined || next.seq > target) return { entries: kept.map(toEntry), at: target, complete: true };
      rows = rows.slice(nextIndex);
      vouched = true;
    }
    return { entries: kept.map(toEntry), at, complete: false };
  }

  /** True when the stream has no entry of `user` with seq in (after, until]. */
  private async nothingBetween(shard: number, user: string, after: MailboxSeq, until: MailboxSeq): Promise<boolean> {
    if (until <= after) return true;
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
      this.sameLog(shard, logOfStream(info));
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
    } catch (err) {
      throw streamCallError(err, shard, this.registry.state.shards.has(shard));
    } finally {
      await jsm.consumers.delete(stream, name).catch(() => undefined);
    }
  }

  /**
   * A few entries with seq in (after, before), by leader gets: for gap fills of a live session.
   * Bounded like stream reads: a burst of first entries (every push whose predecessor the worker
   * cannot know is a gap) once sent 10,000 leader gets at once, and JetStream timed many out.
   */
  fill(shard: number, user: string, after: MailboxSeq, before: MailboxSeq, max = 32): Promise<Entry[] | "too_many"> {
    // The sessions of one user here fill the same gap at once when a push finds one (a user's
    // first entry: every device of the user, 50 per user in the hot benchmark): one read for all.
    // Entries are never changed after they are read, so the sessions share the answer.
    const key = `${shard}/${user}/${after}/${before}/${max}`;
    let p = this.fills.get(key);
    if (p === undefined) {
      p = this.fillOnce(shard, user, after, before, max);
      this.fills.set(key, p);
      const done = () => void this.fills.delete(key);
      p.then(done, done);
    }
    return p;
  }

  /** Fills in flight, by their arguments. */
  private readonly fills = new Map<string, Promise<Entry[] | "too_many">>();

  private async fillOnce(shard: number, user: string, after: MailboxSeq, before: MailboxSeq, max: number): Promise<Entry[] | "too_many"> {
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
