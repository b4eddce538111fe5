/** Prometheus metrics of a worker. Names are part of the operator contract (alerts, dashboards). */
import { Counter, Gauge, Registry, collectDefaultMetrics } from "prom-client";

export class WorkerMetrics {
  readonly registry = new Registry();
  readonly processed: Counter<"shard">;
  readonly pushed: Counter<"shard">;
  readonly duplicates: Counter<"shard">;
  readonly forwarded: Counter<"shard">;
  readonly badEntries: Counter<"shard">;
  readonly regressions: Counter<"component">;
  readonly redisRetries: Counter<"shard">;
  readonly takeovers: Counter<"shard">;
  readonly fenced: Counter<"shard">;
  readonly lag: Gauge<"shard">;
  readonly epoch: Gauge<"shard">;
  readonly offset: Gauge<"shard">;
  readonly lease: Gauge<"shard">;

  constructor() {
    const r = [this.registry];
    collectDefaultMetrics({ register: this.registry, prefix: "jetgate_worker_" });
    this.processed = new Counter({ name: "jetgate_worker_entries_processed_total", help: "Entries processed (first copies, duplicates and forwards).", labelNames: ["shard"], registers: r });
    this.pushed = new Counter({ name: "jetgate_worker_entries_pushed_total", help: "Live pushes published.", labelNames: ["shard"], registers: r });
    this.duplicates = new Counter({ name: "jetgate_worker_duplicates_total", help: "Entries whose dispatch_id:user was seen at another offset: not pushed.", labelNames: ["shard"], registers: r });
    this.forwarded = new Counter({ name: "jetgate_worker_forwarded_total", help: "Entries for users this shard no longer owns, forwarded to the owning shard.", labelNames: ["shard"], registers: r });
    this.badEntries = new Counter({ name: "jetgate_worker_bad_entries_total", help: "Entries with an unreadable subject or body: skipped.", labelNames: ["shard"], registers: r });
    this.regressions = new Counter({ name: "jetgate_mailbox_seq_regression_total", help: "A derived seq at or below the previous one (ADR-0004 release gate: must stay 0).", labelNames: ["component"], registers: r });
    this.redisRetries = new Counter({ name: "jetgate_worker_redis_retries_total", help: "Batches whose Redis step failed and was retried.", labelNames: ["shard"], registers: r });
    this.takeovers = new Counter({ name: "jetgate_worker_takeovers_total", help: "Shards taken over by this worker (epoch bumps it wrote).", labelNames: ["shard"], registers: r });
    this.fenced = new Counter({ name: "jetgate_worker_fenced_total", help: "Times this worker stopped a shard because the registry showed a newer epoch.", labelNames: ["shard"], registers: r });
    this.lag = new Gauge({ name: "jetgate_worker_lag_entries", help: "Entries in the shard stream not yet delivered to this worker.", labelNames: ["shard"], registers: r });
    this.epoch = new Gauge({ name: "jetgate_shard_epoch", help: "Current epoch of an owned shard (review at 1000).", labelNames: ["shard"], registers: r });
    this.offset = new Gauge({ name: "jetgate_shard_log_offset", help: "Last log offset processed in an owned shard (48-bit field: review at 10% of 2^48).", labelNames: ["shard"], registers: r });
    this.lease = new Gauge({ name: "jetgate_worker_lease_held", help: "1 while this worker holds the shard's lease.", labelNames: ["shard"], registers: r });
    this.regressions.inc({ component: "worker" }, 0);
  }
}
