/**
 * The sessions of one gateway, and live fan-out: one core NATS subscription to `push.<user>` per
 * user with sessions here, shared by them. A push is decoded once; one whose epoch is older than
 * the registry's for its shard is dropped (a zombie worker's). Registry changes reach the sessions
 * of the shards they touch.
 */
import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import { CloseCode, decodePush, pushSubject, type MailboxSeq, type RegistryClient, type RegistryState } from "../protocol/index.js";
import type { GatewayMetrics } from "./metrics.js";
import type { HubMember, SessionHub } from "./ports.js";
import { TokenBucket } from "./rate-limit.js";

interface UserEntry {
  sessions: Set<HubMember>;
  sub: Subscription;
  bucket: TokenBucket;
}

export class SessionRegistry<S extends HubMember = HubMember> implements SessionHub {
  private readonly users = new Map<string, UserEntry>();
  private readonly byDevice = new Map<string, HubMember>();
  private readonly byShard = new Map<number, Set<HubMember>>();
  private readonly shardEpochs = new Map<number, string>();
  /** Every open connection, authenticated or not. */
  readonly all = new Set<S>();

  constructor(
    private readonly nc: NatsConnection,
    private readonly registry: RegistryClient,
    private readonly metrics: GatewayMetrics,
    private readonly userRate: number,
    private readonly log: { warn(o: object, msg: string): void },
  ) {
    registry.onChange((s) => this.onRegistry(s));
    for (const [id, s] of registry.state.shards) this.shardEpochs.set(id, `${s.epoch}/${s.log}/${s.range.lo}-${s.range.hi}`);
  }

  /** Connected (opened, maybe not yet authenticated). */
  open(s: HubMember): void {
    this.all.add(s as S);
    this.metrics.connections.set(this.all.size);
  }

  countForUser(user: string): number {
    return this.users.get(user)?.sessions.size ?? 0;
  }

  /** An authenticated session: replaces an older one of the same device here, joins the fan-out. */
  add(s: HubMember): void {
    const key = `${s.user}/${s.device}`;
    const older = this.byDevice.get(key);
    if (older !== undefined && older !== s) {
      if (older.authAt > s.authAt) {
        s.close(CloseCode.REPLACED, "a newer session of this device exists");
        return;
      }
      older.close(CloseCode.REPLACED);
    }
    this.byDevice.set(key, s);
    let u = this.users.get(s.user);
    if (u === undefined) {
      const sub = this.nc.subscribe(pushSubject(s.user), { callback: (err, m) => (err ? undefined : this.onPush(s.user, m.data)) });
      u = { sessions: new Set(), sub, bucket: new TokenBucket(this.userRate, this.userRate, Date.now()) };
      this.users.set(s.user, u);
    }
    u.sessions.add(s);
  }

  /** Tracks the session under its (possibly new) shard for registry changes. */
  watch(s: HubMember): void {
    for (const set of this.byShard.values()) set.delete(s);
    let set = this.byShard.get(s.shard);
    if (set === undefined) this.byShard.set(s.shard, (set = new Set()));
    set.add(s);
  }

  remove(s: HubMember): void {
    this.all.delete(s as S);
    this.metrics.connections.set(this.all.size);
    const key = `${s.user}/${s.device}`;
    if (this.byDevice.get(key) === s) this.byDevice.delete(key);
    this.byShard.get(s.shard)?.delete(s);
    const u = this.users.get(s.user);
    if (u === undefined) return;
    u.sessions.delete(s);
    if (u.sessions.size === 0) {
      u.sub.unsubscribe();
      this.users.delete(s.user);
    }
  }

  /** A kick from another gateway (or this one): close that exact session with 4409. */
  kick(user: string, device: string, session: string): void {
    const s = this.byDevice.get(`${user}/${device}`);
    if (s !== undefined && s.id === session) s.close(CloseCode.REPLACED);
  }

  /** Per-user token bucket over all of the user's sessions here. */
  takeUserToken(user: string, now: number): boolean {
    return this.users.get(user)?.bucket.take(now) ?? true;
  }

  private onPush(user: string, data: Uint8Array): void {
    const u = this.users.get(user);
    if (u === undefined) return;
    let push;
    try {
      push = decodePush(data);
    } catch (err) {
      this.log.warn({ user, err: (err as Error).message }, "unreadable push dropped");
      return;
    }
    const shard = this.registry.state.shards.get(push.shard);
    if (shard !== undefined && push.epoch < shard.epoch) {
      this.metrics.stalePushes.inc();
      return;
    }
    // once per entry here, before the fan-out to this user's devices; ts is the dispatcher's clock
    this.metrics.pushLatency.observe(Math.max(0, Date.now() - push.entry.ts) / 1000);
    for (const s of u.sessions) s.onPush(push);
  }

  private onRegistry(state: RegistryState): void {
    for (const [id, s] of state.shards) {
      const sig = `${s.epoch}/${s.log}/${s.range.lo}-${s.range.hi}`;
      if (this.shardEpochs.get(id) === sig) continue;
      this.shardEpochs.set(id, sig);
      for (const session of this.byShard.get(id) ?? []) session.onShardChange();
    }
  }

  /**
   * Every live session gets a tail check once per `everyS`, spread over the period (0: never): each
   * second, the heads of that second's sessions' users in one call (`heads`: one Redis pipeline),
   * and only a session behind its user's head does more (Session.fillTail). One call per second,
   * not a Redis command, promise and closure per session: on an idle gateway those kept V8 from
   * ever seeing an idle heap to shrink.
   */
  startTailChecks(everyS: number, heads: (users: readonly string[]) => Promise<(MailboxSeq | undefined)[]>): void {
    if (everyS <= 0) return;
    let tick = 0;
    let running = false;
    this.tailTimer = setInterval(() => {
      if (running) return; // a slow Redis must not stack checks up
      tick++;
      const users = new Set<string>();
      let i = 0;
      for (const s of this.all) if (i++ % everyS === tick % everyS && s.tailPosition() !== undefined) users.add(s.user);
      if (users.size === 0) return;
      running = true;
      const list = [...users];
      heads(list)
        .then((hs) => {
          for (let k = 0; k < list.length; k++) {
            const head = hs[k];
            for (const s of this.users.get(list[k]!)?.sessions ?? []) {
              const at = s.tailPosition();
              // no head in Redis (the user's hash vanished) is "unknown": the session asks the stream
              if (at !== undefined && (head === undefined || head > at)) s.fillTail(head);
            }
          }
        })
        .catch((err: unknown) => this.log.warn({ err: (err as Error).message }, "tail check: no heads from Redis this time"))
        .finally(() => (running = false));
    }, 1000);
    this.tailTimer.unref();
  }

  private tailTimer: NodeJS.Timeout | undefined;

  close(): void {
    clearInterval(this.tailTimer);
    for (const u of this.users.values()) u.sub.unsubscribe();
    this.users.clear();
  }
}
