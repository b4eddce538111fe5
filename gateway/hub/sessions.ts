/**
 * The sessions of one gateway, and live fan-out. Pushes come from a push source (NATS: the batches
 * workers route to this gateway, gateway/hub/push-source.ts), a batch at a time; a push whose epoch is
 * older than the registry's for its shard is dropped (a zombie worker's). A user's pushes of one
 * batch reach each of its sessions together (one MSGS frame). Routes (gateway/hub/routes.ts) say where
 * a user's sessions are: a push routed here for a user with no session here takes this gateway out
 * of the user's routes; one that reached every gateway (Redis had no routes for its user) makes
 * this gateway register the user again, as does a tail check that finds this gateway missing.
 * Registry changes reach the sessions of the shards they touch.
 */
import { CloseCode, Disconnect, closeReasons, systemClock, withReason, type Clock, type MailboxSeq, type Push, type RegistryState, type TimerHandle } from "../../protocol/index.js";
import { pushVerdict } from "./push-verdict.js";
import type { GatewayMetrics } from "../metrics.js";
import type { HubMember, PushSource, RegistryFeed, RoutePort, SessionHub } from "../ports.js";
import { TokenBucket } from "../rate-limit.js";

/** How long pushes wait for the registry record of their shard and epoch. */
const HOLD_MS = 10_000;
/** Pushes held per shard at most (a registry a whole 10 s behind a busy shard). */
const MAX_WAITING_PUSHES = 100_000;

/** An older session of a device, replaced here or kicked by another gateway: v1's reason text for 4409. */
const REPLACED_BY_NEWER = withReason(Disconnect.REPLACED, closeReasons[CloseCode.REPLACED]);

/** What the tail check reads of a user: its head (undefined: Redis has none) and its routes. */
export interface UserHead {
  head: MailboxSeq | undefined;
  routes: readonly string[];
}

/**
 * A user's sessions here: an array replaced, never changed in place, so a fan-out that closes a
 * session while it runs still reaches every other one; and the user's token bucket, made at the
 * user's first frame (it starts full either way). Most users have one session: an array and no
 * bucket cost a fraction of a Set and a bucket, per idle connection.
 */
interface UserEntry {
  sessions: readonly HubMember[];
  bucket: TokenBucket | undefined;
}

export class SessionRegistry<S extends HubMember = HubMember> implements SessionHub {
  private readonly users = new Map<string, UserEntry>();
  private readonly byDevice = new Map<string, HubMember>();
  private readonly byShard = new Map<number, Set<HubMember>>();
  private readonly shardEpochs = new Map<number, string>();
  /** Every open connection, authenticated or not. */
  readonly all = new Set<S>();

  constructor(
    private readonly pushes: PushSource,
    private readonly routes: Pick<RoutePort, "reassert" | "verify" | "stray">,
    private readonly registry: RegistryFeed,
    private readonly metrics: GatewayMetrics,
    private readonly userRate: number,
    private readonly log: { warn(o: object, msg: string): void },
    /** The hold expiry's and the tail check's intervals, and the times the hub reads; tests pass a manual one. */
    private readonly clock: Clock = systemClock,
  ) {
    registry.onChange((s) => this.onRegistry(s));
    for (const [id, s] of registry.state.shards) this.shardEpochs.set(id, `${s.epoch}/${s.log}/${s.range.lo}-${s.range.hi}`);
    pushes.start((batch, broadcast) => this.onPushes(batch, broadcast));
  }

  /** Connected (opened, maybe not yet authenticated). */
  open(s: HubMember): void {
    this.all.add(s as S);
    this.metrics.connections.set(this.all.size);
  }

  countForUser(user: string): number {
    return this.users.get(user)?.sessions.length ?? 0;
  }

