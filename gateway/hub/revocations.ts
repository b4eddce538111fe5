/**
 * Token revocations: a backend says "tokens of this user (or of this device) issued before time T
 * are no longer good" (POST /v1/users/{user}/revoke). From then on every gateway refuses them at
 * AUTH and REFRESH, and ends the live sessions that hold one.
 *
 * Where the state lives: one Redis hash (RedisKeys.revocations; a field per user or device, kept
 * until no token it covers can be accepted: revocationExpiry) and its change log. Each gateway
 * holds all of it in memory: loaded at start, told of each new revocation over NATS, and reading
 * the change log every 30 s for one it missed (gateway/hub/revocation-sync.ts). So the checks cost no
 * Redis round trip, and a gateway that loses Redis keeps refusing every revoked token it knows
 * (fail closed for revoked users). A gateway that has never loaded the list refuses every AUTH
 * (UNAVAILABLE) until it has. This file is the pure part: times, the hash's format, the list.
 *
 * Times: `issued_before` is in seconds, as a token's `iat`; a token is covered when its `iat` is
 * below it. A token without `iat` cannot be shown to be newer, so a user with a revocation has it
 * refused.
 */
import { z } from "zod";
import { MAX_ID_LENGTH, idSchema } from "../../protocol/index.js";
import { ExpiryQueue } from "./expiry-queue.js";
import { RevocationTable } from "./revocation-table.js";
import { CLOCK_TOLERANCE_S } from "../jwt.js";

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

/** A revocation's times, as readTimes fills them. */
export interface Times {
  before: number;
  expires: number;
}

/** The decimal number in `s` from `from` to `to` (1 to `max` digits), or -1. */
function digits(s: string, from: number, to: number, max: number): number {
  if (to - from < 1 || to - from > max) return -1;
  let n = 0;
  for (let i = from; i < to; i++) {
    const d = s.charCodeAt(i) - 48;
    if (d < 0 || d > 9) return -1;
    n = n * 10 + d;
  }
  return n;
}

/**
 * Reads one field of the hash and its value (`<before s>/<expires ms>`) into `into`; false when
 * they do not parse. Plain checks, no schema, and no object made (a load runs this for every
 * revocation, and the list keeps the field string it was given): the bounds are RevocationSchema's.
 */
export function readTimes(field: string, value: string, into: Times): boolean {
  const slash = value.indexOf("/");
  const before = digits(value, 0, slash, 13);
  const expires = digits(value, slash + 1, value.length, 16);
  if (before < 0 || expires < 0 || before > MAX_BEFORE_S || expires > MAX_EXPIRES_MS || !FIELD.test(field)) return false;
  into.before = before;
  into.expires = expires;
  return true;
}

/** One field of the hash (or of a change log entry) and its value as a revocation, or undefined when they do not parse. */
export function parseRevocation(field: string, value: string): Revocation | undefined {
  const t = { before: 0, expires: 0 };
  const f = readTimes(field, value, t) ? FIELD.exec(field) : null;
  if (f === null) return undefined;
  return f[1] !== undefined ? { user: f[1], ...t } : { user: f[2]!, device: f[3]!, ...t };
}

/** A field of the hash that holds no revocation (its version, the sweep's cursor): skipped, not counted as malformed. */
export function isMetaField(field: string): boolean {
  return field.startsWith(":");
}

/**
 * What a gateway knows of revocations, in memory (a RevocationTable: no object per revocation).
 * Pure: the caller says what time it is.
 */
export class Revocations {
  private readonly table = new RevocationTable();
  /** Slots by expiry: prune takes the expired ones off the front. */
  private readonly due = new ExpiryQueue();
  /** Whether the list was loaded from Redis at least once (until then every AUTH is refused). */
  loaded = false;

  get size(): number {
    return this.table.size;
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
    const t = this.table;
    const slot = t.slot(field);
    if (before > t.before[slot]!) t.before[slot] = before;
    if (expires > t.expires[slot]!) {
      t.expires[slot] = expires;
      this.due.push(expires, slot);
    }
  }

  /**
   * Forgets up to `max` revocations expired at `now` (ms); true when more are due (the caller
   * yields to the event loop and calls again).
   */
  prune(now: number, max = Infinity): boolean {
    for (let n = 0; n < max; n++) {
      const at = this.due.peek();
      if (at === undefined || at > now) return false;
      const slot = this.due.pop()!;
      // an entry left behind by a later expiry of the slot's field is skipped, and one of a slot
      // freed since (its expiry is NaN); a slot taken again by a field whose expiry is this one: due as well
      if (this.table.expires[slot] === at) this.table.remove(slot);
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
    const slot = this.table.find(field);
    return slot >= 0 && this.table.expires[slot]! > now && (iat === undefined || iat < this.table.before[slot]!);
  }
}
