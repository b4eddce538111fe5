/**
 * Whether NATS and Redis answer, told by probing them: a round trip (NATS PING/PONG through
 * `flush`, Redis PING, and a small Redis write) every second. A client's own status is not enough: a paused Redis
 * (CLIENT PAUSE, DEBUG SLEEP), a stopped nats-server (SIGSTOP) or a silent network partition keeps
 * the TCP connection "connected" while nothing answers, and ioredis would wait on it until the
 * kernel gives the connection up (about 15 minutes). Readiness, the worker's leases and the
 * gateway's upgrades use `answering`.
 */
import type { Logger } from "pino";
import type { NatsConnection } from "@nats-io/transport-node";
import { Gauge, type Registry } from "prom-client";
import { systemClock, type Clock, type TimerHandle } from "../clock.js";
import type { RedisClient } from "./connect.js";

export type Dependency = "nats" | "redis";

/**
 * Why a Redis that answers refuses writes, from the error it gave (undefined: not a refusal).
 * `oom`: maxmemory reached under `noeviction` (or nothing left to evict); `readonly`: a replica
 * (a failover not yet followed); `misconf`: a failed RDB save with stop-writes-on-bgsave-error;
 * `noreplicas`: min-replicas-to-write not met. Each stops the worker's batches and every lease
 * renewal while reads still work: the process must say so, and name it.
 */
export type WriteRefusal = "oom" | "readonly" | "misconf" | "noreplicas";

export function writeRefusal(err: unknown): WriteRefusal | undefined {
  const m = err instanceof Error ? err.message : typeof err === "string" ? err : "";
  // the error code starts the reply, or follows a script's location ("...: @user_script:14: OOM ...")
  const code = /(?:^|: )(OOM|READONLY|MISCONF|NOREPLICAS)\b/.exec(m)?.[1];
  return code === undefined ? undefined : (code.toLowerCase() as WriteRefusal);
}

/** A Redis silent this many timeouts is reconnected: its TCP connection is presumed dead. */
export const REDIS_RECONNECT_AFTER_TIMEOUTS = 8;

export interface HealthOptions {
  /** A dependency whose last answer is older than this is not answering (JETGATE_DEPENDENCY_TIMEOUT_MS). */
  timeoutMs: number;
  log: Logger;
  /** Where `<prefix>dependency_up{dependency}` goes. */
  metrics?: { registry: Registry; prefix: string };
  /** Probe interval; default a quarter of the timeout, at most 1 s. */
  everyMs?: number;
  /** The key the write probe sets (with a short expiry): one per process. */
  redisProbeKey: string;
  /** What the probes' interval and the silences run on (default: systemClock). */
  clock?: Clock;
}

export class DependencyHealth {
  private readonly lastOk: Record<Dependency, number>;
  private readonly inFlight: Record<Dependency, boolean> = { nats: false, redis: false };
  private readonly everyMs: number;
  private timer: TimerHandle | undefined;
  /** When the last reconnect was forced (the clock's monotonic ms). */
  private redisForcedAt = -Infinity;
  private readonly clock: Clock;
  private readonly up: Gauge<"dependency"> | undefined;
  private readonly writable: Gauge | undefined;
  private reported: Record<Dependency, boolean> = { nats: true, redis: true };
  private writeInFlight = false;
  /** The last write probe's refusal: why, and what Redis said. */
  private refused: { why: WriteRefusal; message: string } | undefined;

  constructor(
    private readonly nc: NatsConnection,
    private readonly redis: RedisClient,
    private readonly opts: HealthOptions,
  ) {
    this.clock = opts.clock ?? systemClock;
    const now = this.clock.monotonic();
    // connected a moment ago (start-up waited for both)
    this.lastOk = { nats: now, redis: now };
    this.everyMs = opts.everyMs ?? Math.min(1000, Math.max(50, Math.floor(opts.timeoutMs / 4)));
    if (opts.metrics !== undefined) {
      this.up = new Gauge({
        name: `${opts.metrics.prefix}dependency_up`,
        help: "1 while the dependency answered a probe within JETGATE_DEPENDENCY_TIMEOUT_MS, else 0.",
        labelNames: ["dependency"],
        registers: [opts.metrics.registry],
      });
      this.up.set({ dependency: "nats" }, 1);
      this.up.set({ dependency: "redis" }, 1);
      this.writable = new Gauge({
        name: `${opts.metrics.prefix}redis_writable`,
        help: "1 while Redis accepts writes; 0 while it refuses them (OOM, READONLY, MISCONF, NOREPLICAS: see the logs and /readyz).",
        registers: [opts.metrics.registry],
      });
      this.writable.set(1);
    }
  }

