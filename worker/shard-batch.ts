/**
 * A shard's batches under one epoch (docs/registry-and-worker.md, "A batch"): the offsets the
 * consumer skipped are read from the stream first, each entry gets its seq, Redis does its work
 * (one script call per Redis node, retried while Redis is away), the epoch is confirmed against
 * the registry's head, the pushes go to the gateways of each user (worker/push-router.ts) and the
 * entries of users a split moved are forwarded, then one AckAll ack of the highest offset. A crash
 * between any two steps re-processes the batch under a newer epoch. A batch is done in two parts,
 * `prepare` (up to the Redis step) and `emit` (the rest), so that the next batch's Redis step runs
 * while this one's confirmation, pushes and ack are in flight (worker/shard-pump.ts). The decisions
 * are pure (worker/batch-step.ts); this does the I/O between them, through the ports.
 */
import {
  backoffCeiling,
  composeSeq,
  sleep,
  systemClock,
  decodeStoredEntry,
  deriveSeq,
  entryOwner,
  entrySubject,
  parseEntrySubject,
  type Clock,
  type ShardState,
} from "../protocol/index.js";
import { writeRefusal } from "../protocol/io/index.js";
import { planBatch, pushesOf, type BatchItem } from "./batch-step.js";
import { RETRY_BACKOFF, type EpochGuard } from "./epoch-guard.js";
import type { ApplyEntryResult, BatchShared } from "./mailbox-script.js";
import type { DeliveredMsg, LogMsg, RunnerDeps } from "./shard-ports.js";

/** How often a runner records its floor while it acks: at most what a takeover after a lost consumer repeats. */
const FLOOR_RECORD_MS = 1000;

/** The runner's ports and parts this needs (every one but its worker id), and its shard. */
export type BatchDeps = Omit<RunnerDeps, "workerId"> & { shard: number };

interface Item extends BatchItem {
  msg: LogMsg;
  dispatch: string;
}

/** A batch through its Redis step, waiting to be emitted. */
export interface Prepared {
  batch: readonly DeliveredMsg[];
  /** The index of the message to ack, and the highest offset: see planBatch. */
  ack: number;
  maxOffset: number;
  items: Item[];
  forwards: LogMsg[];
  results: ApplyEntryResult[];
  /** The clock's monotonic time when the Redis step answered. */
  redisDone: number;
}

/** Where a runner's epoch starts: its consumer's first offset and its boundary's start (see planTakeover). */
export interface EpochStart {
  startOffset: number;
  boundaryStart: number;
}

export class ShardBatches {
  /** The last offset done (emitted and acked), the last one through the Redis step, and the seq of the last entry numbered. */
  private lastOffset: number;
  private plannedOffset: number;
  private lastSeq: bigint;
  private readonly label: { shard: string };
  private readonly settings: Omit<BatchShared, "shard" | "log">;
  /** The stage times, the push latency and the Redis retries' waits run on it (RunnerDeps.clock). */
  private readonly clock: Clock;
  /** When the floor was last recorded (the clock's monotonic ms), and whether a write is in flight. */
  private floorAt: number;
  private floorWriting = false;

  constructor(
    private readonly d: BatchDeps,
    private readonly guard: EpochGuard,
    private readonly start: EpochStart,
  ) {
    this.label = { shard: String(d.shard) };
    this.clock = d.clock ?? systemClock;
    const c = d.config;
    this.settings = {
      dedupTtlS: c.JETGATE_DEDUP_TTL_S > 0 ? c.JETGATE_DEDUP_TTL_S : c.JETGATE_STREAM_MAX_AGE_S,
      hotCacheMaxLen: c.JETGATE_HOT_CACHE_MAXLEN,
      hotCacheTtlS: c.JETGATE_HOT_CACHE_TTL_S,
      watermarkTtlS: Math.max(c.JETGATE_STREAM_MAX_AGE_S, c.JETGATE_HOT_CACHE_TTL_S),
    };
    // everything below the consumer's first offset counts as done
    this.lastOffset = start.startOffset - 1;
    this.plannedOffset = this.lastOffset;
    this.lastSeq = start.startOffset > 1 ? this.seqOf(start.startOffset - 1) : 0n;
    // the takeover recorded the start
    this.floorAt = this.clock.monotonic();
  }

  /** The last log offset done. */
  get offset(): number {
    return this.lastOffset;
  }

  /** The seq of an offset of the current log: this epoch's from its boundary on, older ones below. */
  private seqOf(offset: number): bigint {
    const epoch = this.guard.epoch;
    if (offset >= this.start.boundaryStart) return composeSeq(epoch, offset);
    const s = this.d.registry.state.shards.get(this.d.shard)!;
    return deriveSeq(s, s.log, offset) ?? composeSeq(epoch, offset);
  }

