/**
 * Dispatch: append one entry per recipient to the recipient's shard stream.
 *
 * Ordering guarantee: entries one Dispatcher sends to one user land in that user's mailbox in the
 * order `dispatch` was called, even when a publish times out and is retried (dispatch-flight.ts:
 * one unit in flight per user, atomic batches for a hot user's queue, retries with the same
 * Nats-Msg-Id; docs/registry-and-worker.md, "Ordering"). A large dispatch (over 500 recipients) is
 * validated and scheduled 500 recipients per event-loop turn, and calls after it wait their turn,
 * so the order of calls is kept and no call holds the event loop for long. A retry reuses the
 * Nats-Msg-Id, so JetStream drops the copy inside its duplicate window and the worker's dedup
 * catches one outside it.
 *
 * A result's `seq` is the mailbox_seq of the entry (epoch << 48 | offset), derived from the registry
 * state as this Dispatcher sees it when the ack arrives; `offset` is the stream sequence.
 *
 * Here: the intake (validation, the order of calls, refusal while NATS is away or the queue is
 * full). NATS itself is
 * behind DispatchLink (dispatch-link.ts); the decisions are pure (protocol/dispatch-*.ts).
 */
import type { NatsConnection } from "@nats-io/transport-node";
import { systemClock, type Clock } from "../clock.js";
import { encodeStoredEntry } from "../entry.js";
import { MAX_BODY_BYTES } from "../frames.js";
import { entryMsgId, entrySubject } from "../subjects.js";
import {
  DISPATCH_RETRY_AFTER_MS,
  DISPATCH_SLICE,
  DispatchUnavailableError,
  DispatchValidationError,
  queueRefusal,
  queuedCost,
  recipientCount,
  repeatedDispatch,
  validation,
  type DispatchRegistryView,
  type DispatchRequest,
  type DispatchResult,
  type DispatchRules,
  type ValidDispatch,
} from "../dispatch-request.js";
import { DispatchFlight, type Call, type DispatchStats, type DispatchTimings } from "./dispatch-flight.js";
import { NatsDispatchLink, type DispatchLink } from "./dispatch-link.js";

export type { DispatchStats, DispatchTimings } from "./dispatch-flight.js";
export type { DispatchLink } from "./dispatch-link.js";

export interface DispatcherOptions {
  /** Lanes a dispatch may name. */
  lanes: readonly string[];
  maxBodyBytes?: number;
  /** How long to wait for one publish's ack before retrying it. */
  ackTimeoutMs?: number;
  /**
   * Ack deadlines per entry before its result is DISPATCH_TIMEOUT: each publish has one, and so
   * has each deadline it is held without a copy while nats-server reads nothing.
   */
  attempts?: number;
  /** Entries awaiting an ack at once, over all users. */
  maxInFlight?: number;
  /**
   * Most entries in one atomic batch (default 500; nats-server takes 1000). 1: no batches, a
   * user's entries go one per round trip.
   */
  maxBatch?: number;
  /**
   * Fewest entries worth an atomic batch (default 64): fewer go one at a time. nats-server spends
   * about 1.4 ms of CPU on each atomic batch of an R1 file-storage stream (it stages the batch in a
   * file store of its own), about what 90 single appends cost (bench/RESULTS.md).
   */
  minBatch?: number;
  /**
   * Atomic batches open at once per shard stream (default 16). nats-server holds at most 50 per
   * stream over all its clients (1000 per server); a batch it refuses goes one entry at a time.
   */
  maxBatchesPerShard?: number;
  /**
   * Entry bytes awaiting an ack at once, over all users (default 8 MiB): what nats.js holds for
   * its socket. A dispatch to many recipients goes out through this window, never all at once,
   * so memory and each publish's wait for its ack stay bounded however large the dispatch is.
   * Retries included: while NATS reads nothing, nothing is published again (dispatch-flight.ts).
   */
  maxInFlightBytes?: number;
  /**
   * What the entries taken and not yet answered may count, queued or in flight (default 64 MiB):
   * each entry's bytes plus QUEUED_ENTRY_COST. A call that does not fit is refused whole with
   * DispatchUnavailableError and nothing published; an empty queue takes any call.
   */
  maxQueuedBytes?: number;
  /** Called with each entry's queue wait and ack wait (protocol/stages.ts: dispatch_queue, dispatch_ack). */
  timings?: DispatchTimings;
  /** What the ack deadlines, retries, entry times and stage times run on (default: systemClock); tests step a manual one. */
  clock?: Clock;
}

