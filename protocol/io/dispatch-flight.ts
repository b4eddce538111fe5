/**
 * The Dispatcher's appends in flight, from an entry scheduled to its result, over a DispatchLink.
 *
 * Each user has a chain: one unit in flight at a time (an entry, or an atomic batch of the entries
 * queued behind, protocol/dispatch-units.ts), the next only after it is acknowledged or has failed
 * for good, so a user's entries land in the order they were scheduled, retries included. A batch
 * refused or unanswered is not sent again as a batch: its entries go back to the head of the
 * user's queue and go one at a time, with the same Nats-Msg-Ids, before anything behind them.
 * Different users are pipelined, up to `maxInFlight` entries and `maxInFlightBytes` entry bytes.
 *
 * While NATS stalls (its connection open, nothing read) the window also bounds what nats.js holds:
 * a unit is published again only once nats-server has read its last publish (afterDeadline), and a
 * unit that ends while its last publish is unread keeps its place in the window until it is read
 * or its connection is gone. Every publish is numbered (its reply token); an answer, or a PING
 * answered (DispatchLink.flush), says nats-server has read every publish up to that number.
 */
import { afterDeadline, appendedByAnother, batchAck, entryAck, retryDelayMs, type AckAnswer } from "../dispatch-ack.js";
import { DISPATCH_SLICE, QUEUED_ENTRY_COST, type DispatchRegistryView, type DispatchResult } from "../dispatch-request.js";
import { nextUnit, type BatchLimits } from "../dispatch-units.js";
import type { Clock, TimerHandle } from "../clock.js";
import type { MailboxSeq } from "../seq.js";
import type { DispatchLink } from "./dispatch-link.js";
import { PublishReads } from "./dispatch-reads.js";

/** Counters of a Dispatcher's life, for metrics. */
export interface DispatchStats {
  /** Entries appended (acknowledged, duplicates included). */
  appended: number;
  /** Publish attempts after the first, over all entries. */
  retries: number;
  /** Ack deadlines that passed while nats-server had not read the publish: held, no copy sent (afterDeadline). */
  held: number;
  /** Entries whose result was an error. */
  failed: number;
  /** Atomic batches committed, and the entries in them. */
  batches: number;
  batchedEntries: number;
  /** Batches refused or unanswered, whose entries went one at a time instead. */
  batchFallbacks: number;
}

/** One `dispatch()` call: its results, filled in as its jobs finish. */
export interface Call {
  results: DispatchResult[];
  remaining: number;
  resolve: (r: DispatchResult[]) => void;
}

/** One entry for one recipient, from first publish to its result. */
export interface Job {
  user: string;
  shard: number;
  subject: string;
  data: Uint8Array;
  /** Its Nats-Msg-Id; the headers are built at each publish, so a queued job holds a string, not a header map. */
  msgId: string;
  /** Ack deadlines it has had: one per publish, one per deadline held (afterDeadline). */
  attempt: number;
  deadline: number;
  call: Call;
  index: number;
  /** Sent alone from now on: it was in a batch that failed. */
  solo: boolean;
  /** An earlier publish of it (alone or in its batch) went unanswered and may have landed. */
  unanswered: boolean;
  /** The number of its last publish (0: none yet). */
  mark: number;
  /** Its publish was not read yet at its last ack deadline (afterDeadline). */
  heldLast?: boolean;
  /** When it was scheduled, and first published (the clock's monotonic time; 0: not yet): its queue wait and its ack's. */
  queuedAt: number;
  sentAt: number;
}

/** A user's entries sent as one atomic batch: consecutive in the user's order, one shard stream. */
interface Batch {
  user: string;
  shard: number;
  jobs: Job[];
  bytes: number;
  deadline: number;
  attempt: number;
  mark: number;
  heldLast?: boolean;
  sentAt: number;
}

/** What holds one in-flight place of a user: an entry, or a batch of them. */
type Unit = Job | Batch;
const isBatch = (u: Unit): u is Batch => "jobs" in u;
const unitBytes = (u: Unit) => (isBatch(u) ? u.bytes : u.data.byteLength);
const unitSize = (u: Unit) => (isBatch(u) ? u.jobs.length : 1);