  /**
   * A batch's work before anything of it leaves the process: the skipped offsets read, the entries
   * numbered and the Redis step. It runs while the batch before it is still being emitted (its
   * confirmation, pushes and ack): Redis writes of a runner that turns out fenced are what a fenced
   * batch leaves today too, and harmless (docs/registry-and-worker.md, "A batch"). Undefined when the
   * runner must stop.
   */
  async prepare(batch: readonly DeliveredMsg[]): Promise<Prepared | undefined> {
    if (!this.guard.holds()) return undefined;
    const t0 = this.clock.monotonic();
    this.fetchWaits(batch);
    const shardState = this.d.registry.state.shards.get(this.d.shard)!;
    const items: Item[] = [];
    const forwards: LogMsg[] = [];
    const take = (m: LogMsg) => {
      const parsed = this.parse(m, shardState);
      if (parsed === "forward") forwards.push(m);
      else if (parsed !== undefined) items.push(parsed);
    };
    const plan = planBatch(batch.map((m) => m.seq), this.plannedOffset);
    for (const i of plan.take) {
      const hole = plan.holes.get(i);
      if (hole !== undefined) for (const x of await this.readSkipped(hole[0], hole[1])) take(x);
      take(batch[i]!);
    }
    const results = await this.redisStep(items);
    if (results === undefined) return undefined;
    this.fault("redis");
    // the next batch plans after this one: its Redis step comes after this one's, in offset order
    this.plannedOffset = plan.maxOffset;
    const t2 = this.clock.monotonic();
    this.d.metrics.stages.observe("worker_redis", (t2 - t0) / 1000, batch.length);
    return { batch, ack: plan.ack, maxOffset: plan.maxOffset, items, forwards, results, redisDone: t2 };
  }

  /**
   * What of a prepared batch leaves the process, in batch order (the pump emits one batch at a
   * time): the epoch confirmed against the registry's head, the pushes, a split's forwards, then
   * the ack. False when the runner must stop (fenced or stopping): nothing of the batch is pushed
   * or acked.
   */
  async emit(p: Prepared): Promise<boolean> {
    // Confirm the epoch against the registry's head before anything leaves this process.
    if (!(await this.guard.confirm())) return false;
    const t3 = this.clock.monotonic();
    const { pushes, duplicates } = pushesOf(p.items, p.results, this.d.shard, this.guard.epoch);
    if (duplicates > 0) this.d.metrics.duplicates.inc(this.label, duplicates);
    const now = this.clock.now();
    for (const x of pushes) {
      this.d.pushes.route(x.push, x.routes);
      this.d.metrics.pushLatency.observe(Math.max(0, now - x.push.entry.ts) / 1000);
    }
    // before the ack, on the same connection: a crash never acks an entry whose push is not out
    this.d.pushes.flush();
    if (p.forwards.length > 0) await this.forward(p.forwards);
    this.fault("push");
    // AckAll: everything up to the highest offset (a batch of redeliveries only: acked again, harmless)
    p.batch[p.ack]!.ack();
    this.recordFloor(p.maxOffset);
    const n = p.batch.length;
    // each of the batch's entries spent the batch's time in each step; the confirmation's includes
    // the wait for the batch before it to leave
    const stages = this.d.metrics.stages;
    stages.observe("worker_confirm", (t3 - p.redisDone) / 1000, n);
    stages.observe("worker_push", (this.clock.monotonic() - t3) / 1000, n);
    this.lastOffset = p.maxOffset;
    this.d.metrics.processed.inc(this.label, p.items.length + p.forwards.length);
    this.d.metrics.pushed.inc(this.label, pushes.length);
    this.d.metrics.batches.inc(this.label);
    this.d.metrics.offset.set(this.label, this.lastOffset);
    return true;
  }

  /**
   * The floor record (protocol/layout.ts, FloorRecord) at most once a FLOOR_RECORD_MS, one write in
   * flight, after the batch's pushes on the same connection. It may run ahead of the consumer's ack
   * floor by the ack in flight: everything up to it was pushed. Not written is only more repeats
   * after a lost consumer, so a failure is logged and the batches go on.
   */
  private recordFloor(offset: number): void {
    const now = this.clock.monotonic();
    if (this.floorWriting || now - this.floorAt < FLOOR_RECORD_MS) return;
    this.floorWriting = true;
    this.floorAt = now;
    this.d.shardLog.recordFloor(this.guard.epoch, offset).then(
      () => (this.floorWriting = false),
      (err: unknown) => {
        this.floorWriting = false;
        this.d.log.warn({ shard: this.d.shard, offset, err: (err as Error).message }, "could not record the floor");
      },
    );
  }

