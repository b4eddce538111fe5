/**
 * A worker process's shard ownership: every tick it heartbeats, renews its leases, and moves toward
 * an even share of the active shards (ceil(shards / live workers)). Which shards it prefers is
 * decided by rendezvous hashing, so each worker reaches for different shards first. A surplus shard
 * is released, one per tick, and every shard when the worker stops: batch finished, the epoch given
 * back in the registry at the last offset done, lease released, so the next owner resumes the same
 * epoch (no bump, nothing renumbered or sent twice). A shard lost otherwise (a fence, a lost lease,
 * NATS gone) is only let go: its next owner bumps the epoch.
 */
import { createHash } from "node:crypto";
import type { Logger } from "pino";
import { jetstreamManager, type JetStreamManager } from "@nats-io/jetstream";
import type { TimerHandle } from "../protocol/index.js";
import { writeRefusal } from "../protocol/io/index.js";
import { Leases } from "./leases.js";
import { shardRunnerDeps, type WorkerDeps } from "./shard-adapters.js";
import { ShardRunner } from "./shard-runner.js";
import { writeRelease, type ReleaseOutcome } from "./release.js";

export interface WorkerOptions {
  leaseMs: number;
  /**
   * Whether NATS answers probes (protocol/io/health.ts), and after how long silent it does not
   * (JETGATE_DEPENDENCY_TIMEOUT_MS); without it NATS is taken as answering.
   */
  nats?: { answering(): boolean; silentMs(): number; timeoutMs: number };
}

interface Trouble {
  /** The clock's monotonic ms when it began. */
  since: number;
  message: string;
}

export type WorkerStatus = { type: "idle" } | { type: "running" } | { type: "stopping" } | { type: "stopped" };

/** How long a release waits for the registry before leaving the shard to the fenced path. */
const RELEASE_TIMEOUT_MS = 5000;

function rendezvous(worker: string, shard: number): string {
  return createHash("sha256").update(`${worker}/${shard}`).digest("hex");
}

export class Worker {
  private readonly runners = new Map<number, ShardRunner>();
  private readonly leases: Leases;
  private timer: TimerHandle | undefined;
  private ticking: Promise<void> = Promise.resolve();
  private statusValue: WorkerStatus = { type: "idle" };
  private jsm: JetStreamManager | undefined;
  private liveWorkers: string[] = [];

  constructor(
    private readonly deps: WorkerDeps,
    private readonly opts: WorkerOptions,
  ) {
    this.leases = new Leases(deps.redis, deps.keys, deps.workerId, opts.leaseMs, deps.clock);
  }

  /** Whole ms of the clock's monotonic time: the lease loop's durations (a wall clock set back moves none). */
  private ms(): number {
    return Math.floor(this.deps.clock.monotonic());
  }

  get status(): WorkerStatus {
    return this.statusValue;
  }

  /** Shards this worker is running now, with their epochs, last offsets and lag (as last read). */
  owned(): { shard: number; epoch: number | undefined; offset: number; lag: number | undefined }[] {
    return [...this.runners.values()].sort((a, b) => a.shard - b.shard).map((r) => ({ shard: r.shard, epoch: r.epoch, offset: r.offset, lag: this.lags.get(r.shard) }));
  }

  private readonly lags = new Map<number, number>();

  get log(): Logger {
    return this.deps.log;
  }

  start(): void {
    if (this.statusValue.type !== "idle") return;
    this.statusValue = { type: "running" };
    const every = Math.max(200, Math.floor(this.opts.leaseMs / 3));
    const run = () => {
      this.ticking = this.tick().then(
        () => this.troubleOver("tick"),
        (err: unknown) => this.trouble("tick", err, "worker tick failed"),
      );
    };
    // lag every second, beside the ticks: a tick that fails (Redis refusing writes) must not freeze it
    this.observer = this.deps.clock.setInterval(() => this.observeSoon(), 1000);
    run();
    this.timer = this.deps.clock.setInterval(() => {
      // One tick at a time: a slow Redis must not stack ticks up.
      void this.ticking.then(() => {
        if (this.statusValue.type === "running") run();
      });
    }, every);
  }

