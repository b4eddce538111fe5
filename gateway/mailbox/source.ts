/**
 * Reads a user's mailbox for catch-up, gap fills and PULL, cheapest source first:
 *
 * 1. the user's head in Redis (`_all`, which only the worker writes): no read when nothing is new;
 * 2. the user's hot cache in Redis, as far as its rows prove themselves complete (cache-coverage.ts);
 * 3. the shard stream for the rest: one filtered read for long reads, leader gets (`next`) for a
 *    few entries or to vouch for a break in the cache's rows.
 *
 * Redis is only a cache, and any of its keys may vanish alone: a missing key reads as "unknown, ask
 * the stream", never as "nothing there". Every path is correct after a FLUSHALL, just slower.
 *
 * The decisions only: Redis and the streams are behind gateway/mailbox/ports.ts (MailboxReader wires them
 * to Redis and NATS; test/unit/mailbox-reader.test.ts to fakes).
 */
import {
  decodeCacheRecord,
  decodeStoredEntry,
  deriveSeq,
  parseEntrySubject,
  parseRoutes,
  seqEpoch,
  seqOffset,
  WATERMARK_ALL,
  type CacheRow,
  type Entry,
  type MailboxSeq,
  type ShardState,
} from "../../protocol/index.js";
import type { ShardBounds } from "./auth-decision.js";
import { followChain, type ChainRow } from "./cache-coverage.js";
import { UnavailableError } from "./gather.js";
import type { MailboxCache, MailboxStream, StreamMsg } from "./ports.js";
import type { MailboxSource, ReadOptions, RegistryView, Source, Watermarks } from "../ports.js";
import { firstOffsetAbove } from "./positions.js";

const BOUNDS_CACHE_MS = 1000;
/** How soon a device closed because this gateway's registry view is behind its shard's stream should come back. */
const VIEW_BEHIND_RETRY_MS = 1000;
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

/** The cache's rows as chain rows; an unreadable row ends the list (the cache says nothing past it). */
function chainRows(rows: readonly (CacheRow | undefined)[]): Row[] {
  const out: Row[] = [];
  for (const row of rows) {
    const seq = parseSeq(row?.seq);
    if (row === undefined || seq === undefined || (row.prevAll !== "" && parseSeq(row.prevAll) === undefined) || !/^\d+$/.test(row.shard)) break;
    out.push({ seq, prevAll: row.prevAll === "" ? null : BigInt(row.prevAll), shard: Number(row.shard), row });
  }
  return out;
}

