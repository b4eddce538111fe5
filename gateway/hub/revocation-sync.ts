/**
 * The revocations in Redis (the hash, its version and its change log: protocol/layout.ts) and how
 * a gateway keeps its list (gateway/hub/revocations.ts) in step with them without holding its event loop.
 *
 * - Start: the hash's version, then the whole hash in chunks (HSCAN), a plain parse per field. A
 *   revocation written during the load has a later version: the next sync reads it from the log.
 * - Every JETGATE_REVOCATIONS_SYNC_MS (30 s): the hash's version (one HGET). When it moved on, the
 *   log's entries after the version applied, newest first, until that version: each change carries
 *   the version it made, so a change missing from the log (trimmed, the log lost, or lost and made
 *   again) shows as a gap in the versions.
 * - The whole hash again, in chunks, only on such a gap: any Redis key may vanish alone, and a
 *   missing log reads as "unknown", never as "nothing new".
 * - Expired revocations are forgotten a few thousand at a time, yielding between.
 * NATS stays the fast path (gateway/http/control.ts): this picks up what a gateway missed there.
 */
import { setImmediate as nextTurn } from "node:timers/promises";
import type { Logger } from "pino";
import { REVOCATION_FIELDS, REVOCATION_LOG_MAXLEN, REVOCATION_SWEEP_COUNT, type RedisKeys } from "../../protocol/index.js";
import { scripted, type RedisClient, type ScriptedRedis } from "../../protocol/io/index.js";
import { isMetaField, parseRevocation, readTimes, revocationField, type Revocation, type Revocations } from "./revocations.js";

/** Fields per HSCAN, entries per XREVRANGE. */
const CHUNK = 1000;
/** Expired revocations forgotten per turn of the event loop (bench/revocations.ts times one). */
export const PRUNE_STEP = 2000;
/** How soon a gateway that has not loaded the list yet tries again. */
const RETRY_UNLOADED_MS = 1000;

/** Why the whole hash was read: at start, or the log lacked changes the gateway had not applied. */
export type LoadReason = "start" | "log_gap";

/** The hash's version (REVOCATION_FIELDS.version). */
export interface RevocationVersion {
  epoch: string;
  n: number;
}

export function parseVersion(v: string | null | undefined): RevocationVersion | undefined {
  const m = typeof v === "string" ? /^(\d{1,20}):(\d{1,15})$/.exec(v) : null;
  return m === null ? undefined : { epoch: m[1]!, n: Number(m[2]) };
}

/** One change from the log: the version it made, and the revocation (undefined: it does not parse). */
export interface LogEntry {
  id: string;
  version: RevocationVersion | undefined;
  revocation: Revocation | undefined;
}

/** Takes each revocation of a chunk of the hash: its field (the string the list keeps) and times. */
export type RevocationSink = (field: string, before: number, expires: number) => void;

/** The revocations in Redis: written by the gateway that took the backend's call, read by every gateway. */
export class RevocationStore {
  private readonly redis: ScriptedRedis;

  constructor(
    redis: RedisClient,
    private readonly keys: RedisKeys,
  ) {
    this.redis = scripted(redis);
  }

  /** Records one; resolves with what Redis keeps (a later `before` or expiry already there wins). */
  async write(r: Revocation, now: number): Promise<Revocation> {
    const field = revocationField(r.user, r.device);
    const kept = await this.redis.jgRevoke(this.keys.revocations(), this.keys.revocationLog(), field, r.before, r.expires, now, REVOCATION_LOG_MAXLEN, REVOCATION_SWEEP_COUNT);
    const parsed = parseRevocation(field, kept);
    if (parsed === undefined) throw new Error(`Redis kept a revocation that does not parse: ${kept}`);
    return parsed;
  }

  /** The hash's version; undefined when the hash (or its version) is missing. */
  async version(): Promise<RevocationVersion | undefined> {
    return parseVersion(await this.redis.hget(this.keys.revocations(), REVOCATION_FIELDS.version));
  }

  /** One chunk of the hash from `cursor` ("0": the start), each revocation to `sink`; `next` is "0" after the last. */
  async scan(cursor: string, sink: RevocationSink): Promise<{ next: string; malformed: number }> {
    const [next, flat] = await this.redis.hscan(this.keys.revocations(), cursor, "COUNT", CHUNK);
    let malformed = 0;
    const t = { before: 0, expires: 0 };
    for (let i = 0; i + 1 < flat.length; i += 2) {
      const field = flat[i]!;
      if (isMetaField(field)) continue;
      if (readTimes(field, flat[i + 1]!, t)) sink(field, t.before, t.expires);
      else malformed++;
    }
    return { next, malformed };
  }

