/**
 * Token revocations: a backend says "tokens of this user (or of this device) issued before time T
 * are no longer good" (POST /v1/users/{user}/revoke). From then on every gateway refuses them at
 * AUTH and REFRESH, and ends the live sessions that hold one.
 *
 * Where the state lives: one Redis hash (RedisKeys.revocations; a field per user or device, kept
 * until no token it covers can be accepted: revocationExpiry) and its change log. Each gateway
 * holds all of it in memory: loaded at start, told of each new revocation over NATS, and reading
 * the change log every 30 s for one it missed (gateway/revocation-sync.ts). So the checks cost no
 * Redis round trip, and a gateway that loses Redis keeps refusing every revoked token it knows
 * (fail closed for revoked users). A gateway that has never loaded the list refuses every AUTH
 * (UNAVAILABLE) until it has. This file is the pure part: times, the hash's format, the list.
 *
 * Times: `issued_before` is in seconds, as a token's `iat`; a token is covered when its `iat` is
 * below it. A token without `iat` cannot be shown to be newer, so a user with a revocation has it
 * refused.
 */
import { z } from "zod";
import { MAX_ID_LENGTH, idSchema } from "../protocol/index.js";
import { ExpiryQueue } from "./expiry-queue.js";
import { CLOCK_TOLERANCE_S } from "./jwt.js";

const MAX_BEFORE_S = 2 ** 40;
const MAX_EXPIRES_MS = 2 ** 50;

export const RevocationSchema = z.object({
  user: idSchema("user"),
  device: idSchema("device").optional(),
  /** Tokens whose `iat` is below this (unix seconds) are refused. */
  before: z.number().int().min(0).max(MAX_BEFORE_S),
  /** When the revocation can be forgotten (unix ms): no token it covers can be accepted (revocationExpiry). */
  expires: z.number().int().min(0).max(MAX_EXPIRES_MS),
});
export type Revocation = z.output<typeof RevocationSchema>;

/**
 * `issued_before` of a revoke call that names none (unix s): the second after the call's, so a
 * token minted earlier in the same second (`iat` is whole seconds) is covered too. A token the
 * backend mints later in that second is refused as well, until the answer's `issued_before`.
 */
export function defaultIssuedBefore(nowMs: number): number {
  return Math.floor(nowMs / 1000) + 1;
}

/**
 * When a revocation made at `nowMs` can be forgotten (unix ms): once the verifier (gateway/jwt.ts)
 * can accept no token it covers. A covered token has `iat` < `before`, so its `exp` is at most
 * `before` + the maximum lifetime + the clock tolerance, and jose takes it until the tolerance
 * after `exp`. One without `iat` is bounded only from when it is shown: one shown at the call lives
 * as long from `nowMs`. (A token without `iat` whose `exp` is further out passes the lifetime check
 * later, once within it of `exp`: no revocation covers it past its expiry; docs/server-api.md.)
 */
export function revocationExpiry(before: number, nowMs: number, maxLifetimeS: number): number {
  return Math.max(before * 1000, nowMs) + (maxLifetimeS + 2 * CLOCK_TOLERANCE_S) * 1000;
}

/**
 * How far ahead of the call a backend's `issued_before` may be (s). A later call never lowers it,
 * so a value far ahead would refuse every new token of the user until then.
 */
export const MAX_ISSUED_BEFORE_AHEAD_S = 60;

/** Why a backend's `issued_before` is refused at `nowMs`, or undefined when it is taken. */
export function issuedBeforeProblem(value: number, nowMs: number): string | undefined {
  const ahead = value - nowMs / 1000;
  if (ahead <= MAX_ISSUED_BEFORE_AHEAD_S) return undefined;
  // a time in ms is 1000 times a time in s: after 1973 that is above 1e11 s, the year 5138
  const ms = value >= 1e11 ? " (it looks like milliseconds: issued_before is in unix seconds)" : "";
  return `issued_before: ${value} is ${Math.round(ahead)} s ahead${ms}; at most ${MAX_ISSUED_BEFORE_AHEAD_S} s ahead is taken, since a later call cannot lower it`;
}

/** The Redis field of a revocation: `u:<user>` or `d:<user>:<device>` (ids never hold a colon). */
export function revocationField(user: string, device?: string): string {
  return device === undefined ? `u:${user}` : `d:${user}:${device}`;
}

const ID = `[A-Za-z0-9_-]{1,${MAX_ID_LENGTH}}`;
const FIELD = new RegExp(`^(?:u:(${ID})|d:(${ID}):(${ID}))$`);
const VALUE = /^(\d{1,13})\/(\d{1,16})$/;

/**
 * The times of one field of the hash, or undefined when field or value do not parse. Plain checks,
 * no schema (a load runs this for every revocation; the bounds are RevocationSchema's), and the
 * list keeps the field string it was given, so nothing is built from the ids.
 */