  private async tick(): Promise<void> {
    if (this.statusValue.type !== "running") return;
    const jsm = (this.jsm ??= await jetstreamManager(this.deps.nc));
    const natsOk = this.opts.nats?.answering() ?? true;
    // Redis failing until now (refusing writes, say): a lease found expired was that, not a lost key
    const troubled = this.anyTrouble();
    let beat;
    try {
      beat = await this.leases.heartbeat(natsOk);
      this.troubleOver("heartbeat");
    } catch (err) {
      // no heartbeat (a Redis that refuses writes): keep what is held as long as renewals work
      this.trouble("heartbeat", err, "cannot heartbeat");
      return this.renewAll(troubled);
    }
    this.liveWorkers = beat.live;
    if (beat.redisLost && this.beats > 0) {
      // Redis lost the worker set and the leases (a restart without persistence, FLUSHALL):
      // the set looks nearly empty, and every lease free. Taking shards now would take over live
      // workers' shards (an epoch bump, replays to devices) before they re-take their own leases
      // on their next tick; one lease period gives every live worker that tick.
      this.settleUntil = this.ms() + this.opts.leaseMs;
      // Said once per marker; a loss only to a worker that saw an older marker (a fresh Redis, or
      // this worker's first beats, look the same and are no fault)
      if (beat.since !== this.settleSince) {
        const lost = this.seenSince !== undefined && this.seenSince !== beat.since;
        if (lost) this.deps.log.warn({ ms: this.opts.leaseMs }, "Redis lost the worker set: no new shards for one lease period");
        else this.deps.log.info({ ms: this.opts.leaseMs }, "a new worker set in Redis: no new shards for one lease period");
        this.settleSince = beat.since;
      }
    }
    this.seenSince = beat.since;
    this.beats++;
    if (!natsOk) return this.withoutNats(beat.live, troubled);
    await this.renewAll(troubled);
    if (this.ms() < this.settleUntil) return;
    const active = [...this.deps.registry.state.shards.values()].filter((s) => s.status === "active").map((s) => s.shard);
    const target = Math.ceil(active.length / Math.max(1, this.liveWorkers.length));
    const me = this.deps.workerId;
    if (this.runners.size < target) {
      const free = active
        .filter((s) => !this.runners.has(s))
        .sort((a, b) => rendezvous(me, b).localeCompare(rendezvous(me, a)));
      for (const shard of free) {
        if (this.runners.size >= target || this.statusValue.type !== "running") break;
        if (await this.leases.acquire(shard)) await this.run(shard, jsm);
      }
    } else if (this.runners.size > target) {
      const worst = [...this.runners.keys()].sort((a, b) => rendezvous(me, a).localeCompare(rendezvous(me, b)))[0]!;
      // beside the tick: a release waiting on the registry must not hold the other leases' renewals
      this.background(this.release([worst], "rebalancing"));
    }
  }

  /**
   * NATS does not answer this worker (a partition, or NATS itself stopped). While another worker is
   * live (it heartbeats only while its own NATS answers) and this has lasted two lease periods, the
   * shards go to it: their leases are released and it takes them over with an epoch bump, which
   * fences this worker's runners. Alone, a worker keeps its shards: nobody could do better, and
   * handing them back would cost every shard an epoch when NATS returns. No new shards meanwhile.
   */
  private async withoutNats(live: string[], troubled: Trouble | undefined): Promise<void> {
    const others = live.filter((w) => w !== this.deps.workerId);
    // two lease periods past noticing: a worker that lost NATS too (NATS itself stopped) has left
    // the set by then, so shards go only to a worker that can run them
    const nats = this.opts.nats;
    if (nats !== undefined && this.runners.size > 0 && others.length > 0 && nats.silentMs() > nats.timeoutMs + 2 * this.opts.leaseMs) {
      this.deps.log.warn({ shards: [...this.runners.keys()], others, silentMs: nats.silentMs() }, "NATS not answering for two lease periods: handing the shards to live workers");
      for (const shard of [...this.runners.keys()]) await this.letGo(shard, "NATS not answering");
      return;
    }
    await this.renewAll(troubled);
  }