const nextTurn = () => new Promise<void>((r) => setImmediate(r));

/** A valid dispatch and its entry as stored, encoded once and shared by every recipient's publish. */
interface Encoded {
  r: ValidDispatch;
  data: Uint8Array;
}

/** The entry's bytes carry the call's time (ms): an entry of this call is told from another call's by them (appendedByAnother). */
function encoded(r: ValidDispatch, now: number): Encoded {
  return { r, data: encodeStoredEntry({ id: r.message_id, d: r.dispatch_id, ts: Math.floor(now), b: r.body as Uint8Array<ArrayBuffer> }) };
}

/** Runs a sliced step to its end in this turn. */
function drain<T>(g: Generator<void, T>): T {
  for (;;) {
    const n = g.next();
    if (n.done === true) return n.value;
  }
}

/** Runs a sliced step, one slice per event-loop turn. */
async function turns<T>(g: Generator<void, T>): Promise<T> {
  for (;;) {
    const n = g.next();
    if (n.done === true) return n.value;
    await nextTurn();
  }
}

/** A Dispatcher over any DispatchLink (Dispatcher: over a NATS connection; the unit tests: a fake). */
export class LinkDispatcher {
  readonly stats: DispatchStats;
  private readonly flight: DispatchFlight;
  private readonly rules: DispatchRules;
  private readonly maxQueuedBytes: number;
  private readonly clock: Clock;
  /** The end of the intake of calls made while a large one is sliced; undefined when none is. */
  private intake: Promise<void> | undefined;

  constructor(
    private readonly link: DispatchLink,
    shards: () => DispatchRegistryView,
    opts: DispatcherOptions,
  ) {
    this.rules = { lanes: new Set(opts.lanes), maxBodyBytes: Math.min(opts.maxBodyBytes ?? MAX_BODY_BYTES, MAX_BODY_BYTES), shards };
    this.clock = opts.clock ?? systemClock;
    this.flight = new DispatchFlight(link, shards, {
      ackTimeoutMs: opts.ackTimeoutMs ?? 2000,
      attempts: opts.attempts ?? 5,
      maxInFlight: opts.maxInFlight ?? 10_000,
      maxInFlightBytes: opts.maxInFlightBytes ?? 8 * 1024 * 1024,
      maxBatch: Math.max(1, Math.min(opts.maxBatch ?? 500, 1000)),
      minBatch: Math.max(2, opts.minBatch ?? 64),
      maxBatchesPerShard: opts.maxBatchesPerShard ?? 16,
      timings: opts.timings,
      clock: this.clock,
    });
    this.stats = this.flight.stats;
    this.maxQueuedBytes = opts.maxQueuedBytes ?? 64 * 1024 * 1024;
  }

  /** Why a dispatch now would be refused with DispatchUnavailableError; undefined while NATS is reachable. */
  get unavailable(): string | undefined {
    return this.link.unavailable();
  }

  /** Why `calls` now would be refused whole: NATS away, or no room in the queue for all of them. */
  private refusal(calls: readonly Encoded[]): DispatchUnavailableError | undefined {
    const why = this.unavailable;
    if (why !== undefined) return new DispatchUnavailableError(`${why}: nothing was published`, DISPATCH_RETRY_AFTER_MS);
    let cost = 0;
    for (const e of calls) cost += queuedCost(e.r.recipients.length, e.data.byteLength);
    return queueRefusal(this.flight.queuedBytes, cost, this.maxQueuedBytes);
  }

  /** What queuedBytes counts now: entries taken and not yet answered (bounded by `maxQueuedBytes`). */
  get queuedBytes(): number {
    return this.flight.queuedBytes;
  }

  /** Entry bytes of the publishes awaiting an ack now, or done but not yet read by nats-server (bounded by `maxInFlightBytes`). */
  get inFlightBytes(): number {
    return this.flight.inFlightBytes;
  }

  /** Validates the whole request first; throws DispatchValidationError without publishing anything. */
  validate(req: DispatchRequest): ValidDispatch {
    return drain(validation(req, this.rules));
  }