/**
 * Where an entry's time goes in the Dispatcher, per entry, in seconds: `queue` from `dispatch` to
 * its first publish, `ack` from its first publish to the ack that settles it (retries included).
 */
export interface DispatchTimings {
  queued(seconds: number): void;
  acked(seconds: number): void;
}

export interface FlightOptions extends BatchLimits {
  /** How long to wait for one publish's ack before retrying it. */
  ackTimeoutMs: number;
  /** Ack deadlines per entry (one per publish, one per deadline held) before its result is DISPATCH_TIMEOUT. */
  attempts: number;
  timings?: DispatchTimings | undefined;
  /** The ack deadlines, the sweeper, the retry delays and the stage times run on it. */
  clock: Clock;
}

export class DispatchFlight {
  readonly stats: DispatchStats = { appended: 0, retries: 0, held: 0, failed: 0, batches: 0, batchedEntries: 0, batchFallbacks: 0 };
  private nextBatch = 0;
  /** Units awaiting an ack, by reply token; insertion order is deadline order. */
  private readonly pending = new Map<string, Unit>();
  /** Users with a unit in flight, and the jobs waiting behind it (the per-user order); null: none waiting. */
  private readonly users = new Map<string, Job[] | null>();
  /** Units of users waiting for an in-flight place. */
  private readonly waiting: Unit[] = [];
  /** Units holding a place, to be published at the end of this event-loop turn (publishOutbox). */
  private readonly outbox: Unit[] = [];
  /** Units done whose last publish nats-server has not read: their places are kept until it has (releaseRead). */
  private readonly unreadDone: Unit[] = [];
  /** Atomic batches in flight per shard. */
  private readonly openBatches = new Map<number, number>();
  /** Shards whose stream refused atomic publish (made by an older jetgate before `registry init`): entries go one by one. */
  private readonly atomicOff = new Set<number>();
  private inFlight = 0;
  private inFlightBytesNow = 0;
  /** What the jobs not yet settled count (queuedCost): the intake refuses what does not fit. */
  private queued = 0;
  private outboxScheduled = false;
  private readonly reads: PublishReads;
  private readonly sweeper: TimerHandle;

  constructor(
    private readonly link: DispatchLink,
    private readonly shards: () => DispatchRegistryView,
    private readonly opts: FlightOptions,
  ) {
    link.listen((token, answer) => this.onAnswer(token, answer));
    this.reads = new PublishReads(link, () => {
      if (this.unreadDone.length > 0) this.releaseRead();
    }, opts.ackTimeoutMs / 4);
    // One timer for every ack deadline instead of one per publish.
    this.sweeper = opts.clock.setInterval(() => this.sweep(), Math.max(10, Math.min(100, Math.floor(opts.ackTimeoutMs / 4))));
  }

  /** Entry bytes of the publishes awaiting an ack now, or done but not yet read by nats-server (bounded by `maxInFlightBytes`). */
  get inFlightBytes(): number {
    return this.inFlightBytesNow;
  }

  /** What the jobs scheduled and not yet settled count (queuedCost). */
  get queuedBytes(): number {
    return this.queued;
  }

  /** Takes the job in its user's order: now, if the user has nothing in flight, else behind the user's others. */
  schedule(job: Job): void {
    this.queued += job.data.byteLength + QUEUED_ENTRY_COST;
    if (this.opts.timings !== undefined) job.queuedAt = this.opts.clock.monotonic();
    const queue = this.users.get(job.user);
    if (queue !== undefined) {
      // behind this user's job in flight: order per user
      if (queue === null) this.users.set(job.user, [job]);
      else queue.push(job);
      return;
    }
    this.users.set(job.user, null);
    this.admit(job);
  }

  /** The unit (its user's next) takes a place when there is one, else waits for one, in arrival order. */
  private admit(unit: Unit): void {
    if (this.waiting.length === 0 && this.fits(unit)) this.send(unit);
    else this.waiting.push(unit);
  }

  /** A place and room in the byte window (always, when nothing is in flight: a body larger than the window goes alone). */
  private fits(unit: Unit): boolean {
    return this.inFlight === 0 || (this.inFlight + unitSize(unit) <= this.opts.maxInFlight && this.inFlightBytesNow + unitBytes(unit) <= this.opts.maxInFlightBytes);
  }