  /** Releases the lease at once; the runner stops when its NATS call in hand answers or times out. */
  private async letGo(shard: number, reason: string): Promise<void> {
    const runner = this.runners.get(shard);
    this.runners.delete(shard);
    this.deps.metrics.lease.set({ shard: String(shard) }, 0);
    await this.leases.release(shard).catch(() => undefined);
    if (runner === undefined) return;
    this.background(runner.stop(reason));
  }

  private readonly stopping = new Set<Promise<void>>();
  /** When each held lease was last taken or renewed (a lease found expired: was this worker late?). */
  private readonly renewedAt = new Map<number, number>();
  private beats = 0;
  /** The worker set's marker at this worker's last beat, and the one it last settled for. */
  private seenSince: number | undefined;
  private settleSince: number | undefined;
  private settleUntil = 0;

  private async run(shard: number, jsm: JetStreamManager): Promise<void> {
    const runner = new ShardRunner(shard, shardRunnerDeps(this.deps, jsm, shard));
    this.runners.set(shard, runner);
    this.renewedAt.set(shard, this.ms());
    this.deps.metrics.lease.set({ shard: String(shard) }, 1);
    await runner.start();
  }

  /** `failing`: what went wrong with Redis until now, if anything (a lease found expired is that). */
  private async renewAll(failing: Trouble | undefined): Promise<void> {
    let failed = false;
    for (const [shard, runner] of this.runners) {
      if (runner.state.type === "stopped") {
        // Fenced, lost a race, or its consumer ended: let the shard go so someone can take it over.
        this.deps.log.info({ shard, reason: runner.state.reason }, "shard runner stopped");
        await this.handBack(shard, runner.state.reason);
        continue;
      }
      let outcome;
      try {
        outcome = await this.leases.renew(shard);
      } catch (err) {
        this.trouble("renew", err, "cannot renew leases");
        failed = true;
        continue;
      }
      const last = this.renewedAt.get(shard);
      const now = this.ms();
      if (outcome !== "lost") this.renewedAt.set(shard, now);
      if (outcome === "lost") {
        this.deps.log.warn({ shard }, "lease lost to another worker");
        await this.drop(shard, "lease lost");
      } else if (outcome === "reacquired") {
        // say which: renewals that failed until it expired, a renewal this worker made too late,
        // or a Redis that lost the key
        if (failing !== undefined) this.deps.log.warn({ shard, failedMs: now - failing.since, cause: failing.message }, "lease expired while its renewals failed: taken again");
        else if (last !== undefined && now - last >= this.opts.leaseMs) this.deps.log.warn({ shard, sinceRenewalMs: now - last, leaseMs: this.opts.leaseMs }, "lease expired before this worker renewed it (its renewals were held up): taken again");
        else this.deps.log.warn({ shard }, "lease vanished (Redis lost the key: a flush, a restart without persistence, an eviction): taken again");
      }
    }
    if (!failed) this.troubleOver("renew");
  }

  /** Failures that repeat every tick, by kind: logged when they start and when they change, not each time. */
  private readonly troubles = new Map<string, Trouble>();

  /** The oldest failure going on. */
  private anyTrouble(): Trouble | undefined {
    let oldest: Trouble | undefined;
    for (const t of this.troubles.values()) if (oldest === undefined || t.since < oldest.since) oldest = t;
    return oldest;
  }

  private trouble(kind: string, err: unknown, msg: string): void {
    const message = err instanceof Error ? err.message : String(err);
    const had = this.troubles.get(kind);
    if (had !== undefined && had.message === message) return;
    this.troubles.set(kind, { since: had?.since ?? this.ms(), message });
    const refusal = writeRefusal(err);
    if (refusal !== undefined) this.deps.log.error({ err: message, refusal }, `${msg}: Redis refuses writes (${refusal})`);
    else this.deps.log.error({ err: message }, msg);
  }