  /** An authenticated session: replaces an older one of the same device here, joins the fan-out. */
  add(s: HubMember): void {
    const who = s.who;
    if (who === undefined) throw new Error(`hub: session ${s.id} added before AUTH's token was verified`);
    const key = `${who.user}/${who.device}`;
    const older = this.byDevice.get(key);
    if (older !== undefined && older !== s) {
      if ((older.who?.authAt ?? 0) > who.authAt) {
        s.close(Disconnect.REPLACED);
        return;
      }
      older.close(REPLACED_BY_NEWER);
    }
    this.byDevice.set(key, s);
    let u = this.users.get(who.user);
    if (u === undefined) {
      u = { sessions: [], bucket: undefined };
      this.users.set(who.user, u);
    }
    if (!u.sessions.includes(s)) u.sessions = [...u.sessions, s];
  }

  /** Tracks the session under its (possibly new) shard for registry changes. */
  watch(s: HubMember): void {
    for (const set of this.byShard.values()) set.delete(s);
    if (s.shard === undefined) return;
    let set = this.byShard.get(s.shard);
    if (set === undefined) this.byShard.set(s.shard, (set = new Set()));
    set.add(s);
  }

  remove(s: HubMember): void {
    this.all.delete(s as S);
    this.metrics.connections.set(this.all.size);
    if (s.shard !== undefined) this.byShard.get(s.shard)?.delete(s);
    const who = s.who;
    if (who === undefined) return;
    const key = `${who.user}/${who.device}`;
    if (this.byDevice.get(key) === s) this.byDevice.delete(key);
    const u = this.users.get(who.user);
    if (u === undefined) return;
    u.sessions = u.sessions.filter((x) => x !== s);
    if (u.sessions.length === 0) this.users.delete(who.user);
  }

  /**
   * Ends the user's sessions here (one device's when `device` is given; with `issuedBefore`, only
   * those whose token was issued before it, or has no `iat`: a revocation) with `d`. Returns how
   * many it closed.
   */
  end(user: string, d: Disconnect, opts: { device?: string; issuedBefore?: number } = {}): number {
    let n = 0;
    for (const s of this.users.get(user)?.sessions ?? []) {
      const issuedAt = s.who?.issuedAt;
      if (opts.device !== undefined && s.who?.device !== opts.device) continue;
      if (opts.issuedBefore !== undefined && issuedAt !== undefined && issuedAt >= opts.issuedBefore) continue;
      s.close(d);
      n++;
    }
    return n;
  }

  /** The live sessions of these users here: device and AUTH time of each. */
  present(users: readonly string[]): { user: string; device: string; since: number }[] {
    const out: { user: string; device: string; since: number }[] = [];
    for (const user of users) {
      for (const s of this.users.get(user)?.sessions ?? []) if (s.who !== undefined) out.push({ user, device: s.who.device, since: s.who.authAt });
    }
    return out;
  }

  /** A kick from another gateway (or this one): close that exact session with 4409. */
  kick(user: string, device: string, session: string): void {
    const s = this.byDevice.get(`${user}/${device}`);
    if (s !== undefined && s.id === session) s.close(REPLACED_BY_NEWER);
  }

  /** Per-user token bucket over all of the user's sessions here. */
  takeUserToken(user: string, now: number): boolean {
    const u = this.users.get(user);
    if (u === undefined) return true;
    u.bucket ??= new TokenBucket(this.userRate, this.userRate, now);
    return u.bucket.take(now);
  }

  /** The user's route was registered again with `head` then: its sessions read whatever they miss below it. */
  repair(user: string, head: MailboxSeq | undefined): void {
    for (const s of this.users.get(user)?.sessions ?? []) s.catchUpTo(head);
  }

  /**
   * Pushes of shards this gateway's registry view is behind on (a shard it does not know yet, or an
   * epoch above the one it has), held in arrival order until the registry catches up. A worker
   * writes its epoch to the registry before it pushes under it, but the registry reaches gateways on
   * another path: after a rebuild or failover a push from the new log could reach a device before
   * the gateway could sign a cursor for that log, and the device's next AUTH would be refused
   * (CURSOR_INVALID) and replay its whole mailbox.
   */
  private readonly waiting = new Map<number, { since: number; pushes: { push: Push; broadcast: boolean }[] }>();