export function revocationTimes(field: string, value: string): { before: number; expires: number } | undefined {
  const v = VALUE.exec(value);
  if (v === null || !FIELD.test(field)) return undefined;
  const before = Number(v[1]);
  const expires = Number(v[2]);
  return before > MAX_BEFORE_S || expires > MAX_EXPIRES_MS ? undefined : { before, expires };
}

/** One field of the hash (or of a change log entry) and its value as a revocation, or undefined when they do not parse. */
export function parseRevocation(field: string, value: string): Revocation | undefined {
  const t = revocationTimes(field, value);
  const f = t === undefined ? null : FIELD.exec(field);
  if (f === null || t === undefined) return undefined;
  return f[1] !== undefined ? { user: f[1], ...t } : { user: f[2]!, device: f[3]!, ...t };
}

/** A field of the hash that holds no revocation (its version, the sweep's cursor): skipped, not counted as malformed. */
export function isMetaField(field: string): boolean {
  return field.startsWith(":");
}

/** Maps the fields are spread over: one Map of a million rehashed its entries in one go (46 ms here) as it grew. */
const SHARDS = 64;

/** FNV-1a of the field, to pick its map. */
function shardOf(field: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < field.length; i++) h = Math.imul(h ^ field.charCodeAt(i), 16777619);
  return h & (SHARDS - 1);
}

/**
 * What a gateway knows of revocations, in memory. Pure: the caller says what time it is.
 * Compact, since a gateway may hold millions: a field's times live in two typed arrays at its
 * slot, so the heap holds one object per revocation (its field string) and a load promotes little
 * for the garbage collector to copy; the fields' slots are spread over SHARDS maps, so none grows
 * (and rehashes) past a small share of them.
 */
export class Revocations {
  private readonly slots = Array.from({ length: SHARDS }, () => new Map<string, number>());
  private count = 0;
  private before = new Float64Array(1024);
  private expires = new Float64Array(1024);
  private readonly free: number[] = [];
  private used = 0;
  /** Fields by expiry: prune takes the expired ones off the front. */
  private readonly due = new ExpiryQueue();
  /** Whether the list was loaded from Redis at least once (until then every AUTH is refused). */
  loaded = false;

  get size(): number {
    return this.count;
  }

  /** Adds one heard over NATS or read from the change log (see `put`). */
  add(r: Revocation): void {
    this.put(revocationField(r.user, r.device), r.before, r.expires);
  }

  /**
   * Adds the revocation of a hash field (`revocationField`), keeping the later `before` and the
   * later expiry of two for one field: a load merges, never replaces (one heard over NATS may be newer).
   */
  put(field: string, before: number, expires: number): void {
    const slotOf = this.slots[shardOf(field)]!;
    let slot = slotOf.get(field);
    if (slot === undefined) {
      slot = this.free.pop() ?? this.grow();
      slotOf.set(field, slot);
      this.count++;
      this.before[slot] = before;
      this.expires[slot] = expires;
      this.due.push(expires, field);
      return;
    }
    if (before > this.before[slot]!) this.before[slot] = before;
    if (expires > this.expires[slot]!) {
      this.expires[slot] = expires;
      this.due.push(expires, field);
    }
  }

  private grow(): number {
    if (this.used === this.before.length) {
      const [b, e] = [new Float64Array(this.used * 2), new Float64Array(this.used * 2)];
      b.set(this.before);
      e.set(this.expires);
      [this.before, this.expires] = [b, e];
    }
    return this.used++;
  }

  /**
   * Forgets up to `max` revocations expired at `now` (ms); true when more are due (the caller
   * yields to the event loop and calls again).
   */
  prune(now: number, max = Infinity): boolean {
    for (let n = 0; n < max; n++) {
      const at = this.due.peek();
      if (at === undefined || at > now) return false;
      const field = this.due.pop()!;
      const slotOf = this.slots[shardOf(field)]!;
      const slot = slotOf.get(field);
      // an entry left behind by a later expiry of the same field is skipped
      if (slot !== undefined && this.expires[slot] === at) {
        slotOf.delete(field);
        this.free.push(slot);
        this.count--;
      }
    }
    return (this.due.peek() ?? Infinity) <= now;
  }

  /**
   * Whether a token of `user`, used by `device`, issued at `iat` (unix s; undefined when it has no
   * iat) is revoked at `now` (ms): by a revocation of the user or of that device.
   */
  revoked(user: string, device: string | undefined, iat: number | undefined, now: number): boolean {
    return this.covers(revocationField(user), iat, now) || (device !== undefined && this.covers(revocationField(user, device), iat, now));
  }

  private covers(field: string, iat: number | undefined, now: number): boolean {
    const slot = this.slots[shardOf(field)]!.get(field);
    return slot !== undefined && this.expires[slot]! > now && (iat === undefined || iat < this.before[slot]!);
  }
}
