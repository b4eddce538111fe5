/**
 * This gateway's routes: for every user with a session here, the gateway's id is in the user's
 * watermark hash (HASH_FIELDS.routes), and workers send that user's live entries here in batches
 * (worker/push-router.ts). The rule that keeps every entry: a session's route is in Redis before
 * the session reads its mailbox. An entry the worker processed before the route was added is in
 * the mailbox by then (and at or below the head the add returns); one processed after is routed here.
 *
 * Redis may lose any of it (docs/operations.md). A registration that failed is retried every
 * second. A user's hash without routes (new, expired, evicted, flushed) makes the worker send the
 * user's next entry to every gateway, and those holding the user register again (`reassert`). The
 * gateway beats every second into a sorted set; a beat that finds the gateway missing from it
 * (Redis was flushed or restarted empty), or that comes after 20 s without one (the workers call a
 * gateway silent after 60 s and drop its routes), registers every route again. The tail check
 * reads each session's routes with its head and registers again where this gateway is missing
 * (`verify`: a failover that lost a write). Each re-registration reads the user's head in the same
 * step, and `onRepaired` sends the sessions whatever they missed below it.
 */
import type { Logger } from "pino";
import { GATEWAY_LIVENESS, type MailboxSeq, type RedisKeys } from "../../protocol/index.js";
import { scripted, type RedisClient, type ScriptedRedis } from "../../protocol/io/index.js";
import type { RoutePort } from "../ports.js";

const RETRY_MS = 1000;
const RETRY_CHUNK = 500;

export class RouteTable implements RoutePort {
  private readonly redis: ScriptedRedis;
  /** Sessions (and AUTHs under way) per user here. */
  private readonly held = new Map<string, number>();
  private readonly adding = new Map<string, Promise<void>>();
  /** Held users whose registration failed: retried every second. */
  private readonly pending = new Set<string>();
  /** Users registering again (one at a time each). */
  private readonly reasserting = new Set<string>();
  /** Users whose stray routes were dropped since the last beat (at most once per beat each). */
  private readonly strays = new Set<string>();
  private lastBeat = -Infinity;
  /** Registrations made so far (each add's token carries it: see parseRoutes). */
  private generation = 0;
  private timers: NodeJS.Timeout[] = [];
  /** A user's route was registered again; `head` is the user's head then (undefined: Redis has none). */
  onRepaired: (user: string, head: MailboxSeq | undefined) => void = () => undefined;

  constructor(
    redis: RedisClient,
    private readonly keys: RedisKeys,
    readonly gatewayId: string,
    /** TTL of a watermark hash this gateway creates (the worker's watermark TTL). */
    private readonly hashTtlS: number,
    private readonly log: Pick<Logger, "warn" | "info">,
  ) {
    this.redis = scripted(redis);
  }

  /** A session of `user` is about to read its mailbox: resolves once the route is in Redis, or failed (then retried). */
  acquire(user: string): Promise<void> {
    const n = this.held.get(user) ?? 0;
    this.held.set(user, n + 1);
    const inFlight = this.adding.get(user);
    if (n > 0) return inFlight ?? Promise.resolve();
    const p = this.register(user).then((r) => {
      if (r === "failed" && this.held.has(user)) this.pending.add(user);
    });
    this.adding.set(user, p);
    void p.finally(() => {
      if (this.adding.get(user) === p) this.adding.delete(user);
    });
    return p;
  }

  /** A session of `user` ended (or never started): the last one takes the route out. */
  release(user: string): void {
    const n = this.held.get(user) ?? 0;
    if (n > 1) return void this.held.set(user, n - 1);
    this.held.delete(user);
    this.pending.delete(user);
    // only registrations made before now: one a later session makes survives this drop, even if
    // the client retries it after that registration (after a failover, a MOVED)
    void this.redis.jgRouteDrop(this.keys.watermarks(user), this.generation, this.gatewayId).catch(() => undefined);
  }

