/**
 * Runs one owned shard: takeover (claim, resume or epoch bump), then ordered consumption in batches,
 * and on a planned stop the release of its epoch.
 *
 * Takeover: read the ack floor of the shard's worker consumers. An epoch an operation wrote (init,
 * `jetgate shard takeover`, split, rebuild, failover) that no worker has claimed yet is claimed: a
 * record that changes no epoch, consumed from that boundary's start. An epoch its owner released
 * (below) is claimed too, consumed from the offset after the release. Otherwise the worker appends
 * the epoch bump with start_offset = floor + 1 (see planTakeover). Either record is written only if
 * the shard is still as read (optimistic concurrency: of two racing workers one wins), and only
 * after it is acknowledged does the worker create this epoch's consumer `w_<epoch>` and delete the
 * older ones. A zombie owner's fetches and acks then fail, and it also stops as soon as its
 * registry view shows the newer epoch (fencing).
 *
 * Release (a planned stop: SIGTERM, rebalancing): stop consuming, finish the batch in hand, then
 * record that the epoch was given back at the last offset done. Nothing of this runner can be
 * pushed after that record, so the next owner needs no fence: same epoch, same numbering. A release
 * that cannot be written (NATS away, or a fence came first) leaves the epoch claimed: the next owner
 * bumps it, as after a crash.
 *
 * Batch: Redis work for every entry (one script call per Redis node), then pushes (routed to the
 * gateways of each user, worker/push-router.ts), then one AckAll ack of the highest offset. A crash
 * between any two steps re-processes the batch under a newer epoch.
 */
import type { Logger } from "pino";
import type { MsgHdrs, NatsConnection } from "@nats-io/transport-node";
import {
  AckPolicy,
  DeliverPolicy,
  jetstream,
  jetstreamManager,
  type ConsumerInfo,
  type ConsumerMessages,
  type JetStreamClient,
  type JetStreamManager,
  type JsMsg,
} from "@nats-io/jetstream";
import {
  registryRecord,
  backoffCeiling,
  isWorkerConsumer,
  processingFloor,
  workerConsumerName,
  bumpEpoch,
  claimEpoch,
  composeSeq,
  decodeStoredEntry,
  deriveSeq,
  entryOwner,
  entrySubject,
  parseEntrySubject,
  planTakeover,
  releaseEpoch,
  shardStream,
  type Config,
  type RedisKeys,
  type ShardState,
  type TakeoverPlan,
} from "../protocol/index.js";
import {
  CONSUME_OPTIONS,
  logOfStream,
  type RedisClient,
  type RegistryClient,
  writeRefusal,
} from "../protocol/io/index.js";
import { planBatch, pushesOf, type BatchItem } from "./batch-step.js";
import { applyBatch, type ApplyEntryResult, type BatchEntry, type BatchShared } from "./mailbox-script.js";
import type { WorkerMetrics } from "./metrics.js";
import type { PushRouter } from "./push-router.js";

export type RunnerState =
  | { type: "starting" }
  | { type: "running"; epoch: number }
  | { type: "stopped"; reason: string };

export interface RunnerDeps {
  nc: NatsConnection;
  redis: RedisClient;
  keys: RedisKeys;
  registry: RegistryClient;
  metrics: WorkerMetrics;
  log: Logger;
  workerId: string;
  /** Where pushes go: one router for every shard of the worker, flushed after each batch's pushes. */
  pushes: PushRouter;
  config: Pick<
    Config,
    | "JETGATE_WORKER_BATCH"
    | "JETGATE_WORKER_ACK_WAIT_S"
    | "JETGATE_HOT_CACHE_MAXLEN"
    | "JETGATE_HOT_CACHE_TTL_S"
    | "JETGATE_DEDUP_TTL_S"
    | "JETGATE_STREAM_MAX_AGE_S"
    | "JETGATE_FAULT_EXIT_AFTER"
  >;
}

const TAKEN: Record<TakeoverPlan["mode"], string> = {
  claim: "shard taken over (claimed the epoch)",
  resume: "shard taken over (resumed a released epoch: no epoch spent)",
  bump: "shard taken over (a new epoch fences the previous owner)",
};

/** Retries of Redis and of the registry while they are away: 100 ms doubling to 2 s. */
const RETRY_BACKOFF = { baseMs: 100, capMs: 2000 };
/** How long a read of the registry head confirms the epoch for (see confirmEpoch). */
const CONFIRM_FRESH_MS = 50;