  /** A page of the log, newest first, from before entry `olderThan` (undefined: from the end). */
  async logBackwards(olderThan: string | undefined): Promise<LogEntry[]> {
    const page = await this.redis.xrevrange(this.keys.revocationLog(), olderThan === undefined ? "+" : `(${olderThan}`, "-", "COUNT", CHUNK);
    return page.map(([id, fields]) => {
      const get = (name: string) => {
        for (let i = 0; i + 1 < fields.length; i += 2) if (fields[i] === name) return fields[i + 1];
        return undefined;
      };
      const [f, v] = [get("f"), get("v")];
      return { id, version: parseVersion(get("n")), revocation: f === undefined || v === undefined ? undefined : parseRevocation(f, v) };
    });
  }
}

/** What the sync did, for metrics, logs and tests. */
export interface SyncEvents {
  loaded(why: LoadReason, revocations: number): void;
  changes(n: number): void;
  malformed(n: number): void;
  /** The hash is gone from Redis (with every revocation in it): what this gateway holds still applies. */
  hashGone(): void;
}

/** Keeps a gateway's revocations in step with Redis (see the top of this file). */
export class RevocationSync {
  /** The hash's version this gateway has applied every change up to; undefined: none (no hash). */
  private version: RevocationVersion | undefined;
  private running: Promise<void> | undefined;
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly store: Pick<RevocationStore, "version" | "scan" | "logBackwards">,
    private readonly revocations: Revocations,
    private readonly events: SyncEvents,
    private readonly now: () => number = Date.now,
  ) {}

  /** One sync; a call while one runs shares it. Rejects when Redis fails (what is held stays). */
  sync(): Promise<void> {
    this.running ??= this.turn().finally(() => (this.running = undefined));
    return this.running;
  }

  /** Syncs every `periodMs` (every second until the first load succeeded), logging failures. */
  start(periodMs: number, log: Pick<Logger, "warn">): void {
    const next = () => {
      this.timer = setTimeout(() => void run(), this.revocations.loaded ? periodMs : Math.min(periodMs, RETRY_UNLOADED_MS));
      this.timer.unref();
    };
    const run = () =>
      this.sync()
        .catch((err: unknown) => log.warn({ err: (err as Error).message, loaded: this.revocations.loaded }, "cannot read token revocations from Redis (the ones this gateway knows still apply)"))
        .finally(() => this.timer !== undefined && next());
    next();
  }

  stop(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }

  private async turn(): Promise<void> {
    if (!this.revocations.loaded) await this.load("start");
    else if (!(await this.readChanges())) await this.load("log_gap");
    while (this.revocations.prune(this.now(), PRUNE_STEP)) await nextTurn();
  }

  /** Applies the changes after the version applied; false when the log does not hold them all. */
  private async readChanges(): Promise<boolean> {
    const v = await this.store.version();
    if (v === undefined) {
      if (this.version !== undefined) this.events.hashGone();
      this.version = undefined;
      return true;
    }
    const base = this.version?.epoch === v.epoch ? this.version.n : 0;
    if (v.n === base) return true;
    if (v.n < base || v.n - base > REVOCATION_LOG_MAXLEN) return false;
    // newest first: versions v.n (or later: written since the HGET), one less each, down to base + 1
    let expect: number | undefined;
    let top = 0;
    let changes = 0;
    let olderThan: string | undefined;
    for (let more = true; more; ) {
      const page = await this.store.logBackwards(olderThan);
      more = page.length === CHUNK;
      for (const e of page) {
        if (e.version === undefined || e.version.epoch !== v.epoch || e.version.n <= base) {
          more = false;
          break;
        }
        if (expect !== undefined && e.version.n !== expect) return false;
        top ||= e.version.n;
        expect = e.version.n - 1;
        if (e.revocation === undefined) this.events.malformed(1);
        else this.revocations.add(e.revocation);
        changes++;
      }
      olderThan = page[page.length - 1]?.id;
    }
    if (expect !== base || top < v.n) return false;
    this.version = { epoch: v.epoch, n: top };
    this.events.changes(changes);
    return true;
  }

  /** The whole hash, a chunk per round trip (the event loop runs between them). */
  private async load(why: LoadReason): Promise<void> {
    const version = await this.store.version();
    const list = this.revocations;
    const put: RevocationSink = (field, before, expires) => list.put(field, before, expires);
    let cursor = "0";
    do {
      const chunk = await this.store.scan(cursor, put);
      if (chunk.malformed > 0) this.events.malformed(chunk.malformed);
      cursor = chunk.next;
    } while (cursor !== "0");
    this.version = version;
    this.revocations.loaded = true;
    this.events.loaded(why, this.revocations.size);
  }
}