  /** One batch from the push source: stale pushes dropped, the rest handed to each user's sessions together. */
  onPushes(batch: readonly Push[], broadcast = false): void {
    const now = this.clock.now();
    let received = 0;
    let strays = 0;
    const byUser = new Map<string, Push[]>();
    for (const push of batch) {
      const verdict = pushVerdict(this.registry.state, push);
      // behind on this shard, or pushes of it already held: held (in order) until the registry catches up
      if (verdict === "hold" || (this.waiting.size > 0 && this.waiting.has(push.shard))) {
        this.hold(push, broadcast, now);
        continue;
      }
      if (verdict === "stale") {
        this.metrics.stalePushes.inc();
        continue;
      }
      if (!this.users.has(push.user)) {
        if (broadcast) continue;
        strays++;
        this.routes.stray(push.user);
        continue;
      }
      if (broadcast) this.routes.reassert(push.user);
      received++;
      // once per entry here, before the fan-out to this user's devices; ts is the dispatcher's clock
      this.metrics.pushLatency.observe(Math.max(0, now - push.entry.ts) / 1000);
      const list = byUser.get(push.user);
      if (list === undefined) byUser.set(push.user, [push]);
      else list.push(push);
    }
    if (received > 0) this.metrics.pushesReceived.inc(received);
    if (strays > 0) this.metrics.strayPushes.inc(strays);
    for (const [user, pushes] of byUser) this.deliver(user, pushes);
  }

  private hold(push: Push, broadcast: boolean, now: number): void {
    let w = this.waiting.get(push.shard);
    if (w === undefined) this.waiting.set(push.shard, (w = { since: now, pushes: [] }));
    if (w.pushes.length >= MAX_WAITING_PUSHES) {
      // the sessions find what they miss from the stream (the next push's gap, the tail check)
      this.metrics.heldPushesDropped.inc();
      return;
    }
    this.metrics.heldPushes.inc();
    w.pushes.push({ push, broadcast });
    this.holdTimer ??= this.clock.setInterval(() => this.expireHolds(this.clock.now()), 1000);
  }

  /** Pushes held for a shard whose registry record has arrived go on, in order; the rest wait. */
  private releaseHolds(): void {
    for (const [shard, w] of this.waiting) {
      if (w.pushes.some((h) => pushVerdict(this.registry.state, h.push) === "hold")) continue;
      this.waiting.delete(shard);
      for (const h of w.pushes) this.onPushes([h.push], h.broadcast);
    }
    this.stopHoldTimer();
  }

  /**
   * Held pushes of a registry that has not caught up in HOLD_MS are dropped: it is stuck (its
   * follower logs why), and the sessions read what they miss from the stream once it moves.
   */
  private expireHolds(now: number): void {
    for (const [shard, w] of this.waiting) {
      if (now - w.since < HOLD_MS) continue;
      this.waiting.delete(shard);
      this.metrics.heldPushesDropped.inc(w.pushes.length);
      this.log.warn({ shard, pushes: w.pushes.length, heldMs: now - w.since }, "the registry did not catch up with pushes of this shard: dropped them (sessions read them from the stream)");
    }
    this.stopHoldTimer();
  }

  private stopHoldTimer(): void {
    if (this.waiting.size > 0 || this.holdTimer === undefined) return;
    this.clock.clearInterval(this.holdTimer);
    this.holdTimer = undefined;
  }

  private holdTimer: TimerHandle | undefined;

  /**
   * The user's sessions take the pushes; a live, idle one sends them before this returns. The time
   * of the whole loop is each push's gateway_chain here (the last session's wait, an upper bound
   * for the others); a push that goes through a session's chain counts its own there too.
   */
  private deliver(user: string, pushes: readonly Push[]): void {
    const t0 = this.clock.monotonic();
    const sessions = this.users.get(user)?.sessions ?? [];
    const shared = sessions.length > 1;
    for (const s of sessions) s.onPushes(pushes, shared);
    this.metrics.stages.observe("gateway_chain", (this.clock.monotonic() - t0) / 1000, pushes.length);
  }

