/**
 * Token revocations: a backend says "tokens of this user (or of this device) issued before time T
 * are no longer good" (POST /v1/users/{user}/revoke). From then on every gateway refuses them at
 * AUTH and REFRESH, and ends the live sessions that hold one.
 *
 * Where the state lives: one Redis hash (RedisKeys.revocations; a field per user or device, kept
 * for the longest token lifetime, JETGATE_JWT_MAX_LIFETIME_S, after which every token it covers has
 * expired anyway). Each gateway holds all of it in memory: loaded at start and every 30 s, and
 * told of each new revocation over NATS. So the checks cost no Redis round trip, and a gateway
 * that loses Redis keeps refusing every revoked token it knows (fail closed for revoked users). A
 * gateway that has never loaded the list refuses every AUTH (UNAVAILABLE) until it has.
 *
 * Times: `issued_before` is in seconds, as a token's `iat`. A token without `iat` cannot be shown
 * to be newer, so a user with a revocation has it refused.
 */
import { z } from "zod";
import { idSchema, type RedisKeys } from "../protocol/index.js";
import { scripted, type RedisClient, type ScriptedRedis } from "../protocol/io/index.js";

export const RevocationSchema = z.object({
  user: idSchema("user"),
  device: idSchema("device").optional(),
  /** Tokens whose `iat` is below this (unix seconds) are refused. */
  before: z.number().int().min(0).max(2 ** 40),
  /** When the revocation can be forgotten (unix ms): every token it covers has expired. */
  expires: z.number().int().min(0).max(2 ** 50),
});
export type Revocation = z.output<typeof RevocationSchema>;

/** The Redis field of a revocation: `u:<user>` or `d:<user>:<device>` (ids never hold a colon). */
export function revocationField(user: string, device?: string): string {
  return device === undefined ? `u:${user}` : `d:${user}:${device}`;
}

const FIELD = /^(?:u:([^:]+)|d:([^:]+):([^:]+))$/;
const VALUE = /^(\d{1,13})\/(\d{1,16})$/;

/** The hash as read from Redis; fields that do not parse (or are no ids) are skipped. */
export function parseRevocations(hash: Record<string, string>): Revocation[] {
  const out: Revocation[] = [];
  for (const [field, value] of Object.entries(hash)) {
    const f = FIELD.exec(field);
    const v = VALUE.exec(value);
    if (f === null || v === null) continue;
    const r = RevocationSchema.safeParse({ user: f[1] ?? f[2], ...(f[3] !== undefined ? { device: f[3] } : {}), before: Number(v[1]), expires: Number(v[2]) });
    if (r.success) out.push(r.data);
  }
  return out;
}

/** What a gateway knows of revocations, in memory. Pure: the caller says what time it is. */
export class Revocations {
  private readonly byField = new Map<string, { before: number; expires: number }>();
  /** Whether the list was loaded from Redis at least once (until then every AUTH is refused). */
  loaded = false;

  get size(): number {
    return this.byField.size;
  }

  /** Adds one (from a load or from NATS), keeping the later `before` of two for one field. */
  add(r: Revocation): void {
    const field = revocationField(r.user, r.device);
    const had = this.byField.get(field);
    this.byField.set(field, { before: Math.max(r.before, had?.before ?? 0), expires: Math.max(r.expires, had?.expires ?? 0) });
  }

  /** A load from Redis: merged, never replacing (one heard over NATS may be newer than the read). */
  load(list: readonly Revocation[], now: number): void {
    for (const r of list) this.add(r);
    this.prune(now);
    this.loaded = true;
  }

  prune(now: number): void {
    for (const [f, r] of this.byField) if (r.expires <= now) this.byField.delete(f);
  }

  /**
   * Whether a token of `user`, used by `device`, issued at `iat` (unix s; undefined when it has no
   * iat) is revoked at `now` (ms): by a revocation of the user or of that device.
   */
  revoked(user: string, device: string | undefined, iat: number | undefined, now: number): boolean {
    const check = (r: { before: number; expires: number } | undefined) => r !== undefined && r.expires > now && (iat === undefined || iat < r.before);
    return check(this.byField.get(revocationField(user))) || (device !== undefined && check(this.byField.get(revocationField(user, device))));
  }
}

/** The revocations in Redis: written by the gateway that took the backend's call, read by every gateway. */
export class RevocationStore {
  private readonly redis: ScriptedRedis;

  constructor(
    redis: RedisClient,
    private readonly keys: RedisKeys,
  ) {
    this.redis = scripted(redis);
  }

  /** Records one; resolves with what Redis keeps (a later `before` already there wins). */
  async write(r: Revocation, now: number): Promise<Revocation> {
    const kept = await this.redis.jgRevoke(this.keys.revocations(), revocationField(r.user, r.device), String(r.before), String(r.expires), String(now));
    const m = VALUE.exec(kept);
    return m === null ? r : { ...r, before: Number(m[1]), expires: Number(m[2]) };
  }

  async read(): Promise<Revocation[]> {
    return parseRevocations(await this.redis.hgetall(this.keys.revocations()));
  }
}
