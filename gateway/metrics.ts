/** Prometheus metrics of a gateway. */
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from "prom-client";
import { PUSH_LATENCY_BUCKETS_S, StageTimes } from "../protocol/index.js";
import { registerStageMetric, type DispatchStats } from "../protocol/io/index.js";

export class GatewayMetrics {
  readonly registry = new Registry();
  readonly connections: Gauge;
  readonly framesIn: Counter<"type">;
  readonly framesOut: Counter<"type">;
  readonly bytesIn: Counter;
  readonly bytesOut: Counter;
  readonly authOutcomes: Counter<"case">;
  readonly midSessionRebases: Counter<"case">;
  readonly catchupEntries: Counter<"source">;
  readonly entriesSent: Counter;
  readonly gapFills: Counter;
  readonly stalePushes: Counter;
  readonly heldPushes: Counter;
  readonly heldPushesDropped: Counter;
  readonly unreadablePushes: Counter;
  readonly pushesReceived: Counter;
  readonly strayPushes: Counter;
  readonly duplicatesDropped: Counter;
  readonly slowConsumers: Counter;
  readonly rateLimited: Counter;
  readonly closes: Counter<"code">;
  readonly regressions: Counter<"component">;
  readonly dispatchRequests: Counter<"status" | "token">;
  readonly usersApiRequests: Counter<"path" | "status" | "token">;
  readonly serviceTokenReloads: Counter<"outcome">;
  readonly serviceTokens: Gauge;
  readonly serviceTokenNotAfter: Gauge<"token">;
  readonly refusedUpgrades: Counter<"reason">;
  readonly fileLimit: Gauge;
  readonly maxConnections: Gauge;
  readonly openFiles: Gauge;
  readonly acceptPauses: Counter;
  readonly tailFills: Counter;
  readonly devicesEvicted: Counter;
  readonly registryRecord: Gauge;
  readonly revocationsHeld: Gauge;
  readonly revocationLoads: Counter<"why">;
  readonly revocationChanges: Counter;
  readonly revocationsMalformed: Counter;
  readonly uwsBinary: Gauge<"binary">;
  readonly pushLatency: Histogram;
  /** Seconds per stage of an entry's path in this process (protocol/stages.ts): its Dispatcher's, and push to frame. */
  readonly stages = new StageTimes();

  /** Files open now, read at each scrape (the count the accept guard made last). */
  openFilesNow: () => number = () => 0;

  /** How many revocations the gateway holds, read at each scrape. */
  revocationCount: () => number = () => 0;

  /** The Dispatcher's counters (POST /v1/dispatch), read at each scrape. */
  dispatchStats: () => DispatchStats = () => ({ appended: 0, retries: 0, held: 0, failed: 0, batches: 0, batchedEntries: 0, batchFallbacks: 0 });