function toEntry(r: Row): Entry {
  return decodeCacheRecord(r.row.seq, r.row.prev, r.row.lane, r.row.entry);
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

/**
 * Stream messages of the user as entries, in order. The prev of each is the previous one of its lane
 * in this read, or the read's start for the first of a lane (the receiver has everything up to there;
 * 0 means nothing before).
 */
class EntryChain {
  private readonly lastInLane = new Map<string, MailboxSeq>();
  constructor(
    private readonly s: ShardState,
    private readonly after: MailboxSeq,
  ) {}

  /** The entry a message stands for, if it is one with seq above `after` (and below `before`). */
  entry(m: StreamMsg, before?: MailboxSeq): Entry | undefined {
    const subj = parseEntrySubject(m.subject);
    const seq = deriveSeq(this.s, this.s.log, m.offset);
    if (subj === undefined || seq === undefined || seq <= this.after || (before !== undefined && seq >= before)) return undefined;
    const body = decodeStoredEntry(m.data);
    const e = { seq, id: body.id, lane: subj.lane, prev: this.lastInLane.get(subj.lane) ?? this.after, ts: body.ts, b: body.b };
    this.lastInLane.set(subj.lane, seq);
    return e;
  }
}

export interface MailboxOptions {
  /** The clock of the bounds cache (default Date.now). */
  now?: () => number;
}

export class CacheFirstMailbox implements MailboxSource {
  private readonly boundsCache = new Map<number, { at: number; bounds: Promise<ShardBounds> }>();
  private readonly streamReads = new Semaphore(STREAM_READS);
  /** Fills in flight, by their arguments. */
  private readonly fills = new Map<string, Promise<Entry[] | "too_many">>();
  private readonly now: () => number;

  constructor(
    private readonly cache: MailboxCache,
    private readonly stream: MailboxStream,
    private readonly registry: Pick<RegistryView, "state" | "sync">,
    private readonly lanes: readonly string[],
    opts: MailboxOptions = {},
  ) {
    this.now = opts.now ?? Date.now;
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

  /** Runs `f` holding one of the STREAM_READS places. */
  private async bounded<T>(f: () => Promise<T>): Promise<T> {
    await this.streamReads.acquire();
    try {
      return await f();
    } finally {
      this.streamReads.release();
    }
  }

  /**
   * Trim watermark (seq of the newest entry retention removed, 0 if none, in today's numbering)
   * and last offset of a shard's stream. Cached for a second unless `fresh`: a reconnect storm must
   * not become a storm of stream info requests.
   */
  bounds(shard: number, opts: { fresh?: boolean } = {}): Promise<ShardBounds> {
    const now = this.now();
    const hit = this.boundsCache.get(shard);
    if (hit !== undefined && now - hit.at < BOUNDS_CACHE_MS && opts.fresh !== true) return hit.bounds;
    const bounds = (async () => {
      const info = await this.stream.state(shard);
      const s = this.sameLog(shard, info.log);
      const first = info.firstOffset;
      const trim = first <= 1 ? 0n : (deriveSeq(s, s.log, first - 1) ?? 0n);
      return { trim, lastOffset: info.lastOffset };
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
    const replies = await this.cache.headsAndRoutes(users);
    if (replies.every((r) => r === null) && users.length > 0) throw new Error("no user's head could be read");
    // a user whose read failed is left out of this check (undefined), not taken as having no head
    return replies.map((v) => {
      if (v === null) return undefined;
      const [all, routes] = v;
      return { head: parseSeq(all), routes: typeof routes === "string" && routes !== "" ? parseRoutes(routes).gateways : [] };
    });
  }

  /**
   * Lane watermarks and the user's head. Redis's when it has the head (`_all`): lanes it lacks are
   * unknown, not empty (the worker re-creates a lost hash with the lanes it writes from then on).
   * Without the head, read from the stream (the last of each lane) and not written back: only the
   * worker writes watermarks, in stream order, so none is ever older than an entry it processed.
   */
  async watermarks(shard: number, user: string): Promise<Watermarks> {
    const h = await this.cache.watermarkHash(user);
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
    const s = this.shard(shard);
    const lanes = new Map<string, MailboxSeq>();
    let head = 0n;
    await Promise.all(
      this.lanes.map(async (lane) => {
        const m = await this.stream.last(shard, user, lane);
        if (m === null) return;
        const seq = deriveSeq(s, s.log, m.offset);
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
    const got = await this.cache.headAndRows(user, after, until, count);
    let head = parseSeq(got.head);
    if (knownHead !== undefined && (head === undefined || knownHead > head)) head = knownHead;
    // A bounded read (a split parent's range a session is leaving, a PULL) must reach `until` in the
    // stream itself: the head counts only what the worker has processed, and an entry appended
    // before the cut but not processed yet would later be pushed as the parent's, which a session
    // on the child ignores (the E2 fault scenario lost one that way). Unbounded, what is not
    // processed yet is pushed to the session later, so the head is far enough.
    if (until === undefined && head !== undefined && head <= after) return "nothing";
    const target = until ?? head ?? NO_BOUND;
    let rows = chainRows(got.rows);
    const cutByCount = got.rows.length === count;
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
    // the get scans the stream from the cursor's offset: bounded like stream reads, so a storm
    // of fresh devices queues here rather than timing out in nats-server
    const m = await this.bounded(() => this.stream.next(shard, user, firstOffsetAbove(s, after)));
    if (m === null) return true;
    const seq = deriveSeq(s, s.log, m.offset);
    return seq !== undefined && seq > until;
  }

  /**
   * Reads the shard stream for the user's subjects, offsets after `after`'s, deriving seqs. Opening
   * the read (the JetStream API calls) runs at most STREAM_READS at a time per gateway, so a
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
    const opened = await this.bounded(async () => {
      const info = await this.stream.state(shard);
      this.sameLog(shard, info.log);
      const startOffset = Math.max(firstOffsetAbove(s, after), info.firstOffset);
      const untilOffset = until === undefined ? info.lastOffset : Math.min(info.lastOffset, Number(seqOffset(until)));
      if (startOffset > untilOffset || limit <= 0) return undefined;
      return { cursor: await this.stream.open(shard, user, startOffset), untilOffset };
    });
    if (opened === undefined) return;
    const { cursor, untilOffset } = opened;
    // The read knows how many of the user's entries lie ahead: read exactly those, so a read never
    // waits for a fetch to expire (and a user with nothing there costs one request).
    let remaining = cursor.pending;
    let sent = 0;
    const chain = new EntryChain(s, after);
    try {
      let done = remaining === 0;
      while (!done && sent < limit) {
        const page: Entry[] = [];
        let got = 0;
        for await (const m of cursor.fetch(Math.min(pageSize, remaining, limit - sent))) {
          got++;
          remaining--;
          if (m.offset > untilOffset) {
            done = true;
            break;
          }
          const e = chain.entry(m);
          if (e !== undefined) {
            page.push(e);
            sent++;
          }
          if (remaining <= 0 || m.left === 0 || m.offset >= untilOffset || sent >= limit) {
            done = true;
            break;
          }
        }
        if (page.length > 0) yield { entries: page, source: "stream" };
        if (got === 0) done = true;
      }
    } finally {
      await cursor.close();
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
      p = this.bounded(() => this.fillNow(shard, user, after, before, max));
      this.fills.set(key, p);
      const done = () => void this.fills.delete(key);
      p.then(done, done);
    }
    return p;
  }

  private async fillNow(shard: number, user: string, after: MailboxSeq, before: MailboxSeq, max: number): Promise<Entry[] | "too_many"> {
    const s = this.shard(shard);
    const out: Entry[] = [];
    const chain = new EntryChain(s, after);
    let offset = firstOffsetAbove(s, after);
    const end = Number(seqOffset(before));
    while (offset < end) {
      const m = await this.stream.next(shard, user, offset);
      if (m === null || m.offset >= end) break;
      const e = chain.entry(m, before);
      if (e !== undefined) {
        out.push(e);
        if (out.length >= max) return "too_many";
      }
      offset = m.offset + 1;
    }
    return out;
  }
}