  /**
   * Each entry's time from the stream storing it to this batch (the server's clock against this
   * one's: one machine, or NTP). Read from the first and the last message only, and spread over
   * the ones between by their place: the delivery info is parsed from the reply subject on every
   * read (4-5% of the worker's CPU when every message was read), and a batch is in stream order.
   */
  private fetchWaits(batch: readonly DeliveredMsg[]): void {
    const first = batch[0]?.info?.timestampNanos;
    const last = batch[batch.length - 1]?.info?.timestampNanos;
    if (first === undefined || last === undefined) return;
    const now = this.clock.now();
    const n = batch.length;
    const waitFirst = Math.max(0, now - first / 1e6) / 1000;
    const waitLast = Math.max(0, now - last / 1e6) / 1000;
    if (n <= 2 || waitFirst === waitLast) {
      this.d.metrics.stages.observe("worker_fetch_wait", waitFirst, n - 1);
      this.d.metrics.stages.observe("worker_fetch_wait", waitLast, 1);
      return;
    }
    for (let i = 0; i < n; i++) this.d.metrics.stages.observe("worker_fetch_wait", waitFirst + ((waitLast - waitFirst) * i) / (n - 1));
  }

  /**
   * The messages at offsets from..to that the consumer skipped, from the stream; offsets retention
   * removed (below the stream's first) or never written are not there to read.
   */
  private async readSkipped(from: number, to: number): Promise<LogMsg[]> {
    const first = await this.d.shardLog.firstOffset();
    const out: LogMsg[] = [];
    for (let seq = Math.max(from, first); seq <= to; seq++) {
      const m = await this.d.shardLog.read(seq);
      if (m !== null) out.push(m);
    }
    if (out.length > 0) {
      this.d.metrics.deliveryGaps.inc(this.label, out.length);
      this.d.log.warn({ shard: this.d.shard, from, to, fetched: out.length }, "the consumer skipped offsets: fetched from the stream");
    }
    return out;
  }

  private parse(m: LogMsg, shardState: ShardState): Item | "forward" | undefined {
    const subj = parseEntrySubject(m.subject);
    try {
      if (subj === undefined || subj.shard !== this.d.shard) throw new Error(`unexpected subject ${m.subject}`);
      const seq = this.seqOf(m.seq);
      // Before any split every entry of a shard's stream is its own; only then is the hash worth it.
      if (shardState.splits.length > 0 && entryOwner(shardState, subj.user, seq) === "forward") return "forward";
      const body = decodeStoredEntry(m.data);
      if (seq <= this.lastSeq) this.d.metrics.regressions.inc({ component: "worker" });
      this.lastSeq = seq;
      return { msg: m, user: subj.user, lane: subj.lane, seq, id: body.id, dispatch: body.d, ts: body.ts, b: body.b };
    } catch (err) {
      this.d.metrics.badEntries.inc(this.label);
      this.d.log.warn({ shard: this.d.shard, offset: m.seq, err: (err as Error).message }, "skipping an unreadable entry");
      return undefined;
    }
  }

  /** The Redis work of a batch, retried with backoff while Redis is unavailable; undefined once fenced or stopping. */
  private async redisStep(items: Item[]): Promise<ApplyEntryResult[] | undefined> {
    if (items.length === 0) return [];
    const shared: BatchShared = { shard: this.d.shard, log: this.d.registry.state.shards.get(this.d.shard)!.log, ...this.settings };
    const entries = items.map((it) => ({ user: it.user, dispatch: it.dispatch, lane: it.lane, offset: it.msg.seq, seq: it.seq, body: it.msg.data }));
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.d.mailboxes.apply(shared, entries);
      } catch (err) {
        this.d.metrics.redisRetries.inc(this.label);
        if (attempt % 10 === 0) {
          const refusal = writeRefusal(err);
          this.d.log.warn({ shard: this.d.shard, err: (err as Error).message, attempt, ...(refusal ? { refusal } : {}) }, refusal ? `redis step failed: Redis refuses writes (${refusal}); retrying` : "redis step failed; retrying");
        }
        await sleep(this.clock, backoffCeiling(attempt, RETRY_BACKOFF));
        if (!this.guard.holds()) return undefined;
      }
    }
  }

  /** Entries for users another shard owns now (after a split) go there, same Nats-Msg-Id. */
  private async forward(msgs: LogMsg[]): Promise<void> {
    const map = this.d.registry.shards;
    await Promise.all(
      msgs.map(async (m) => {
        const subj = parseEntrySubject(m.subject)!;
        const target = map.shardOf(subj.user);
        if (target === undefined || target === this.d.shard) return;
        await this.d.shardLog.forward(entrySubject(target, subj.user, subj.lane), m.data, m.headers?.get("Nats-Msg-Id"));
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
}