  private troubleOver(kind: string): void {
    const had = this.troubles.get(kind);
    if (had === undefined) return;
    this.troubles.delete(kind);
    this.deps.log.info({ kind, failedMs: this.ms() - had.since }, "working again");
  }

  private async drop(shard: number, reason: string): Promise<void> {
    const runner = this.runners.get(shard);
    this.runners.delete(shard);
    this.deps.metrics.lease.set({ shard: String(shard) }, 0);
    await runner?.stop(reason);
  }

  private async handBack(shard: number, reason: string): Promise<void> {
    await this.drop(shard, reason);
    await this.leases.release(shard).catch(() => undefined);
  }

  /**
   * A planned handoff: the runners stop after their batches and give their epochs back in one
   * registry record (worker/release.ts), then the leases go. If the release cannot be written (NATS
   * away, a fence first) the leases go all the same: those shards are left to the fenced path (the
   * next owner bumps), never half-released.
   */
  private async release(shards: number[], reason: string): Promise<void> {
    const runners: ShardRunner[] = [];
    for (const shard of shards) {
      const runner = this.runners.get(shard);
      this.runners.delete(shard);
      this.deps.metrics.lease.set({ shard: String(shard) }, 0);
      if (runner !== undefined) runners.push(runner);
    }
    const stopped = await Promise.all(runners.map((r) => r.stopForRelease(reason)));
    const outcomes = stopped.length === 0 ? new Map<number, ReleaseOutcome>() : await writeRelease(this.deps.registry, this.deps.workerId, stopped, RELEASE_TIMEOUT_MS);
    for (const [shard, r] of outcomes) {
      this.deps.metrics.releases.inc({ shard: String(shard), outcome: r.outcome });
      const at = { shard, epoch: r.epoch, offset: r.offset, reason };
      if (r.outcome === "released") this.deps.log.info(at, "shard released: the next owner resumes its epoch");
      else if (r.outcome === "fenced") this.deps.log.info(at, "shard not released: it was no longer this worker's epoch");
      else this.deps.log.warn({ ...at, err: r.error }, "shard not released (the registry write failed): the next owner fences it with a new epoch");
    }
    await Promise.all(shards.map((shard) => this.leases.release(shard).catch(() => undefined)));
  }

  /** Work beside the ticks (a release): the worker's stop waits for it. */
  private background(work: Promise<void>): void {
    const p = work.finally(() => this.stopping.delete(p));
    this.stopping.add(p);
  }

  private observing: Promise<void> | undefined;
  private observer: TimerHandle | undefined;

  /**
   * Lag is read beside the ticks, never in them: its NATS requests wait out their timeout when NATS
   * is silent, and a tick that waits stops renewing the leases it holds.
   */
  private observeSoon(): void {
    this.observing ??= this.observe().finally(() => (this.observing = undefined));
  }

  private async observe(): Promise<void> {
    for (const r of this.runners.values()) {
      const lag = await r.lag().catch(() => undefined);
      if (lag !== undefined) {
        this.deps.metrics.lag.set({ shard: String(r.shard) }, lag);
        this.lags.set(r.shard, lag);
      }
    }
  }

  /** Finishes the batches in hand, releases every shard (epoch and lease) and leaves the worker set. */
  async stop(): Promise<void> {
    if (this.statusValue.type === "stopping" || this.statusValue.type === "stopped") return;
    this.statusValue = { type: "stopping" };
    this.deps.clock.clearInterval(this.timer);
    this.deps.clock.clearInterval(this.observer);
    await this.ticking;
    await Promise.all(this.stopping);
    await this.release([...this.runners.keys()], "worker stopping");
    await this.leases.leave().catch(() => undefined);
    this.statusValue = { type: "stopped" };
  }
}