  /** The tail check read the user's routes: a held user whose routes lack this gateway (Redis lost them) registers again. */
  verify(user: string, routes: readonly string[]): void {
    if (!this.held.has(user) || this.adding.has(user) || routes.includes(this.gatewayId)) return;
    this.log.warn({ user }, "this gateway was missing from a user's routes (Redis lost them): registering again");
    this.reassert(user);
  }

  /** A push for `user` reached every gateway (Redis had no routes for it): registers again if held here. */
  reassert(user: string): void {
    if (!this.held.has(user) || this.reasserting.has(user)) return;
    this.reasserting.add(user);
    void this.repair(user).finally(() => this.reasserting.delete(user));
  }

  /** A push for `user` was routed here but no session of it is: take this gateway out of its routes. */
  stray(user: string): void {
    if (this.held.has(user) || this.strays.has(user)) return;
    this.strays.add(user);
    void this.redis.jgRouteDrop(this.keys.watermarks(user), this.generation, this.gatewayId).catch(() => undefined);
  }

  /** The user's head after adding the route; undefined when Redis has no head, "failed" when Redis did not answer. */
  private async register(user: string): Promise<MailboxSeq | undefined | "failed"> {
    try {
      const head = await this.redis.jgRouteAdd(this.keys.watermarks(user), this.gatewayId, ++this.generation, this.hashTtlS);
      return /^\d{1,20}$/.test(head) ? BigInt(head) : undefined;
    } catch {
      return "failed";
    }
  }

  private async repair(user: string): Promise<boolean> {
    const head = await this.register(user);
    if (head === "failed") {
      if (this.held.has(user)) this.pending.add(user);
      return false;
    }
    this.pending.delete(user);
    if (this.held.has(user)) this.onRepaired(user, head);
    return true;
  }

  private beatFailures = 0;

  private async beat(): Promise<void> {
    let added: number;
    try {
      added = await this.redis.jgGatewayBeat(this.keys.gateways(), this.gatewayId);
      this.beatFailures = 0;
    } catch (err) {
      if (this.beatFailures++ % 10 === 0) this.log.warn({ err: (err as Error).message }, "gateway beat failed");
      return;
    }
    const now = performance.now();
    const silentMs = now - this.lastBeat;
    const first = !Number.isFinite(silentMs);
    this.lastBeat = now;
    this.strays.clear();
    const lost = added === 1 && !first;
    if ((lost || (!first && silentMs >= GATEWAY_LIVENESS.reregisterAfterMs)) && this.held.size > 0) {
      this.log.warn({ silentMs: Math.round(silentMs), users: this.held.size, redisLostTheSet: lost }, lost ? "Redis lost this gateway's beat (and so its routes): registering every route again" : "no beat for a while: registering every route again");
      for (const user of this.held.keys()) this.pending.add(user);
      await this.retryPending();
    }
  }

  private retrying = false;

  /** Registers the pending users again, a chunk at a time (one pipeline each); stops at the first chunk Redis refuses. */
  private async retryPending(): Promise<void> {
    if (this.retrying) return;
    this.retrying = true;
    try {
      const users = [...this.pending];
      for (let i = 0; i < users.length; i += RETRY_CHUNK) {
        const done = await Promise.all(users.slice(i, i + RETRY_CHUNK).map((u) => this.repair(u)));
        if (done.includes(false)) return;
      }
    } finally {
      this.retrying = false;
    }
  }

  start(): void {
    void this.beat();
    const beat = setInterval(() => void this.beat(), GATEWAY_LIVENESS.beatEveryMs);
    const retry = setInterval(() => {
      if (this.pending.size > 0) void this.retryPending();
    }, RETRY_MS);
    beat.unref();
    retry.unref();
    this.timers = [beat, retry];
  }

  stop(): void {
    for (const t of this.timers) clearInterval(t);
  }
}