  constructor() {
    const registers = [this.registry];
    collectDefaultMetrics({ register: this.registry, prefix: "jetgate_gateway_" });
    const c = <L extends string>(name: string, help: string, labelNames: L[] = []) => new Counter<L>({ name, help, labelNames, registers });
    this.connections = new Gauge({ name: "jetgate_gateway_connections", help: "Open device connections.", registers });
    this.framesIn = c("jetgate_gateway_frames_in_total", "Frames received from devices, by type (invalid for undecodable).", ["type"]);
    this.framesOut = c("jetgate_gateway_frames_out_total", "Frames sent to devices, by type.", ["type"]);
    this.bytesIn = c("jetgate_gateway_bytes_in_total", "Bytes received from devices.");
    this.bytesOut = c("jetgate_gateway_bytes_out_total", "Bytes sent to devices.");
    this.authOutcomes = c("jetgate_gateway_auth_outcomes_total", "AUTH answers by case (fresh, normal, rebased, rebased_new_log, split, expired, invalid, unauthorized, revoked, timeout, too_many_connections, registry_unavailable, revocations_unavailable).", ["case"]);
    this.midSessionRebases = c("jetgate_gateway_mid_session_rebases_total", "CURSOR_REBASED sent to live sessions after a registry change.", ["case"]);
    // entries per MSGS frame = entries_sent / frames_out{type="MSGS"} (PULL replies are not counted here)
    this.entriesSent = c("jetgate_gateway_entries_sent_total", "Entries sent to devices in catch-up and live MSGS frames.");
    this.catchupEntries = c("jetgate_gateway_catchup_entries_total", "Entries read for catch-up, by source (cache, stream).", ["source"]);
    this.gapFills = c("jetgate_gateway_gap_fills_total", "Live pushes whose predecessor was missing or unknown, filled from the stream first.");
    this.stalePushes = c("jetgate_gateway_stale_pushes_total", "Pushes dropped because their epoch is older than the registry's.");
    this.heldPushes = c("jetgate_gateway_held_pushes_total", "Pushes held until this gateway's registry view knew their shard and epoch (a takeover, split, rebuild or failover it had not seen yet).");
    this.heldPushesDropped = c("jetgate_gateway_held_pushes_dropped_total", "Held pushes dropped: the registry view did not catch up within 10 s, or too many were held (the sessions read them from the stream).");
    // received / needed over gateways: how well routing keeps each gateway to its own sessions' users
    this.pushesReceived = c("jetgate_gateway_pushes_received_total", "Live pushes received from the workers for users with a session here (one per entry, however many sessions).");
    this.strayPushes = c("jetgate_gateway_stray_pushes_total", "Live pushes received for users with no session here (a route left behind: this gateway takes itself out of it).");
    this.unreadablePushes = c("jetgate_gateway_unreadable_pushes_total", "Pushes (or whole push batches) from the workers that did not decode: dropped; devices get those entries from the mailbox at their next push or tail check.");
    this.duplicatesDropped = c("jetgate_gateway_duplicates_dropped_total", "Pushes of entries a session had already sent (catch-up and live overlap).");
    this.slowConsumers = c("jetgate_gateway_slow_consumers_total", "Connections closed with 4408 over the send buffer limit.");
    this.rateLimited = c("jetgate_gateway_rate_limited_total", "Frames refused by rate limits.");
    this.closes = c("jetgate_gateway_closes_total", "Connections closed by the gateway, by close code.", ["code"]);
    this.regressions = c("jetgate_mailbox_seq_regression_total", "A seq to send at or below the last sent on its connection: dropped (must stay 0).", ["component"]);
    this.usersApiRequests = c("jetgate_gateway_users_api_requests_total", "Users API requests (disconnect, revoke, presence, mailbox, entries) by route, HTTP status and service token name (empty: no token of this gateway's).", ["path", "status", "token"]);
    this.dispatchRequests = c("jetgate_gateway_dispatch_requests_total", "POST /v1/dispatch and /v1/dispatch/batch requests by HTTP status and service token name (empty: no token of this gateway's).", ["status", "token"]);
    this.serviceTokenReloads = c("jetgate_gateway_service_token_reloads_total", "Reloads of the service tokens (SIGHUP, or JETGATE_SERVICE_TOKENS_FILE changed), by outcome (ok; error: the tokens in force stayed).", ["outcome"]);
    this.serviceTokens = new Gauge({ name: "jetgate_gateway_service_tokens", help: "Service tokens this gateway takes now (JETGATE_SERVICE_TOKEN and the tokens file).", registers });
    this.serviceTokenNotAfter = new Gauge({ name: "jetgate_gateway_service_token_not_after_seconds", help: "Unix time after which a service token of the tokens file is refused (its not_after), by name.", labelNames: ["token"], registers });
    this.refusedUpgrades = c("jetgate_gateway_refused_upgrades_total", "WebSocket upgrades refused before a session, by reason (per_ip, dependency, capacity: JETGATE_MAX_CONNECTIONS).", ["reason"]);
    this.fileLimit = new Gauge({ name: "jetgate_gateway_file_limit", help: "The gateway's open files limit (soft, after raising it to the hard one at start).", registers });
    this.maxConnections = new Gauge({ name: "jetgate_gateway_max_connections", help: "Devices the gateway takes at once (JETGATE_MAX_CONNECTIONS, or the file limit less the files open at start and a reserve); more are answered 503.", registers });
    const openNow = () => this.openFilesNow();
    this.openFiles = new Gauge({ name: "jetgate_gateway_open_files", help: "Files the gateway has open (its last count).", registers, collect() { this.set(openNow()); } });
    this.acceptPauses = c("jetgate_gateway_accept_pauses_total", "Times the gateway stopped accepting connections for want of files (new ones refused until files were free again).");
    this.tailFills = c("jetgate_gateway_tail_fills_total", "Live sessions found behind their user's head, and filled: by the periodic tail check (a lost last push), or after their user's route was registered again (Redis had lost it).");
    this.devicesEvicted = c("jetgate_gateway_device_state_evicted_total", "Devices whose stored ACK state was dropped for a newer device of the same user (JETGATE_MAX_DEVICES_PER_USER).");
    this.registryRecord = new Gauge({ name: "jetgate_gateway_registry_record", help: "Stream seq of the last registry record this process applied (behind the others: its registry follower is stuck).", registers });
    const held = () => this.revocationCount();
    this.revocationsHeld = new Gauge({ name: "jetgate_gateway_revocations", help: "Token revocations this gateway holds in memory (those in force, and expired ones not yet forgotten).", registers, collect() { this.set(held()); } });
    this.revocationLoads = c("jetgate_gateway_revocation_loads_total", "Whole reads of the revocations in Redis, by why (start; log_gap: the change log no longer holds the last entry read: trimmed, or lost).", ["why"]);
    this.revocationChanges = c("jetgate_gateway_revocation_changes_total", "Revocations read from the change log in Redis (each also heard over NATS, unless the message was missed).");
    this.revocationsMalformed = c("jetgate_gateway_revocations_malformed_total", "Revocations in Redis that did not parse: skipped.");
    this.uwsBinary = new Gauge({ name: "jetgate_gateway_uws_binary_info", help: "1, labelled with the native uWebSockets.js module this gateway serves on (it starts on nothing else).", labelNames: ["binary"], registers });
    // 1 ms .. 10 s; a push later than that is an outage, which the +Inf bucket still counts
    this.pushLatency = new Histogram({
      name: "jetgate_gateway_push_latency_seconds",
      help: "Seconds from an entry's append (its ts) to this gateway receiving its live push, once per entry (not per device); clock skew below 0 counts as 0.",
      buckets: [...PUSH_LATENCY_BUCKETS_S],
      registers,
    });
    registerStageMetric(this.registry, "jetgate_gateway_stage_seconds", "Seconds an entry spends in each stage of its path in this gateway (docs/performance.md): dispatch_queue and dispatch_ack (POST /v1/dispatch, per entry), gateway_chain (a push received to its frame handed to the socket, per session).", this.stages);
    this.regressions.inc({ component: "gateway" }, 0);
    // entries per atomic batch = batched_entries / batches; a hot user's entries queued behind one in flight
    const fromStats = (name: string, help: string, field: keyof DispatchStats) => {
      const stats = () => this.dispatchStats();
      new Counter({ name, help, registers, collect() { this.reset(); this.inc(stats()[field]); } });
    };
    fromStats("jetgate_gateway_dispatch_entries_total", "Entries POST /v1/dispatch appended (acknowledged, duplicates included).", "appended");
    fromStats("jetgate_gateway_dispatch_batches_total", "Atomic batches POST /v1/dispatch committed (a user's entries queued behind one in flight).", "batches");
    fromStats("jetgate_gateway_dispatch_batched_entries_total", "Entries appended in atomic batches.", "batchedEntries");
    fromStats("jetgate_gateway_dispatch_batch_fallbacks_total", "Atomic batches refused or unanswered, whose entries went one at a time instead.", "batchFallbacks");
  }

  private readonly framesOutByType = new Map<string, Counter.Internal>();

  /** framesOut's child for `type`, looked up once: sends are the hot path (one per frame per device). */
  frameOut(type: string): Counter.Internal {
    let c = this.framesOutByType.get(type);
    if (c === undefined) this.framesOutByType.set(type, (c = this.framesOut.labels({ type })));
    return c;
  }
}
