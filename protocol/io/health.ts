/**
 * Whether NATS and Redis answer, told by probing them: a round trip (NATS PING/PONG through
 * `flush`, Redis PING) every second. A client's own status is not enough: a paused Redis
 * (CLIENT PAUSE, DEBUG SLEEP), a stopped nats-server (SIGSTOP) or a silent network partition keeps
 * the TCP connection "connected" while nothing answers, and ioredis would wait on it until the
 * kernel gives the connection up (about 15 minutes). Readiness, the worker's leases and the
 * gateway's upgrades use `answering`.
 */
import type { Logger } from "pino";
import type { NatsConnection } from "@nats-io/transport-node";
import { Gauge, type Registry } from "prom-client";
import type { RedisClient } from "./connect.js";

export type Dependency = "nats" | "redis";

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
}

export class DependencyHealth {
  private readonly lastOk: Record<Dependency, number>;
  private readonly inFlight: Record<Dependency, boolean> = { nats: false, redis: false };
  private readonly everyMs: number;
  private timer: NodeJS.Timeout | undefined;
  private redisForcedAt = 0;
  private readonly up: Gauge<"dependency"> | undefined;
  private reported: Record<Dependency, boolean> = { nats: true, redis: true };

  constructor(
    private readonly nc: NatsConnection,
    private readonly redis: RedisClient,
    private readonly opts: HealthOptions,
  ) {
    const now = Date.now();
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
    }
  }

  start(): this {
    this.timer = setInterval(() => this.probe(), this.everyMs);
    this.timer.unref();
    return this;
  }

  stop(): void {
    clearInterval(this.timer);
  }

  /** How long since the dependency last answered a probe. */
  silentMs(dep: Dependency): number {
    return Date.now() - this.lastOk[dep];
  }

  answering(dep: Dependency): boolean {
    if (dep === "nats" && (this.nc.isClosed() || this.nc.isDraining())) return false;
    if (dep === "redis" && this.redis.status !== "ready") return false;
    return this.silentMs(dep) <= this.opts.timeoutMs;
  }

  /** For /readyz: each dependency not answering, by name. */
  problems(): Dependency[] {
    return (["nats", "redis"] as const).filter((d) => !this.answering(d));
  }

  private probe(): void {
    this.send("nats", () => this.nc.flush());
    this.send("redis", () => this.redis.ping());
    for (const dep of ["nats", "redis"] as const) {
      const ok = this.answering(dep);
      if (ok !== this.reported[dep]) {
        this.reported[dep] = ok;
        this.up?.set({ dependency: dep }, ok ? 1 : 0);
        if (ok) this.opts.log.info({ dependency: dep }, "dependency answering again");
        else this.opts.log.warn({ dependency: dep, silentMs: this.silentMs(dep) }, "dependency not answering");
      }
    }
    const silent = this.silentMs("redis");
    const reconnectAfter = this.opts.timeoutMs * REDIS_RECONNECT_AFTER_TIMEOUTS;
    if (silent > reconnectAfter && this.redis.status === "ready" && Date.now() - this.redisForcedAt > reconnectAfter) {
      // nats.js finds a dead connection by its own pings (JETGATE's pingInterval); ioredis never does
      this.redisForcedAt = Date.now();
      this.opts.log.warn({ silentMs: silent }, "redis silent: reconnecting");
      this.redis.disconnect(true);
    }
  }

  /** One probe per dependency at a time: a silent one must not pile them up. */
  private send(dep: Dependency, roundTrip: () => Promise<unknown>): void {
    if (this.inFlight[dep]) return;
    if (dep === "nats" && this.nc.isClosed()) return;
    this.inFlight[dep] = true;
    roundTrip().then(
      () => {
        this.lastOk[dep] = Date.now();
        this.inFlight[dep] = false;
      },
      () => {
        this.inFlight[dep] = false;
      },
    );
  }
}