  /** The next unit of a user's queue (non-empty): its first job alone, or a batch (nextUnit). */
  private takeUnit(queue: Job[]): Unit {
    const shard = queue[0]!.shard;
    const open = this.openBatches.get(shard) ?? 0;
    const { n, bytes } = nextUnit(queue, this.opts, { atomicOff: this.atomicOff.has(shard), open });
    if (n === 1) return queue.shift()!;
    this.openBatches.set(shard, open + 1);
    return { user: queue[0]!.user, shard, jobs: queue.splice(0, n), bytes, deadline: 0, attempt: 0, mark: 0, sentAt: 0 };
  }

  /** Takes the unit's in-flight place; it is published with the rest of this event-loop turn's. */
  private send(unit: Unit): void {
    this.inFlight += unitSize(unit);
    this.inFlightBytesNow += unitBytes(unit);
    this.toOutbox(unit);
  }

  private toOutbox(unit: Unit): void {
    this.outbox.push(unit);
    if (!this.outboxScheduled) {
      this.outboxScheduled = true;
      setImmediate(this.publishOutbox);
    }
  }

  /** Gives back the unit's place in the window. */
  private release(unit: Unit): void {
    this.inFlight -= unitSize(unit);
    this.inFlightBytesNow -= unitBytes(unit);
  }

  /** Gives back the place of a unit that is done, once nats-server has read its last publish (nats.js holds it until then). */
  private releaseWhenRead(unit: Unit): void {
    if (this.reads.isRead(unit.mark)) this.release(unit);
    else this.unreadDone.push(unit);
  }

  /**
   * Publishes the units sent since the last call, in order, up to DISPATCH_SLICE entries in one
   * synchronous run, so nats.js writes them to the socket together: a caller that awaits each
   * dispatch would otherwise cost one socket write (and one read in nats-server) per entry. More
   * wait for the next turn: ten thousand publishes in one run held the event loop for tens of
   * milliseconds.
   */
  private readonly publishOutbox = (): void => {
    let take = 0;
    for (let n = 0; take < this.outbox.length && n < DISPATCH_SLICE; take++) n += unitSize(this.outbox[take]!);
    const units = this.outbox.splice(0, take);
    if (this.outbox.length > 0) setImmediate(this.publishOutbox);
    else this.outboxScheduled = false;
    const deadline = this.opts.clock.now() + this.opts.ackTimeoutMs;
    const timings = this.opts.timings;
    const at = timings !== undefined ? this.opts.clock.monotonic() : 0;
    for (const unit of units) {
      if (timings !== undefined && unit.sentAt === 0) this.firstSent(unit, at, timings);
      unit.deadline = deadline;
      unit.attempt++;
      const before = unit.mark;
      unit.mark = this.reads.next();
      const token = unit.mark.toString(36);
      this.pending.set(token, unit);
      try {
        if (isBatch(unit)) this.publishBatch(unit, token);
        else this.link.publish(unit.subject, unit.data, unit.msgId, token);
      } catch (err) {
        this.pending.delete(token);
        if (!isBatch(unit)) unit.mark = before; // nothing of it reached nats.js (a batch's first entries may have)
        this.failedUnit(unit, err instanceof Error ? err.message : String(err), false);
      }
    }
  };

  /** The unit's first publish: each of its entries' queue wait, and the time their ack waits are counted from. */
  private firstSent(unit: Unit, at: number, timings: DispatchTimings): void {
    unit.sentAt = at;
    // a batch holds only entries never sent (those of a failed batch go again alone, already timed)
    for (const job of isBatch(unit) ? unit.jobs : [unit]) {
      timings.queued((at - job.queuedAt) / 1000);
      job.sentAt = at;
    }
  }

  /** One atomic batch: every entry but the last staged without an answer, the last commits and is answered for all. */
  private publishBatch(batch: Batch, token: string): void {
    const id = `${this.link.name}.${(this.nextBatch++).toString(36)}`;
    const last = batch.jobs.length - 1;
    for (let i = 0; i <= last; i++) {
      const job = batch.jobs[i]!;
      this.link.publishInBatch(job.subject, job.data, job.msgId, i === last ? { id, index: i + 1, commit: token } : { id, index: i + 1 });
    }
  }