  /**
   * Appends the entry for every recipient; one result per recipient, in request order. Throws
   * DispatchValidationError on bad input and DispatchUnavailableError while NATS cannot be
   * reached or the queue has no room for it, in every case with nothing published.
   */
  dispatch(req: DispatchRequest): Promise<DispatchResult[]> {
    if (this.intake === undefined && recipientCount(req) <= DISPATCH_SLICE) {
      // the common case: all in this turn
      let r: ValidDispatch;
      try {
        r = this.validate(req);
      } catch (err) {
        return Promise.reject(err instanceof Error ? err : new Error(String(err)));
      }
      const e = encoded(r, this.clock.now());
      const refused = this.refusal([e]);
      if (refused !== undefined) return Promise.reject(refused);
      const call = this.newCall(r);
      drain(this.appending(e, call));
      return call.promise;
    }
    return this.sliced(async () => {
      const e = encoded(await turns(validation(req, this.rules)), this.clock.now());
      const refused = this.refusal([e]);
      if (refused !== undefined) throw refused;
      const call = this.newCall(e.r);
      await turns(this.appending(e, call));
      return { results: call.promise };
    }).then((x) => x.results);
  }

  /**
   * Many dispatches: every one is validated before any is appended (a bad one throws
   * DispatchValidationError with its index, `dispatches.<i>.<field>`, and nothing is published),
   * then all are appended in array order, so a user's entries keep that order. Refused whole
   * (DispatchUnavailableError) when NATS is away or the queue has no room for all of them.
   */
  dispatchMany(reqs: readonly DispatchRequest[]): Promise<DispatchResult[][]> {
    return this.sliced(async () => {
      const valid: ValidDispatch[] = [];
      for (const [i, req] of reqs.entries()) {
        try {
          valid.push(await turns(validation(req, this.rules)));
        } catch (err) {
          if (err instanceof DispatchValidationError) throw new DispatchValidationError(`dispatches.${i}.${err.field}`, err.reason);
          throw err instanceof Error ? err : new Error(String(err));
        }
      }
      const repeat = repeatedDispatch(valid);
      if (repeat !== undefined) throw repeat;
      const all = valid.map((r) => encoded(r, this.clock.now()));
      const refused = this.refusal(all);
      if (refused !== undefined) throw refused;
      const calls: Promise<DispatchResult[]>[] = [];
      for (const e of all) {
        const call = this.newCall(e.r);
        calls.push(call.promise);
        await turns(this.appending(e, call));
      }
      return { results: Promise.all(calls) };
    }).then((x) => x.results);
  }

  /**
   * Runs `intake` once every call made before it has scheduled its publishes (the order of calls
   * is the order of a user's entries), yielding the event loop between its slices. A call's intake
   * ends when its publishes are scheduled, not when they are acknowledged: it hands its results on
   * in a wrapper, so the next call need not wait for them.
   */
  private sliced<T>(intake: () => Promise<T>): Promise<T> {
    const run = (this.intake ?? Promise.resolve()).then(intake);
    const tail = run.then(() => undefined, () => undefined);
    this.intake = tail;
    void tail.then(() => {
      if (this.intake === tail) this.intake = undefined;
    });
    return run;
  }

  private newCall(r: ValidDispatch): Call & { promise: Promise<DispatchResult[]> } {
    let resolve!: (x: DispatchResult[]) => void;
    const promise = new Promise<DispatchResult[]>((res) => (resolve = res));
    return { results: new Array<DispatchResult>(r.recipients.length), remaining: r.recipients.length, resolve, promise };
  }

  /** Schedules one publish per recipient (the entry's bytes shared by all), pausing after every DISPATCH_SLICE. */
  private *appending({ r, data }: Encoded, call: Call): Generator<void, void> {
    for (let i = 0; i < r.recipients.length; i++) {
      const user = r.recipients[i]!;
      const shard = r.shards[i]!;
      this.flight.schedule({
        user, shard, subject: entrySubject(shard, user, r.lane), data, msgId: entryMsgId(r.dispatch_id, user),
        attempt: 0, deadline: 0, call, index: i, solo: false, unanswered: false, mark: 0, queuedAt: 0, sentAt: 0,
      });
      if ((i + 1) % DISPATCH_SLICE === 0) yield;
    }
  }

  /** Stops listening for acks; publishes still pending fail by timeout. */
  close(): void {
    this.flight.close();
  }
}

/** The Dispatcher on a NATS connection: core publishes answered on one shared ack inbox. */
export class Dispatcher extends LinkDispatcher {
  constructor(nc: NatsConnection, shards: () => DispatchRegistryView, opts: DispatcherOptions) {
    super(new NatsDispatchLink(nc), shards, opts);
  }
}