  private onRegistry(state: RegistryState): void {
    for (const [id, s] of state.shards) {
      const sig = `${s.epoch}/${s.log}/${s.range.lo}-${s.range.hi}`;
      if (this.shardEpochs.get(id) === sig) continue;
      this.shardEpochs.set(id, sig);
      for (const session of this.byShard.get(id) ?? []) session.onShardChange();
    }
    // after the sessions saw the change: held pushes are then sent under a cursor the gateway can sign
    if (this.waiting.size > 0) this.releaseHolds();
  }

  /**
   * Every live session gets a tail check once per `everyS`, spread over the period (0: never): each
   * second, the heads of that second's sessions' users in one call (`heads`: one round trip per
   * Redis node), and only a session behind its user's head does more (Session.fillTail). One call
   * per second, not a Redis command, promise and closure per session: on an idle gateway those kept
   * V8 from ever seeing an idle heap to shrink.
   *
   * A session behind the head it read is filled only once a whole tick passes with nothing
   * delivered to it while still behind that head. Under a steady stream the head is nearly always
   * ahead of what is in flight to the gateway: reading at once made every session of a busy user
   * read its mailbox every tick (the hot benchmark: 50 devices a user, a stream read per device per
   * second, the gateway saturated). A backlogged path is late by seconds, not milliseconds: at the
   * max of `hot --cluster` the pushes reached the gateway more than a tick after the head was read,
   * so "still behind a tick later" sent all 50 sessions of a user to Redis at once, for hundreds
   * of entries each; the reads timed out and closed them 4503, and their reconnects fed the next
   * herd (bench/RESULTS.md, "Issue 50, fourth session"). A session that moved towards the head is
   * looked at again next tick instead. A lost push with later entries shows as a gap in the next
   * one's `prevAll` (a gap fill); one lost at the tail stops the session's progress, and is read a
   * tick after that.
   */
  startTailChecks(everyS: number, heads: (users: readonly string[]) => Promise<(UserHead | undefined)[]>): void {
    if (everyS <= 0) return;
    let tick = 0;
    let running = false;
    /** Sessions found behind: the head they were behind, and where they were at the last look. */
    let behind = new Map<HubMember, { head: MailboxSeq; at: MailboxSeq }>();
    this.tailTimer = this.clock.setInterval(() => {
      if (running) return; // a slow Redis must not stack checks up
      tick++;
      const moving = new Map<HubMember, { head: MailboxSeq; at: MailboxSeq }>();
      for (const [s, b] of behind) {
        const at = s.tailPosition();
        if (at === undefined || at >= b.head) continue; // busy, gone, or caught up
        if (at > b.at) moving.set(s, { head: b.head, at }); // its pushes are arriving: look again next tick
        else s.fillTail(b.head); // a tick with nothing delivered: what it lacks was lost
      }
      behind = moving;
      const users = new Set<string>();
      let i = 0;
      for (const s of this.all) if (i++ % everyS === tick % everyS && s.tailPosition() !== undefined && s.who !== undefined) users.add(s.who.user);
      if (users.size === 0) return;
      running = true;
      const list = [...users];
      heads(list)
        .then((hs) => {
          for (let k = 0; k < list.length; k++) {
            const read = hs[k];
            if (read === undefined) continue; // not read this time
            const { head, routes } = read;
            // a route Redis lost alone (an eviction): registered again, with what was missed read
            this.routes.verify(list[k]!, routes);
            for (const s of this.users.get(list[k]!)?.sessions ?? []) {
              const at = s.tailPosition();
              // no head in Redis (the user's hash vanished) is "unknown": the session asks the stream
              if (at !== undefined && head === undefined) s.fillTail(undefined);
              else if (at !== undefined && head !== undefined && head > at) behind.set(s, { head, at });
            }
          }
        })
        .catch((err: unknown) => this.log.warn({ err: (err as Error).message }, "tail check: no heads from Redis this time"))
        .finally(() => (running = false));
    }, 1000);
  }

  private tailTimer: TimerHandle | undefined;

  close(): void {
    this.clock.clearInterval(this.tailTimer);
    this.clock.clearInterval(this.holdTimer);
    this.waiting.clear();
    this.pushes.stop();
    this.users.clear();
  }
}