  private sweep(): void {
    const now = this.opts.clock.now();
    for (const [token, unit] of this.pending) {
      if (unit.deadline > now) break;
      this.pending.delete(token);
      this.deadlinePassed(unit, token, now);
    }
    this.reads.tick(now);
  }

  /** Gives back the places of units done whose last publish has now been read, and fills them. */
  private releaseRead(): void {
    let kept = 0;
    for (const unit of this.unreadDone) {
      if (this.reads.isRead(unit.mark)) this.release(unit);
      else this.unreadDone[kept++] = unit;
    }
    this.unreadDone.length = kept;
    this.fill();
  }

  private deadlinePassed(unit: Unit, token: string, now: number): void {
    const why = `ack timeout after ${this.opts.ackTimeoutMs} ms`;
    const read = this.reads.isRead(unit.mark);
    const what = afterDeadline(read, unit.heldLast === true, unit.attempt, this.opts.attempts);
    unit.heldLast = what === "hold" && !read;
    if (what === "retry") this.failedUnit(unit, why, true);
    else if (what === "hold") {
      if (!read) this.stats.held++;
      unit.attempt++;
      unit.deadline = now + this.opts.ackTimeoutMs;
      this.pending.set(token, unit); // last in deadline order; its answer still settles it
    } else if (isBatch(unit)) {
      this.closeBatch(unit);
      for (const job of unit.jobs) this.settle(job, this.timedOut(job, why));
      this.releaseWhenRead(unit);
      this.advance(unit.user);
    } else this.finish(unit, this.timedOut(unit, why));
  }

  /** No answer, or the publish was refused by the client: worth another attempt. `unanswered`: it may have landed. */
  private failedUnit(unit: Unit, why: string, unanswered: boolean): void {
    if (isBatch(unit)) {
      if (unanswered) for (const job of unit.jobs) job.unanswered = true;
      this.failedBatch(unit, false);
    } else {
      if (unanswered) unit.unanswered = true;
      this.failedAttempt(unit, why, true);
    }
  }

  /**
   * A batch refused, or not answered in time (it may yet be appended, whole): its entries go back to
   * the head of their user's queue, to be sent one at a time with the same Nats-Msg-Ids, so each
   * either lands after the one before it or answers duplicate (the batch landed). Their order and
   * their place before the user's later entries are kept. A stream without atomic publish gets no
   * more batches from this Dispatcher.
   */
  private failedBatch(batch: Batch, atomicOff: boolean): void {
    this.stats.batchFallbacks++;
    if (atomicOff) this.atomicOff.add(batch.shard);
    this.closeBatch(batch);
    this.releaseWhenRead(batch);
    for (const job of batch.jobs) job.solo = true;
    const queue = this.users.get(batch.user);
    this.users.set(batch.user, queue ? [...batch.jobs, ...queue] : batch.jobs.slice());
    this.advance(batch.user);
  }

  private closeBatch(batch: Batch): void {
    const open = (this.openBatches.get(batch.shard) ?? 1) - 1;
    if (open > 0) this.openBatches.set(batch.shard, open);
    else this.openBatches.delete(batch.shard);
  }

  private failedAttempt(job: Job, why: string, retryable: boolean): void {
    if (!retryable) {
      this.finish(job, { user: job.user, shard: job.shard, error: { code: "DISPATCH_REJECTED", message: why } });
      return;
    }
    if (job.attempt >= this.opts.attempts) {
      this.finish(job, this.timedOut(job, why));
      return;
    }
    // Same Nats-Msg-Id: JetStream drops the copy if the first attempt did land. It keeps its place meanwhile.
    this.opts.clock.setTimeout(() => {
      this.stats.retries++;
      this.toOutbox(job);
    }, retryDelayMs(job.attempt));
  }

  /** Said as it is: the entry may have landed (only its ack was not seen). */
  private timedOut(job: Job, why: string): DispatchResult {
    const message = `not confirmed after ${this.opts.attempts} attempts (${why}): it may or may not have been appended; send the same dispatch again, an appended one answers duplicate`;
    return { user: job.user, shard: job.shard, error: { code: "DISPATCH_TIMEOUT", message } };
  }