/** A stream message as the runner uses it: from its consumer, or fetched by offset to fill a gap. */
interface StreamMsg {
  subject: string;
  seq: number;
  data: Uint8Array;
  headers?: MsgHdrs;
}

interface Item extends BatchItem {
  msg: StreamMsg;
  dispatch: string;
}

export class ShardRunner {
  private stateValue: RunnerState = { type: "starting" };
  private messages: ConsumerMessages | undefined;
  private loop: Promise<void> = Promise.resolve();
  private lastOffset = 0;
  private lastSeq = 0n;
  /** When (performance.now()) the registry head was last read and still showed this epoch. */
  private confirmedAt = -Infinity;
  /** Start of this runner's own boundary; offsets below it are numbered by older boundaries. */
  private boundaryStart = 1;
  private readonly js: JetStreamClient;
  private readonly stream: string;
  private readonly label: { shard: string };
  private unsubscribe: (() => void) | undefined;

  constructor(
    readonly shard: number,
    private readonly d: RunnerDeps,
  ) {
    this.js = jetstream(d.nc);
    this.stream = shardStream(shard);
    this.label = { shard: String(shard) };
  }

  get state(): RunnerState {
    return this.stateValue;
  }

  /** The last log offset this runner has done. */
  get offset(): number {
    return this.lastOffset;
  }

  /** The epoch this runner works under, once running. */
  get epoch(): number | undefined {
    return this.stateValue.type === "running" ? this.stateValue.epoch : undefined;
  }

  /** Takes the shard over and starts consuming; resolves once running (or stopped on failure). */
  start(): Promise<void> {
    this.starting = this.begin();
    return this.starting;
  }

  /** The takeover in hand: a stop waits for it, so a runner stopped meanwhile never starts consuming. */
  private starting: Promise<void> = Promise.resolve();
  private stopRequested = false;

  private async begin(): Promise<void> {
    try {
      const jsm = await jetstreamManager(this.d.nc);
      const taken = await this.takeover(jsm);
      if (taken === undefined) return;
      const { epoch, startOffset, boundaryStart, mode } = taken;
      this.boundaryStart = boundaryStart;
      this.lastOffset = startOffset - 1;
      this.stateValue = { type: "running", epoch };
      this.lastSeq = startOffset > 1 ? this.seqOf(epoch, startOffset - 1) : 0n;
      this.d.metrics.epoch.set(this.label, epoch);
      this.d.metrics.takeovers.inc({ ...this.label, mode });
      // stopped while taking over (a rebalancing, a SIGTERM): the epoch is this runner's, nothing
      // processed under it; the stop (or release) that is waiting ends it here
      if (this.stopRequested) return;
      this.unsubscribe = this.d.registry.onChange((s) => {
        const cur = s.shards.get(this.shard);
        if (cur !== undefined && this.superseded(cur, epoch)) this.fence(cur.epoch);
      });
      this.d.log.info({ shard: this.shard, epoch, startOffset, mode }, TAKEN[mode]);
      this.loop = (async () => {
        try {
          const consumer = await this.js.consumers.get(this.stream, workerConsumerName(epoch));
          this.messages = await consumer.consume({
            ...CONSUME_OPTIONS,
            max_messages: this.d.config.JETGATE_WORKER_BATCH * 2,
            abort_on_missing_resource: true,
          });
          if (this.stateValue.type !== "running") this.messages.stop();
          else await this.consumeLoop(this.messages, epoch);
        } catch (err) {
          this.d.log.error({ shard: this.shard, err }, "consuming failed");
          this.halt(`consuming failed: ${(err as Error).message}`);
        }
      })();
    } catch (err) {
      this.d.log.error({ shard: this.shard, err }, "takeover failed");
      this.stateValue = { type: "stopped", reason: `takeover failed: ${(err as Error).message}` };
    }
  }