  start(): this {
    this.timer = this.clock.setInterval(() => this.probe(), this.everyMs);
    return this;
  }

  stop(): void {
    this.clock.clearInterval(this.timer);
  }

  /** How long since the dependency last answered a probe. */
  silentMs(dep: Dependency): number {
    return Math.round(this.clock.monotonic() - this.lastOk[dep]);
  }

  /** Answers probes, and (Redis) accepts writes. */
  answering(dep: Dependency): boolean {
    if (dep === "nats" && (this.nc.isClosed() || this.nc.isDraining())) return false;
    if (dep === "redis" && (this.redis.status !== "ready" || this.refused !== undefined)) return false;
    return this.silentMs(dep) <= this.opts.timeoutMs;
  }

  /** Why Redis refuses writes, while it does. */
  get writeRefusal(): WriteRefusal | undefined {
    return this.refused?.why;
  }

  /** For /readyz: each dependency not answering, by name. */
  problems(): Dependency[] {
    return (["nats", "redis"] as const).filter((d) => !this.answering(d));
  }

  /** For /readyz: what is wrong with each dependency in `problems`, in words. */
  detail(): Partial<Record<Dependency, string>> {
    const out: Partial<Record<Dependency, string>> = {};
    for (const d of this.problems()) {
      out[d] = d === "redis" && this.refused !== undefined
        ? `refuses writes (${this.refused.why}): ${this.refused.message}`
        : `no answer for ${this.silentMs(d)} ms`;
    }
    return out;
  }

  private probe(): void {
    this.send("nats", () => this.nc.flush());
    this.send("redis", () => this.redis.ping());
    this.probeWrite();
    for (const dep of ["nats", "redis"] as const) {
      const ok = this.answering(dep);
      if (ok !== this.reported[dep]) {
        this.reported[dep] = ok;
        this.up?.set({ dependency: dep }, ok ? 1 : 0);
        if (ok) this.opts.log.info({ dependency: dep }, "dependency answering again");
        else if (dep === "redis" && this.refused !== undefined) this.opts.log.warn({ dependency: dep, refusal: this.refused.why, err: this.refused.message }, "redis answers but refuses writes");
        else this.opts.log.warn({ dependency: dep, silentMs: this.silentMs(dep) }, "dependency not answering");
      }
    }
    const silent = this.silentMs("redis");
    const reconnectAfter = this.opts.timeoutMs * REDIS_RECONNECT_AFTER_TIMEOUTS;
    if (silent > reconnectAfter && this.redis.status === "ready" && this.clock.monotonic() - this.redisForcedAt > reconnectAfter) {
      // nats.js finds a dead connection by its own pings (JETGATE's pingInterval); ioredis never does
      this.redisForcedAt = this.clock.monotonic();
      this.opts.log.warn({ silentMs: silent }, "redis silent: reconnecting");
      this.redis.disconnect(true);
    }
  }

  /**
   * A PING says Redis answers, not that it takes writes: a full `noeviction` Redis, a replica or a
   * failed save answers PING and refuses every write the worker and the leases need. So a small
   * write too, on a key of this process that expires by itself.
   */
  private probeWrite(): void {
    if (this.writeInFlight || this.redis.status !== "ready") return;
    this.writeInFlight = true;
    this.redis.set(this.opts.redisProbeKey, "1", "PX", Math.max(5000, this.opts.timeoutMs * 2)).then(
      () => this.setRefused(undefined),
      (err: unknown) => {
        const why = writeRefusal(err);
        // anything else (a timeout, a closed connection) is the PING's to tell
        if (why !== undefined) this.setRefused({ why, message: (err as Error).message });
      },
    ).finally(() => (this.writeInFlight = false));
  }

  private setRefused(r: { why: WriteRefusal; message: string } | undefined): void {
    this.refused = r;
    this.writable?.set(r === undefined ? 1 : 0);
  }

  /** One probe per dependency at a time: a silent one must not pile them up. */
  private send(dep: Dependency, roundTrip: () => Promise<unknown>): void {
    if (this.inFlight[dep]) return;
    if (dep === "nats" && this.nc.isClosed()) return;
    this.inFlight[dep] = true;
    roundTrip().then(
      () => {
        this.lastOk[dep] = this.clock.monotonic();
        this.inFlight[dep] = false;
      },
      () => {
        this.inFlight[dep] = false;
      },
    );
  }
}