  private finish(job: Job, result: DispatchResult): void {
    this.settle(job, result);
    this.releaseWhenRead(job);
    this.advance(job.user);
  }

  /** The job's result. */
  private settle(job: Job, result: DispatchResult): void {
    if ("error" in result) this.stats.failed++;
    else {
      this.stats.appended++;
      if (this.opts.timings !== undefined && job.sentAt > 0) this.opts.timings.acked((this.opts.clock.monotonic() - job.sentAt) / 1000);
    }
    this.queued -= job.data.byteLength + QUEUED_ENTRY_COST;
    const call = job.call;
    call.results[job.index] = result;
    if (--call.remaining === 0) call.resolve(call.results);
  }

  /** The user's unit in flight is done: its next unit joins the waiting line (keeping the user's place), and waiting units take free places. */
  private advance(user: string): void {
    const queue = this.users.get(user);
    if (queue === undefined || queue === null || queue.length === 0) this.users.delete(user);
    else {
      this.waiting.push(this.takeUnit(queue));
      if (queue.length === 0) this.users.set(user, null);
    }
    this.fill();
  }

  private fill(): void {
    while (this.waiting.length > 0 && this.fits(this.waiting[0]!)) this.send(this.waiting.shift()!);
  }

  private onAnswer(token: string, answer: AckAnswer): void {
    const unit = this.pending.get(token);
    if (!unit) return; // a late ack of a publish sent again since, or of a unit given up
    this.pending.delete(token);
    this.reads.readUpTo(unit.mark);
    if (isBatch(unit)) {
      this.onBatchAnswer(unit, answer);
      return;
    }
    const ack = entryAck(answer);
    if (ack.type === "failed") this.failedAttempt(unit, ack.message, ack.retryable);
    else if (ack.duplicate && unit.unanswered) this.ownDuplicate(unit, ack.offset);
    else this.finish(unit, this.resultAt(unit, ack.offset, ack.duplicate));
  }

  /**
   * A duplicate after an unanswered attempt of its own: appended, but by that attempt or by a
   * caller's earlier request? The stored bytes say (appendedByAnother). The user's next entry goes
   * now; only the result waits for the read.
   */
  private ownDuplicate(job: Job, offset: number): void {
    const result = this.resultAt(job, offset, false);
    if ("error" in result) {
      this.finish(job, result);
      return;
    }
    this.release(job);
    this.advance(job.user);
    this.link.stored(job.shard, offset, this.opts.ackTimeoutMs).then(
      (stored) => this.settle(job, { ...result, duplicate: appendedByAnother(stored, job.data) }),
      () => this.settle(job, result),
    );
  }

  private onBatchAnswer(batch: Batch, answer: AckAnswer): void {
    const n = batch.jobs.length;
    const ack = batchAck(answer, n);
    if (ack.type === "refused") {
      this.failedBatch(batch, ack.atomicOff);
      return;
    }
    this.closeBatch(batch);
    this.stats.batches++;
    this.stats.batchedEntries += n;
    for (let i = 0; i < n; i++) this.settle(batch.jobs[i]!, this.resultAt(batch.jobs[i]!, ack.first + i, false));
    this.release(batch);
    this.advance(batch.user);
  }

  /** The result of a job appended at `offset`: its mailbox_seq as the registry numbers that offset now. */
  private resultAt(job: Job, offset: number, duplicate: boolean): DispatchResult {
    let seq: MailboxSeq | undefined;
    try {
      // Every log's first boundary starts at offset 1 and shards are never removed: always defined.
      seq = this.shards().seqOf(job.shard, offset);
    } catch {
      seq = undefined; // an offset past the 48-bit field (alerted long before: docs/design.md, "Review points")
    }
    if (seq === undefined) {
      const message = `appended at offset ${offset}, but the registry numbers no such offset of shard ${job.shard}`;
      return { user: job.user, shard: job.shard, error: { code: "DISPATCH_REJECTED", message } };
    }
    return { user: job.user, shard: job.shard, seq, offset, duplicate };
  }

  /** Stops listening for acks; publishes still pending fail by timeout. */
  close(): void {
    this.opts.clock.clearInterval(this.sweeper);
    this.link.close();
  }
}