  private async takeover(
    jsm: JetStreamManager,
  ): Promise<{ epoch: number; startOffset: number; boundaryStart: number; mode: TakeoverPlan["mode"] } | undefined> {
    // the registry's head: a release written just before the lease was let go must be seen, or
    // this would bump an epoch that is free to resume
    await this.d.registry.sync();
    const before = this.d.registry.state.shards.get(this.shard);
    if (before === undefined || before.status !== "active") {
      this.stateValue = { type: "stopped", reason: "shard is not active in the registry" };
      return undefined;
    }
    const info = await jsm.streams.info(this.stream);
    if (logOfStream(info) !== before.log) {
      this.stateValue = { type: "stopped", reason: `stream ${this.stream} is not log ${before.log} of the registry` };
      this.d.log.error({ shard: this.shard, stream: logOfStream(info), registry: before.log }, "stream/registry log mismatch: refusing the shard");
      return undefined;
    }
    const consumers = await listWorkerConsumers(jsm, this.stream);
    const floor = processingFloor(consumers);
    // Claim an operation's epoch, else bump. Consume from the floor (a claim: from the boundary's
    // start); a bump's new epoch starts at or above the current boundary (a split's cut may lie
    // above the floor: what is between is processed under the parent's older epoch).
    const { mode, startOffset, boundaryStart } = planTakeover(before, floor);
    let mine: ShardState | undefined;
    const written = await this.d.registry.update((state) => {
      const s = state.shards.get(this.shard);
      // Someone else bumped or claimed since we looked: they own it now.
      if (s === undefined || s.epoch !== before.epoch || s.owner !== before.owner) return null;
      mine =
        mode !== "bump"
          ? claimEpoch(s, this.d.workerId)
          : bumpEpoch(s, { cause: "takeover", start_offset: boundaryStart, owner: this.d.workerId });
      return registryRecord("takeover", this.d.workerId, [mine]);
    });
    if (written === null || mine === undefined) {
      this.stateValue = { type: "stopped", reason: "lost the takeover race" };
      return undefined;
    }
    // The epoch of the record this worker wrote (the state may already show a later record).
    const epoch: number = mine.epoch;
    const applied = written.state.shards.get(this.shard);
    if (applied === undefined || applied.epoch < epoch || this.superseded(applied, epoch)) {
      this.stateValue = { type: "stopped", reason: `takeover of epoch ${epoch} superseded or not applied` };
      return undefined;
    }
    // Only now, under the acknowledged epoch: this epoch's consumer, then retire the older ones. A
    // resumed epoch's consumer is the releaser's: made again to start after the released offset
    // (its ack floor may lag the release by the last ack). Dying in between leaves no consumer of
    // this epoch; the next takeover's start is then bounded by the released offset (processingStart).
    if (mode === "resume") await jsm.consumers.delete(this.stream, workerConsumerName(epoch)).catch(() => undefined);
    await jsm.consumers.add(this.stream, {
      durable_name: workerConsumerName(epoch),
      ack_policy: AckPolicy.All,
      deliver_policy: DeliverPolicy.StartSequence,
      opt_start_seq: startOffset,
      ack_wait: this.d.config.JETGATE_WORKER_ACK_WAIT_S * 1_000_000_000,
      max_ack_pending: 100_000,
    });
    for (const c of consumers) {
      if (c.name !== workerConsumerName(epoch)) await jsm.consumers.delete(this.stream, c.name).catch(() => undefined);
    }
    return { epoch, startOffset, boundaryStart, mode };
  }

  /**
   * True when the registry's view of the shard no longer lets this runner work under `epoch`: a
   * newer epoch, or (never written by a correct writer: applyRecord refuses it) the same epoch
   * owned by someone else.
   */
  private superseded(cur: ShardState, epoch: number): boolean {
    return cur.epoch > epoch || (cur.epoch === epoch && cur.owner !== this.d.workerId);
  }

  /** The seq of an offset of the current log: this epoch's from its boundary on, older ones below. */
  private seqOf(epoch: number, offset: number): bigint {
    if (offset >= this.boundaryStart) return composeSeq(epoch, offset);
    const s = this.d.registry.state.shards.get(this.shard)!;
    return deriveSeq(s, s.log, offset) ?? composeSeq(epoch, offset);
  }



  private fence(newEpoch: number): void {
    if (this.stateValue.type !== "running") return;
    this.d.metrics.fenced.inc(this.label);
    this.d.log.warn({ shard: this.shard, epoch: this.stateValue.epoch, newEpoch }, "fenced by a newer epoch: stopping the shard");
    this.halt(`fenced by epoch ${newEpoch}`);
  }

  private halt(reason: string): void {
    if (this.stateValue.type === "stopped") return;
    this.stateValue = { type: "stopped", reason };
    this.unsubscribe?.();
    this.messages?.stop();
  }

