/** Prometheus metrics of a worker. Names are part of the operator contract (alerts, dashboards). */
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from "prom-client";
import { PUSH_LATENCY_BUCKETS_S, StageTimes } from "../protocol/index.js";
import { registerStageMetric } from "../protocol/io/index.js";

export class WorkerMetrics {
  readonly registry = new Registry();
  readonly processed: Counter<"shard">;
  readonly pushed: Counter<"shard">;
  readonly duplicates: Counter<"shard">;
  readonly forwarded: Counter<"shard">;
  readonly badEntries: Counter<"shard">;
  readonly regressions: Counter<"component">;
  readonly redisRetries: Counter<"shard">;
  readonly takeovers: Counter<"shard" | "mode">;
  readonly releases: Counter<"shard" | "outcome">;
  readonly fenced: Counter<"shard">;
  readonly lag: Gauge<"shard">;
  readonly epoch: Gauge<"shard">;
  readonly offset: Gauge<"shard">;
  readonly lease: Gauge<"shard">;
  readonly registryRecord: Gauge;
  readonly deliveryGaps: Counter<"shard">;
  readonly batches: Counter<"shard">;
  readonly pushMessages: Counter;
  readonly unroutedPushes: Counter;
  readonly broadcastPushes: Counter;
  readonly silentRoutes: Counter;
  readonly pushLatency: Histogram;
  /** Seconds per stage of an entry's path in this worker (protocol/stages.ts). */
  readonly stages = new StageTimes();

  constructor() {
    const registers = [this.registry];
    collectDefaultMetrics({ register: this.registry, prefix: "jetgate_worker_" });
    const c = <L extends string>(name: string, help: string, labelNames: L[]) => new Counter<L>({ name, help, labelNames, registers });
    const g = (name: string, help: string) => new Gauge<"shard">({ name, help, labelNames: ["shard"], registers });
    this.processed = c("jetgate_worker_entries_processed_total", "Entries processed (first copies, duplicates and forwards).", ["shard"]);
    this.pushed = c("jetgate_worker_entries_pushed_total", "Live pushes published.", ["shard"]);
    this.duplicates = c("jetgate_worker_duplicates_total", "Entries whose dispatch_id:user was seen at another offset: not pushed.", ["shard"]);
    this.forwarded = c("jetgate_worker_forwarded_total", "Entries for users this shard no longer owns, forwarded to the owning shard.", ["shard"]);
    this.badEntries = c("jetgate_worker_bad_entries_total", "Entries with an unreadable subject or body: skipped.", ["shard"]);
    this.regressions = c("jetgate_mailbox_seq_regression_total", "A derived seq at or below the previous one (must stay 0: docs/design.md, Review points).", ["component"]);
    this.redisRetries = c("jetgate_worker_redis_retries_total", "Batches whose Redis step failed and was retried.", ["shard"]);
    this.takeovers = c("jetgate_worker_takeovers_total", "Shards taken over by this worker, by mode: claim (an operation's epoch), resume (an epoch released by a planned stop) or bump (a new epoch that fences the previous owner).", ["shard", "mode"]);
    this.releases = c("jetgate_worker_releases_total", "Planned stops of a shard (SIGTERM, rebalancing), by outcome: released (the next owner resumes the epoch), fenced (a newer epoch came first) or failed (not written: the next owner bumps).", ["shard", "outcome"]);
    this.fenced = c("jetgate_worker_fenced_total", "Times this worker stopped a shard because the registry showed a newer epoch.", ["shard"]);
    this.lag = g("jetgate_worker_lag_entries", "Entries in the shard stream this worker has not finished (not delivered yet, or delivered and waiting), read every second.");
    this.epoch = g("jetgate_shard_epoch", "Current epoch of an owned shard (review at 1000).");
    this.offset = g("jetgate_shard_log_offset", "Last log offset processed in an owned shard (48-bit field: review at 10% of 2^48).");
    this.lease = g("jetgate_worker_lease_held", "1 while this worker holds the shard's lease.");
    // entries per batch = entries_processed / batches; entries per push message = entries_pushed / push_messages
    this.batches = c("jetgate_worker_batches_total", "Batches processed (one Redis step, one confirmation, one ack each).", ["shard"]);
    this.pushMessages = new Counter({ name: "jetgate_worker_push_messages_total", help: "NATS messages published to gateways for live pushes (each carries every push for one gateway since the last).", registers });
    this.broadcastPushes = new Counter({ name: "jetgate_worker_broadcast_pushes_total", help: "Pushes sent to every gateway because Redis had no routes for the user (a new, expired, evicted or flushed hash: once per hash); the gateways holding the user register again.", registers });
    this.unroutedPushes = new Counter({ name: "jetgate_worker_unrouted_entries_total", help: "Entries (first copies) whose user has no session on any gateway: no push message at all.", registers });
    this.silentRoutes = new Counter({ name: "jetgate_worker_silent_routes_total", help: "Pushes not sent to a gateway in a user's routes because it stopped beating (it is dropped from the routes).", registers });
    this.deliveryGaps = c("jetgate_worker_delivery_gaps_total", "Entries the shard consumer skipped (a delivery lost in flight), fetched from the stream by offset instead.", ["shard"]);
    // the gateway's histogram counts the same entries on arrival: the two place a delivery's latency before, in or after the worker
    this.pushLatency = new Histogram({
      name: "jetgate_worker_push_latency_seconds",
      help: "Seconds from an entry's dispatch (its ts) to this worker publishing its push, once per entry pushed; clock skew below 0 counts as 0.",
      buckets: [...PUSH_LATENCY_BUCKETS_S],
      registers,
    });
    registerStageMetric(this.registry, "jetgate_worker_stage_seconds", "Seconds an entry spends in each stage of its path in this worker, once per entry (docs/performance.md): worker_fetch_wait (stored in the stream to its batch), worker_redis, worker_confirm, worker_push (routed and published, to the ack).", this.stages);
    this.registryRecord = new Gauge({ name: "jetgate_worker_registry_record", help: "Stream seq of the last registry record this process applied (behind the others: its registry follower is stuck).", registers });
    this.regressions.inc({ component: "worker" }, 0);
  }
}