  /** Stops after the takeover and the batch in hand; resolves when the loop has ended. */
  async stop(reason: string): Promise<void> {
    this.stopRequested = true;
    await this.starting;
    this.halt(reason);
    await this.loop;
  }

  /**
   * A planned stop: stops after the batch in hand, then records that this runner's epoch is given
   * back at the last offset done, so the next owner resumes it without a new epoch. `released`
   * once the record is acknowledged; `fenced` when the registry no longer shows this runner as
   * the epoch's owner; `failed` when the record could not be written within `timeoutMs` (NATS
   * away): the epoch stays claimed and the next owner bumps it. Either way nothing more is pushed.
   */
  async release(reason: string, timeoutMs: number): Promise<{ outcome: "released" | "fenced" | "failed"; epoch?: number; offset: number; error?: string }> {
    this.stopRequested = true;
    await this.starting;
    const epoch = this.epoch;
    await this.stop(reason);
    const offset = this.lastOffset;
    if (epoch === undefined) return { outcome: "fenced", offset };
    let timer: NodeJS.Timeout | undefined;
    try {
      const write = this.d.registry.update((state) => {
        const s = state.shards.get(this.shard);
        if (s === undefined || s.epoch !== epoch || s.owner !== this.d.workerId) return null;
        return registryRecord("release", this.d.workerId, [releaseEpoch(s, this.d.workerId, offset)]);
      });
      // a write that answers after the timeout must not become an unhandled rejection
      write.catch(() => undefined);
      const timeout = new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`no answer from the registry within ${timeoutMs} ms`)), timeoutMs);
      });
      const written = await Promise.race([write, timeout]);
      if (written === null) return { outcome: "fenced", epoch, offset };
      // appended, but applied? (a registry of an older version refuses the record)
      const now = written.state.shards.get(this.shard);
      if (now?.epoch !== epoch || now.owner !== null || now.released_offset !== offset) return { outcome: "failed", epoch, offset, error: "the release record was not applied" };
      return { outcome: "released", epoch, offset };
    } catch (err) {
      return { outcome: "failed", epoch, offset, error: (err as Error).message };
    } finally {
      clearTimeout(timer);
    }
  }

  private isCurrent(epoch: number): boolean {
    if (this.stateValue.type !== "running" || this.stateValue.epoch !== epoch) return false;
    const s = this.d.registry.state.shards.get(this.shard);
    if (s !== undefined && this.superseded(s, epoch)) {
      this.fence(s.epoch);
      return false;
    }
    return true;
  }

  /**
   * A reader moves messages from the consumer into a local queue; the processor takes everything
   * queued (up to a batch) as one batch and never waits to fill one, so a live entry is pushed as
   * soon as the batch before it is done. The queue is bounded: the reader pauses above it.
   */
  private async consumeLoop(messages: ConsumerMessages, epoch: number): Promise<void> {
    const batchSize = this.d.config.JETGATE_WORKER_BATCH;
    const queue: JsMsg[] = [];
    let wake: (() => void) | undefined;
    let room: (() => void) | undefined;
    let readerDone = false;
    const reader = (async () => {
      try {
        for await (const m of messages) {
          queue.push(m);
          wake?.();
          if (queue.length >= batchSize * 2) await new Promise<void>((r) => (room = r));
        }
      } catch (err) {
        this.d.log.error({ shard: this.shard, err }, "consume failed");
      } finally {
        readerDone = true;
        wake?.();
      }
    })();
    while (this.stateValue.type === "running") {
      if (queue.length === 0) {
        if (readerDone) break;
        await new Promise<void>((r) => (wake = r));
        wake = undefined;
        continue;
      }
      const batch = queue.splice(0, batchSize);
      room?.();
      room = undefined;
      try {
        if (!(await this.processBatch(batch, epoch))) break;
      } catch (err) {
        this.d.log.error({ shard: this.shard, err }, "batch failed");
        break;
      }
    }
    this.halt(this.stateValue.type === "stopped" ? this.stateValue.reason : "consumer ended");
    room?.();
    await reader;
  }

  /** Processes one batch; false when the runner must stop (fenced or stopping). */
  private async processBatch(batch: JsMsg[], epoch: number): Promise<boolean> {
    if (!this.isCurrent(epoch)) return false;
    const shardState = this.d.registry.state.shards.get(this.shard)!;
    const items: Item[] = [];
    const forwards: StreamMsg[] = [];
    const take = (m: StreamMsg) => {
      const parsed = this.parse(m, epoch, shardState);
      if (parsed === "forward") forwards.push(m);
      else if (parsed !== undefined) items.push(parsed);
    };
    const plan = planBatch(batch.map((m) => m.seq), this.lastOffset);
    for (const i of plan.take) {
      const hole = plan.holes.get(i);
      if (hole !== undefined) for (const x of await this.fetchSkipped(hole[0], hole[1])) take(x);
      take(batch[i]!);
    }
    const results = await this.redisStep(items, epoch);
    if (results === undefined) return false;
    this.fault("redis");
    // Confirm the epoch against the registry's head before anything leaves this process.
    if (!(await this.confirmEpoch(epoch))) return false;
    const { pushes, duplicates } = pushesOf(items, results, this.shard, epoch);
    if (duplicates > 0) this.d.metrics.duplicates.inc(this.label, duplicates);
    const now = Date.now();
    for (const p of pushes) {
      this.d.pushes.route(p.push, p.routes);
      this.d.metrics.pushLatency.observe(Math.max(0, now - p.push.entry.ts) / 1000);
    }
    // before the ack, on the same connection: a crash never acks an entry whose push is not out
    this.d.pushes.flush();
    if (forwards.length > 0) await this.forward(forwards);
    this.fault("push");
    // AckAll: everything up to the highest offset (a batch of redeliveries only: acked again, harmless)
    batch[plan.ack]!.ack();
    this.lastOffset = plan.maxOffset;
    this.d.metrics.processed.inc(this.label, items.length + forwards.length);
    this.d.metrics.pushed.inc(this.label, pushes.length);
    this.d.metrics.batches.inc(this.label);
    this.d.metrics.offset.set(this.label, this.lastOffset);
    return true;
  }

  /**
   * The messages at offsets from..to that the consumer skipped, from the stream's leader; offsets
   * retention removed (below the stream's first) or never written are not there to fetch.
   */
  private async fetchSkipped(from: number, to: number): Promise<StreamMsg[]> {
    const jsm = (this.jsm ??= await jetstreamManager(this.d.nc));
    const first = (await jsm.streams.info(this.stream)).state.first_seq;
    const out: StreamMsg[] = [];
    for (let seq = Math.max(from, first); seq <= to; seq++) {
      const sm = await jsm.streams.getMessage(this.stream, { seq });
      if (sm !== null) out.push({ subject: sm.subject, seq: sm.seq, data: sm.data, headers: sm.header });
    }
    if (out.length > 0) {
      this.d.metrics.deliveryGaps.inc(this.label, out.length);
      this.d.log.warn({ shard: this.shard, from, to, fetched: out.length }, "the consumer skipped offsets: fetched from the stream");
    }
    return out;
  }

  private jsm: JetStreamManager | undefined;

  private parse(m: StreamMsg, epoch: number, shardState: ShardState): Item | "forward" | undefined {
    const subj = parseEntrySubject(m.subject);
    try {
      if (subj === undefined || subj.shard !== this.shard) throw new Error(`unexpected subject ${m.subject}`);
      const seq = this.seqOf(epoch, m.seq);
      // Before any split every entry of a shard's stream is its own; only then is the hash worth it.
      if (shardState.splits.length > 0 && entryOwner(shardState, subj.user, seq) === "forward") return "forward";
      const body = decodeStoredEntry(m.data);
      if (seq <= this.lastSeq) this.d.metrics.regressions.inc({ component: "worker" });
      this.lastSeq = seq;
      return { msg: m, user: subj.user, lane: subj.lane, seq, id: body.id, dispatch: body.d, ts: body.ts, b: body.b };
    } catch (err) {
      this.d.metrics.badEntries.inc(this.label);
      this.d.log.warn({ shard: this.shard, offset: m.seq, err: (err as Error).message }, "skipping an unreadable entry");
      return undefined;
    }
  }

  /** The Redis work of a batch, retried with backoff while Redis is unavailable. */
  private async redisStep(items: Item[], epoch: number): Promise<ApplyEntryResult[] | undefined> {
    if (items.length === 0) return [];
    const c = this.d.config;
    const shared: BatchShared = {
      shard: this.shard,
      log: this.d.registry.state.shards.get(this.shard)!.log,
      dedupTtlS: c.JETGATE_DEDUP_TTL_S > 0 ? c.JETGATE_DEDUP_TTL_S : c.JETGATE_STREAM_MAX_AGE_S,
      hotCacheMaxLen: c.JETGATE_HOT_CACHE_MAXLEN,
      hotCacheTtlS: c.JETGATE_HOT_CACHE_TTL_S,
      watermarkTtlS: Math.max(c.JETGATE_STREAM_MAX_AGE_S, c.JETGATE_HOT_CACHE_TTL_S),
    };
    const entries: BatchEntry[] = items.map((it) => ({ user: it.user, dispatch: it.dispatch, lane: it.lane, offset: it.msg.seq, seq: it.seq, body: it.msg.data }));
    for (let attempt = 0; ; attempt++) {
      try {
        return await applyBatch(this.d.redis, this.d.keys, shared, entries);
      } catch (err) {
        this.d.metrics.redisRetries.inc(this.label);
        if (attempt % 10 === 0) {
          const refusal = writeRefusal(err);
          this.d.log.warn({ shard: this.shard, err: (err as Error).message, attempt, ...(refusal ? { refusal } : {}) }, refusal ? `redis step failed: Redis refuses writes (${refusal}); retrying` : "redis step failed; retrying");
        }
        await new Promise((r) => setTimeout(r, backoffCeiling(attempt, RETRY_BACKOFF)));
        if (!this.isCurrent(epoch)) return undefined;
      }
    }
  }

  /**
   * True once the registry, read up to its head, still shows `epoch`; retried while NATS is away.
   * A confirmation younger than CONFIRM_FRESH_MS (monotonic clock, which also runs while the
   * process is stopped) stands for the next batches: a worker woken from SIGSTOP, or stalled for
   * any other reason, always reads the head again before it pushes.
   */
  private async confirmEpoch(epoch: number): Promise<boolean> {
    if (performance.now() - this.confirmedAt < CONFIRM_FRESH_MS) return this.isCurrent(epoch);
    for (let attempt = 0; ; attempt++) {
      if (!this.isCurrent(epoch)) return false;
      try {
        const asked = performance.now();
        await this.d.registry.sync();
        this.confirmedAt = asked;
        return this.isCurrent(epoch);
      } catch (err) {
        if (attempt % 10 === 0) this.d.log.warn({ shard: this.shard, err: (err as Error).message }, "cannot confirm the epoch; retrying");
        await new Promise((r) => setTimeout(r, backoffCeiling(attempt, RETRY_BACKOFF)));
      }
    }
  }

  /** Entries for users another shard owns now (after a split) go there, same Nats-Msg-Id. */
  private async forward(msgs: StreamMsg[]): Promise<void> {
    const map = this.d.registry.shards;
    await Promise.all(
      msgs.map(async (m) => {
        const subj = parseEntrySubject(m.subject)!;
        const target = map.shardOf(subj.user);
        if (target === undefined || target === this.shard) return;
        const msgID = m.headers?.get("Nats-Msg-Id");
        await this.js.publish(entrySubject(target, subj.user, subj.lane), m.data, msgID ? { msgID } : {});
        this.d.metrics.forwarded.inc(this.label);
      }),
    );
  }

  /** Test-only: die here, as hard as a power cut, when configured to. */
  private fault(step: "redis" | "push"): void {
    if (this.d.config.JETGATE_FAULT_EXIT_AFTER === step) {
      this.d.log.warn({ step }, "fault hook: SIGKILL");
      process.kill(process.pid, "SIGKILL");
    }
  }

  /**
   * Entries of the shard stream this runner has not finished: not yet delivered to its consumer,
   * or delivered and still waiting (for Redis, say). Counting only the undelivered ones read 0
   * through the first half minute of a Redis that refused writes: the consumer had delivered a
   * batch's worth, and stopped delivering, long before.
   */
  async lag(jsm: JetStreamManager): Promise<number | undefined> {
    const epoch = this.epoch;
    if (epoch === undefined) return undefined;
    const info = await jsm.consumers.info(this.stream, workerConsumerName(epoch));
    return info.num_pending + Math.max(0, info.delivered.stream_seq - this.lastOffset);
  }
}

async function listWorkerConsumers(jsm: JetStreamManager, stream: string): Promise<ConsumerInfo[]> {
  const out: ConsumerInfo[] = [];
  for await (const c of jsm.consumers.list(stream)) {
    if (isWorkerConsumer(c.name)) out.push(c);
  }
  return out;
}
