/**
 * Dispatch: append one entry per recipient to the recipient's shard stream.
 *
 * Publishes are core NATS publishes with a reply subject on one shared ack inbox, acks matched by a
 * token in the reply subject (DESIGN section 9: about 5x the throughput of `js.publish()`).
 *
 * Ordering guarantee: entries one Dispatcher sends to one user land in that user's mailbox in the
 * order `dispatch` was called, even when a publish times out and is retried. Each user has a chain:
 * one unit in flight at a time, the next only after it is acknowledged (or has failed for good). A
 * unit is one entry, or, when at least `minBatch` wait behind one in flight, up to `maxBatch` of them as one
 * JetStream atomic batch (nats-server 2.12.1+): appended all or none, in order, at consecutive
 * offsets, each with its Nats-Msg-Id, so a hot user is not held to one entry per round trip. A
 * batch refused or unanswered is not sent again as a batch: its entries go one at a time, in order,
 * with the same Nats-Msg-Ids (those the batch did append answer duplicate), before anything behind
 * them (docs/registry-and-worker.md, "Ordering"). Different users are pipelined, up to
 * `maxInFlight` entries and `maxInFlightBytes` entry bytes at once. A large dispatch (over 500 recipients) is validated
 * and scheduled 500 recipients per event-loop turn, and calls after it wait their turn, so
 * the order of calls is kept and no call holds the event loop for long. A retry
 * reuses the Nats-Msg-Id, so JetStream drops the copy inside its duplicate window and the worker's
 * dedup catches one outside it.
 *
 * A result's `seq` is the mailbox_seq of the entry (epoch << 48 | offset), derived from the registry
 * state as this Dispatcher sees it when the ack arrives; `offset` is the stream sequence.
 */
import { createInbox, headers, type Msg, type NatsConnection, type Subscription } from "@nats-io/transport-node";
import { JetgateError } from "../errors.js";
import { MAX_BODY_BYTES } from "../frames.js";
import { idProblem } from "../ids.js";
import { encodeStoredEntry } from "../entry.js";
import { entryMsgId, entrySubject } from "../subjects.js";
import type { ShardMap } from "../registry-model.js";
import type { MailboxSeq } from "../seq.js";

export const MAX_RECIPIENTS = 10_000;

/** One entry for some users. The HTTP API validates its JSON with zod; this library checks by hand (below). */
export interface DispatchRequest {
  dispatch_id: string;
  message_id: string;
  lane: string;
  recipients: readonly string[];
  body: Uint8Array;
}

const REQUEST_FIELDS = new Set(["dispatch_id", "message_id", "lane", "recipients", "body"]);

/** Bad input: nothing of this dispatch was published. `field` names what was wrong. */
export class DispatchValidationError extends JetgateError {
  readonly field: string;
  /** The message without its field. */
  readonly reason: string;
  constructor(field: string, message: string) {
    super("DISPATCH_INVALID", `${field}: ${message}`);
    this.field = field;
    this.reason = message;
  }
}

/**
 * NATS cannot be reached (the connection is down and reconnecting, or closed): nothing of this
 * dispatch was published. Retry after `retryAfterMs`; `POST /v1/dispatch` answers it with 503 and
 * Retry-After.
 */
export class DispatchUnavailableError extends JetgateError {
  readonly retryAfterMs: number;
  constructor(message: string, retryAfterMs: number) {
    super("DISPATCH_UNAVAILABLE", message);
    this.retryAfterMs = retryAfterMs;
  }
}

/** How soon a caller refused while NATS is away should try again. */
const DISPATCH_RETRY_AFTER_MS = 2000;

/**
 * One recipient's outcome. An error: `DISPATCH_REJECTED`, JetStream refused it (not appended);
 * `DISPATCH_TIMEOUT`, no ack after every attempt (unknown: retry the same dispatch, which answers
 * `duplicate` for an entry that did land). `seq` is the mailbox_seq the device sees (a bigint: it passes 2^53 at
 * epoch 32), derived from the registry at the ack: an epoch change or a split forward between the
 * append and the worker's processing can number the entry differently (devices dedup by
 * message_id). `offset` is the entry's sequence in the shard's stream (the current log).
 */
export type DispatchResult =
  | { user: string; shard: number; seq: MailboxSeq; offset: number; duplicate: boolean }
  | { user: string; shard: number; error: { code: "DISPATCH_TIMEOUT" | "DISPATCH_REJECTED"; message: string } };

export interface DispatcherOptions {
  /** Lanes a dispatch may name. */
  lanes: readonly string[];
  maxBodyBytes?: number;
  /** How long to wait for one publish's ack before retrying it. */
  ackTimeoutMs?: number;
  /** Publish attempts per entry before its result is an error. */
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
   */
  maxInFlightBytes?: number;
}

/** Recipients validated or scheduled per event-loop turn, and publishes sent per turn: a large dispatch is sliced. */
const SLICE = 500;
/** Most entry bytes in one atomic batch: nats-server stages a batch until its commit. */
const MAX_BATCH_BYTES = 1024 * 1024;
const nextTurn = () => new Promise<void>((r) => setImmediate(r));

type Validated = DispatchRequest & { shards: number[] };

/** Counters of a Dispatcher's life, for metrics. */
export interface DispatchStats {
  /** Entries appended (acknowledged, duplicates included). */
  appended: number;
  /** Publish attempts after the first, over all entries. */
  retries: number;
  /** Entries whose result was an error. */
  failed: number;
  /** Atomic batches committed, and the entries in them. */
  batches: number;
  batchedEntries: number;
  /** Batches refused or unanswered, whose entries went one at a time instead. */
  batchFallbacks: number;
}

/**
 * What a Dispatcher needs of the registry: which shard owns a user, and how that shard numbers an
 * offset of its current log. `RegistryClient.shards` (a ShardMap) is one; pass `() => registry.shards`.
 */
export type DispatchRegistryView = Pick<ShardMap, "shardOf" | "seqOf">;

/** One entry for one recipient, from first publish to its result. */
interface Job {
  user: string;
  shard: number;
  subject: string;
  data: Uint8Array;
  /** Its Nats-Msg-Id; the headers are built at each publish, so a queued job holds a string, not a header map. */
  msgId: string;
  attempt: number;
  deadline: number;
  lastError: string;
  call: Call;
  index: number;
  /** Sent alone from now on: it was in a batch that failed. */
  solo: boolean;
}

/** A user's entries sent as one atomic batch: consecutive in the user's order, one shard stream. */
interface Batch {
  user: string;
  shard: number;
  jobs: Job[];
  bytes: number;
  deadline: number;
}

/** What holds one in-flight place of a user: an entry, or a batch of them. */
type Unit = Job | Batch;
const isBatch = (u: Unit): u is Batch => "jobs" in u;
const unitBytes = (u: Unit) => (isBatch(u) ? u.bytes : u.data.byteLength);
const unitSize = (u: Unit) => (isBatch(u) ? u.jobs.length : 1);

/** One `dispatch()` call: its results, filled in as its jobs finish. */
interface Call {
  results: DispatchResult[];
  remaining: number;
  resolve: (r: DispatchResult[]) => void;
}

class AckError extends Error {
  override readonly name = "AckError";
  constructor(
    message: string,
    readonly retryable: boolean,
  ) {
    super(message);
  }
}

const ACK_SEQ = /^\{"stream":"[^"]*",(?:"domain":"[^"]*",)?"seq":(\d+)(,"duplicate":true)?\}$/;
/** nats-server's refusals of a batch as such (not of its entries): atomic publish disabled on the stream; too many batches open. */
const ATOMIC_DISABLED = 10174;
const ackText = new TextDecoder();

/**
 * A JetStream publish ack. The common shape, `{"stream":..,"seq":N[,"duplicate":true]}`, is read
 * with one regular expression (JSON.parse and its object cost more than the rest of the ack's
 * handling); anything else, errors included, goes through JSON.parse.
 */
function readAck(data: Uint8Array): { seq?: unknown; duplicate?: unknown; count?: unknown; error?: { code?: number; err_code?: number; description?: string } } | undefined {
  const text = ackText.decode(data);
  const m = ACK_SEQ.exec(text);
  if (m !== null) return { seq: Number(m[1]), duplicate: m[2] !== undefined };
  try {
    const v = JSON.parse(text) as unknown;
    return v !== null && typeof v === "object" ? (v as { seq?: unknown }) : undefined;
  } catch {
    return undefined;
  }
}

/** A JetStream error answer as one line. */
function errorText(e: { code?: number; description?: string }): string {
  return `${e.code ?? 0} ${e.description ?? ""}`.trim();
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

/** How many recipients a request names, whatever it holds (validation says what is wrong with it). */
function recipientCount(req: DispatchRequest): number {
  return req !== null && typeof req === "object" && Array.isArray(req.recipients) ? req.recipients.length : 0;
}

/**
 * A dispatch_id given twice in one batch with anything else different: one of the two would be
 * dropped as a duplicate (same Nats-Msg-Id), silently. The same dispatch twice is a retry and fine.
 */
function repeatedDispatch(reqs: readonly DispatchRequest[]): DispatchValidationError | undefined {
  const first = new Map<string, number>();
  for (let i = 0; i < reqs.length; i++) {
    const r = reqs[i]!;
    const j = first.get(r.dispatch_id);
    if (j === undefined) {
      first.set(r.dispatch_id, i);
      continue;
    }
    const o = reqs[j]!;
    const differs =
      r.message_id !== o.message_id ? "message_id"
      : r.lane !== o.lane ? "lane"
      : r.recipients.length !== o.recipients.length || r.recipients.some((u, k) => u !== o.recipients[k]) ? "recipients"
      : Buffer.compare(r.body, o.body) !== 0 ? "body"
      : undefined;
    if (differs !== undefined) return new DispatchValidationError(`dispatches.${i}.dispatch_id`, `repeats the dispatch_id of dispatches.${j} with another ${differs}: one of them would be dropped as a duplicate`);
  }
  return undefined;
}

export class Dispatcher {
  readonly stats: DispatchStats = { appended: 0, retries: 0, failed: 0, batches: 0, batchedEntries: 0, batchFallbacks: 0 };
  private readonly prefix = createInbox("_INBOX_JG");
  /** Batch ids: this Dispatcher's inbox token and a counter (nats-server takes up to 64 characters). */
  private readonly batchPrefix = this.prefix.slice(this.prefix.lastIndexOf(".") + 1);
  private nextBatch = 0;
  private readonly sub: Subscription;
  /** Units awaiting an ack, by reply token; insertion order is deadline order. */
  private readonly pending = new Map<string, Unit>();
  /** Users with a unit in flight, and the jobs waiting behind it (the per-user order); null: none waiting. */
  private readonly users = new Map<string, Job[] | null>();
  /** Units of users waiting for an in-flight place. */
  private readonly waiting: Unit[] = [];
  /** Units holding a place, to be published at the end of this event-loop turn (publishOutbox). */
  private readonly outbox: Unit[] = [];
  /** Atomic batches in flight per shard. */
  private readonly openBatches = new Map<number, number>();
  /** Shards whose stream refused atomic publish (made by an older jetgate before `registry init`): entries go one by one. */
  private readonly atomicOff = new Set<number>();
  private readonly maxBatch: number;
  private readonly minBatch: number;
  private readonly maxBatchesPerShard: number;
  private readonly lanes: Set<string>;
  private readonly maxBody: number;
  private readonly ackTimeoutMs: number;
  private readonly attempts: number;
  private readonly maxInFlight: number;
  private readonly maxInFlightBytes: number;
  private inFlight = 0;
  private inFlightBytesNow = 0;
  /** The end of the intake of calls made while a large one is sliced; undefined when none is. */
  private intake: Promise<void> | undefined;
  private outboxScheduled = false;
  private nextToken = 0;
  private readonly sweeper: ReturnType<typeof setInterval>;
  /** Why NATS cannot be reached now (from the connection's status events); undefined while connected. */
  private down: string | undefined;

  constructor(
    private readonly nc: NatsConnection,
    private readonly shards: () => DispatchRegistryView,
    opts: DispatcherOptions,
  ) {
    this.lanes = new Set(opts.lanes);
    this.maxBody = Math.min(opts.maxBodyBytes ?? MAX_BODY_BYTES, MAX_BODY_BYTES);
    this.ackTimeoutMs = opts.ackTimeoutMs ?? 2000;
    this.attempts = opts.attempts ?? 5;
    this.maxInFlight = opts.maxInFlight ?? 10_000;
    this.maxInFlightBytes = opts.maxInFlightBytes ?? 8 * 1024 * 1024;
    this.maxBatch = Math.max(1, Math.min(opts.maxBatch ?? 500, 1000));
    this.minBatch = Math.max(2, opts.minBatch ?? 64);
    this.maxBatchesPerShard = opts.maxBatchesPerShard ?? 16;
    this.sub = nc.subscribe(`${this.prefix}.*`, { callback: (err, msg) => (err ? undefined : this.onAck(msg)) });
    // One timer for every ack deadline instead of one per publish.
    this.sweeper = setInterval(() => this.sweep(), Math.max(10, Math.min(100, Math.floor(this.ackTimeoutMs / 4))));
    this.sweeper.unref?.();
    void this.watchConnection();
  }

  /** Follows the connection's status: a call made while it is down is refused, not queued for an ack that cannot come. */
  private async watchConnection(): Promise<void> {
    for await (const s of this.nc.status()) {
      if (s.type === "disconnect") this.down = `NATS connection to ${s.server} lost; reconnecting`;
      else if (s.type === "reconnecting") this.down ??= "NATS unreachable; reconnecting";
      else if (s.type === "reconnect") this.down = undefined;
      else if (s.type === "close") this.down = "NATS connection closed";
    }
    this.down = "NATS connection closed";
  }

  /** Why a dispatch now would be refused with DispatchUnavailableError; undefined while NATS is reachable. */
  get unavailable(): string | undefined {
    return this.nc.isClosed() ? "NATS connection closed" : this.down;
  }

  private refuseWhileDown(): DispatchUnavailableError | undefined {
    const why = this.unavailable;
    return why === undefined ? undefined : new DispatchUnavailableError(`${why}: nothing was published`, DISPATCH_RETRY_AFTER_MS);
  }

  /** Entry bytes of the publishes awaiting an ack now (bounded by `maxInFlightBytes`). */
  get inFlightBytes(): number {
    return this.inFlightBytesNow;
  }

  /**
   * Validates the whole request first; throws DispatchValidationError without publishing anything.
   * By hand, not with zod: this is the library's hot path, called per dispatch (a schema parse cost
   * more than the rest of a one-recipient dispatch); the messages are the schema's.
   */
  validate(req: DispatchRequest): Validated {
    return drain(this.validation(req));
  }

  /** `validate`, pausing (yield) after every SLICE recipients. */
  private *validation(req: DispatchRequest): Generator<void, Validated> {
    const bad = (field: string, message: string) => new DispatchValidationError(field, message);
    if (req === null || typeof req !== "object") throw bad("request", "must be an object");
    for (const k in req) if (!REQUEST_FIELDS.has(k)) throw bad("request", `unrecognized key ${JSON.stringify(k)}`);
    for (const [field, kind] of [["dispatch_id", "dispatch"], ["message_id", "message"]] as const) {
      const p = idProblem(kind, req[field]);
      if (p !== undefined) throw bad(field, `${kind} id ${p}`);
    }
    if (!this.lanes.has(req.lane)) {
      const p = idProblem("lane", req.lane);
      throw bad("lane", p !== undefined ? `lane id ${p}` : `unknown lane ${JSON.stringify(req.lane)}; configured lanes: ${[...this.lanes].join(", ")}`);
    }
    const recipients = req.recipients;
    if (!Array.isArray(recipients)) throw bad("recipients", "must be an array of user ids");
    if (recipients.length === 0) throw bad("recipients", "must name at least one recipient");
    if (recipients.length > MAX_RECIPIENTS) throw bad("recipients", `must name at most ${MAX_RECIPIENTS} recipients`);
    const map = this.shards();
    const shards = new Array<number>(recipients.length);
    for (let i = 0; i < recipients.length; i++) {
      const p = idProblem("user", recipients[i]);
      if (p !== undefined) throw bad(`recipients.${i}`, `user id ${p}`);
      const s = map.shardOf(recipients[i]!);
      if (s === undefined) throw bad(`recipients.${i}`, "no shard owns this user: is the registry initialised?");
      shards[i] = s;
      if ((i + 1) % SLICE === 0) yield;
    }
    if (recipients.length > 1 && new Set(recipients).size !== recipients.length) throw bad("recipients", "recipients must be unique");
    if (!(req.body instanceof Uint8Array)) throw bad("body", "must be bytes");
    if (req.body.byteLength > this.maxBody) throw bad("body", `${req.body.byteLength} bytes exceeds the limit of ${this.maxBody}`);
    return { ...req, shards };
  }

  /**
   * Appends the entry for every recipient; one result per recipient, in request order. Throws
   * DispatchValidationError on bad input and DispatchUnavailableError while NATS cannot be
   * reached, in both cases with nothing published.
   */
  dispatch(req: DispatchRequest): Promise<DispatchResult[]> {
    if (this.intake === undefined && recipientCount(req) <= SLICE) {
      // the common case: all in this turn
      let r: Validated;
      try {
        r = this.validate(req);
      } catch (err) {
        return Promise.reject(err instanceof Error ? err : new Error(String(err)));
      }
      const down = this.refuseWhileDown();
      if (down !== undefined) return Promise.reject(down);
      const call = this.newCall(r);
      drain(this.appending(r, call));
      return call.promise;
    }
    return this.sliced(async () => {
      const r = await turns(this.validation(req));
      const down = this.refuseWhileDown();
      if (down !== undefined) throw down;
      const call = this.newCall(r);
      await turns(this.appending(r, call));
      return { results: call.promise };
    }).then((x) => x.results);
  }

  /**
   * Many dispatches: every one is validated before any is appended (a bad one throws
   * DispatchValidationError with its index, `dispatches.<i>.<field>`, and nothing is published),
   * then all are appended in array order, so a user's entries keep that order.
   */
  dispatchMany(reqs: readonly DispatchRequest[]): Promise<DispatchResult[][]> {
    return this.sliced(async () => {
      const valid: Validated[] = [];
      for (const [i, req] of reqs.entries()) {
        try {
          valid.push(await turns(this.validation(req)));
        } catch (err) {
          if (err instanceof DispatchValidationError) throw new DispatchValidationError(`dispatches.${i}.${err.field}`, err.reason);
          throw err instanceof Error ? err : new Error(String(err));
        }
      }
      const repeat = repeatedDispatch(valid);
      if (repeat !== undefined) throw repeat;
      const down = this.refuseWhileDown();
      if (down !== undefined) throw down;
      const calls: Promise<DispatchResult[]>[] = [];
      for (const r of valid) {
        const call = this.newCall(r);
        calls.push(call.promise);
        await turns(this.appending(r, call));
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

  private newCall(r: Validated): Call & { promise: Promise<DispatchResult[]> } {
    let resolve!: (x: DispatchResult[]) => void;
    const promise = new Promise<DispatchResult[]>((res) => (resolve = res));
    return { results: new Array<DispatchResult>(r.recipients.length), remaining: r.recipients.length, resolve, promise };
  }

  /** Schedules one publish per recipient (the entry's bytes shared by all), pausing after every SLICE. */
  private *appending(r: Validated, call: Call): Generator<void, void> {
    const data = encodeStoredEntry({ id: r.message_id, d: r.dispatch_id, ts: Date.now(), b: r.body as Uint8Array<ArrayBuffer> });
    for (let i = 0; i < r.recipients.length; i++) {
      const user = r.recipients[i]!;
      const shard = r.shards[i]!;
      this.schedule({
        user, shard, subject: entrySubject(shard, user, r.lane), data, msgId: entryMsgId(r.dispatch_id, user),
        attempt: 0, deadline: 0, lastError: "", call, index: i, solo: false,
      });
      if ((i + 1) % SLICE === 0) yield;
    }
  }

  private schedule(job: Job): void {
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
    return this.inFlight === 0 || (this.inFlight + unitSize(unit) <= this.maxInFlight && this.inFlightBytesNow + unitBytes(unit) <= this.maxInFlightBytes);
  }

  /**
   * The next unit of a user's queue: its first job alone, or, when at least `minBatch` of the same
   * shard wait, as many of them as one batch takes (a job that was in a failed batch always goes alone).
   */
  private takeUnit(queue: Job[]): Unit {
    const head = queue[0]!;
    if (queue.length < this.minBatch || head.solo || this.atomicOff.has(head.shard) || (this.openBatches.get(head.shard) ?? 0) >= this.maxBatchesPerShard) return queue.shift()!;
    const limit = Math.min(this.maxBatch, this.maxInFlight);
    const maxBytes = Math.min(this.maxInFlightBytes, MAX_BATCH_BYTES);
    let n = 1;
    let bytes = head.data.byteLength;
    for (; n < queue.length && n < limit; n++) {
      const j = queue[n]!;
      if (j.shard !== head.shard || j.solo || bytes + j.data.byteLength > maxBytes) break;
      bytes += j.data.byteLength;
    }
    if (n < this.minBatch) return queue.shift()!;
    this.openBatches.set(head.shard, (this.openBatches.get(head.shard) ?? 0) + 1);
    return { user: head.user, shard: head.shard, jobs: queue.splice(0, n), bytes, deadline: 0 };
  }

  /** Takes the unit's in-flight place; it is published with the rest of this event-loop turn's. */
  private send(unit: Unit): void {
    if (isBatch(unit)) {
      this.inFlight += unit.jobs.length;
      this.inFlightBytesNow += unit.bytes;
    } else {
      if (unit.attempt === 0) {
        this.inFlight++;
        this.inFlightBytesNow += unit.data.byteLength;
      } else this.stats.retries++;
      unit.attempt++;
    }
    this.outbox.push(unit);
    if (!this.outboxScheduled) {
      this.outboxScheduled = true;
      setImmediate(this.publishOutbox);
    }
  }

  /**
   * Publishes the units sent since the last call, in order, up to SLICE entries in one synchronous
   * run, so nats.js writes them to the socket together: a caller that awaits each dispatch would
   * otherwise cost one socket write (and one read in nats-server) per entry. More wait for the next
   * turn: ten thousand publishes in one run held the event loop for tens of milliseconds.
   */
  private readonly publishOutbox = (): void => {
    let take = 0;
    for (let n = 0; take < this.outbox.length && n < SLICE; take++) n += unitSize(this.outbox[take]!);
    const units = this.outbox.splice(0, take);
    if (this.outbox.length > 0) setImmediate(this.publishOutbox);
    else this.outboxScheduled = false;
    const deadline = Date.now() + this.ackTimeoutMs;
    for (const unit of units) {
      unit.deadline = deadline;
      const token = (this.nextToken++).toString(36);
      this.pending.set(token, unit);
      try {
        if (isBatch(unit)) this.publishBatch(unit, `${this.prefix}.${token}`);
        else {
          const h = headers();
          h.set("Nats-Msg-Id", unit.msgId);
          this.nc.publish(unit.subject, unit.data, { reply: `${this.prefix}.${token}`, headers: h });
        }
      } catch (err) {
        this.pending.delete(token);
        this.failedUnit(unit, new AckError(err instanceof Error ? err.message : String(err), true));
      }
    }
  };

  /** One atomic batch: every entry but the last staged without a reply, the last commits and is answered for all. */
  private publishBatch(batch: Batch, reply: string): void {
    const id = `${this.batchPrefix}.${(this.nextBatch++).toString(36)}`;
    const last = batch.jobs.length - 1;
    for (let i = 0; i <= last; i++) {
      const job = batch.jobs[i]!;
      const h = headers();
      h.set("Nats-Msg-Id", job.msgId);
      h.set("Nats-Batch-Id", id);
      h.set("Nats-Batch-Sequence", String(i + 1));
      if (i === last) {
        h.set("Nats-Batch-Commit", "1");
        this.nc.publish(job.subject, job.data, { reply, headers: h });
      } else this.nc.publish(job.subject, job.data, { headers: h });
    }
  }

  private sweep(): void {
    const now = Date.now();
    for (const [token, unit] of this.pending) {
      if (unit.deadline > now) break;
      this.pending.delete(token);
      this.failedUnit(unit, new AckError(`ack timeout after ${this.ackTimeoutMs} ms`, true));
    }
  }

  private failedUnit(unit: Unit, err: AckError): void {
    if (isBatch(unit)) this.failedBatch(unit, err.message);
    else this.failedAttempt(unit, err);
  }

  /**
   * A batch refused, or not answered in time (it may yet be appended, whole): its entries go back to
   * the head of their user's queue, to be sent one at a time with the same Nats-Msg-Ids, so each
   * either lands after the one before it or answers duplicate (the batch landed). Their order and
   * their place before the user's later entries are kept. A stream without atomic publish gets no
   * more batches from this Dispatcher.
   */
  private failedBatch(batch: Batch, why: string, errCode?: number): void {
    this.stats.batchFallbacks++;
    if (errCode === ATOMIC_DISABLED) this.atomicOff.add(batch.shard);
    this.closeBatch(batch);
    this.inFlight -= batch.jobs.length;
    this.inFlightBytesNow -= batch.bytes;
    for (const job of batch.jobs) {
      job.solo = true;
      job.lastError = `in an atomic batch: ${why}`;
    }
    const queue = this.users.get(batch.user);
    this.users.set(batch.user, queue ? [...batch.jobs, ...queue] : batch.jobs.slice());
    this.advance(batch.user);
  }

  private closeBatch(batch: Batch): void {
    const open = (this.openBatches.get(batch.shard) ?? 1) - 1;
    if (open > 0) this.openBatches.set(batch.shard, open);
    else this.openBatches.delete(batch.shard);
  }

  private failedAttempt(job: Job, err: AckError): void {
    if (!err.retryable) {
      this.finish(job, { user: job.user, shard: job.shard, error: { code: "DISPATCH_REJECTED", message: err.message } });
      return;
    }
    job.lastError = err.message;
    if (job.attempt >= this.attempts) {
      // said as it is: the entry may have landed (only its ack was not seen)
      const message = `not confirmed after ${this.attempts} attempts (${err.message}): it may or may not have been appended; send the same dispatch again, an appended one answers duplicate`;
      this.finish(job, { user: job.user, shard: job.shard, error: { code: "DISPATCH_TIMEOUT", message } });
      return;
    }
    // Same Nats-Msg-Id: JetStream drops the copy if the first attempt did land.
    setTimeout(() => this.send(job), Math.min(50 * 2 ** job.attempt, 1000));
  }

  private finish(job: Job, result: DispatchResult): void {
    this.complete(job, result);
    this.advance(job.user);
  }

  /** The job's result, and its in-flight place given back. */
  private complete(job: Job, result: DispatchResult): void {
    if ("error" in result) this.stats.failed++;
    else this.stats.appended++;
    const call = job.call;
    call.results[job.index] = result;
    if (--call.remaining === 0) call.resolve(call.results);
    this.inFlight--;
    this.inFlightBytesNow -= job.data.byteLength;
  }

  /** The user's unit in flight is done: its next unit joins the waiting line (keeping the user's place), and waiting units take free places. */
  private advance(user: string): void {
    const queue = this.users.get(user);
    if (queue === undefined || queue === null || queue.length === 0) this.users.delete(user);
    else {
      this.waiting.push(this.takeUnit(queue));
      if (queue.length === 0) this.users.set(user, null);
    }
    while (this.waiting.length > 0 && this.fits(this.waiting[0]!)) this.send(this.waiting.shift()!);
  }

  private onAck(msg: Msg): void {
    const token = msg.subject.slice(this.prefix.length + 1);
    const unit = this.pending.get(token);
    if (!unit) return; // a late ack of an attempt that already timed out
    this.pending.delete(token);
    if (isBatch(unit)) {
      this.onBatchAck(unit, msg);
      return;
    }
    const job = unit;
    if (msg.headers?.hasError) {
      // 503: no stream is listening on the subject (yet): worth a retry.
      this.failedAttempt(job, new AckError(`${msg.headers.code} ${msg.headers.description}`, msg.headers.code === 503));
      return;
    }
    const body = readAck(msg.data);
    if (body === undefined) {
      this.failedAttempt(job, new AckError("unreadable ack", true));
      return;
    }
    if (body.error) {
      const code = body.error.code ?? 0;
      this.failedAttempt(job, new AckError(errorText(body.error), code === 503 || code >= 500));
      return;
    }
    if (typeof body.seq !== "number") {
      this.failedAttempt(job, new AckError("ack without seq", true));
      return;
    }
    this.finish(job, this.resultAt(job, body.seq, body.duplicate === true));
  }

  /** The result of a job appended at `offset`: its mailbox_seq as the registry numbers that offset now. */
  private resultAt(job: Job, offset: number, duplicate: boolean): DispatchResult {
    let seq: MailboxSeq | undefined;
    try {
      // Every log's first boundary starts at offset 1 and shards are never removed: always defined.
      seq = this.shards().seqOf(job.shard, offset);
    } catch {
      seq = undefined; // an offset past the 48-bit field (ADR-0004 alerts long before)
    }
    if (seq === undefined) {
      const message = `appended at offset ${offset}, but the registry numbers no such offset of shard ${job.shard}`;
      return { user: job.user, shard: job.shard, error: { code: "DISPATCH_REJECTED", message } };
    }
    return { user: job.user, shard: job.shard, seq, offset, duplicate };
  }

  /**
   * A batch's commit answer: `{"stream":..,"seq":<last offset>,"batch":..,"count":n}`. The batch's
   * entries are at the n offsets ending there (a commit appends them together, in order).
   */
  private onBatchAck(batch: Batch, msg: Msg): void {
    if (msg.headers?.hasError) {
      this.failedBatch(batch, `${msg.headers.code} ${msg.headers.description}`);
      return;
    }
    const body = readAck(msg.data);
    if (body === undefined) {
      this.failedBatch(batch, "unreadable ack");
      return;
    }
    if (body.error) {
      this.failedBatch(batch, errorText(body.error), body.error.err_code);
      return;
    }
    const n = batch.jobs.length;
    if (typeof body.seq !== "number" || body.count !== n) {
      this.failedBatch(batch, `batch ack without seq or with count ${String(body.count)} for ${n} entries`);
      return;
    }
    this.closeBatch(batch);
    this.stats.batches++;
    this.stats.batchedEntries += n;
    const first = body.seq - n + 1;
    for (let i = 0; i < n; i++) this.complete(batch.jobs[i]!, this.resultAt(batch.jobs[i]!, first + i, false));
    this.advance(batch.user);
  }

  /** Stops listening for acks; publishes still pending fail by timeout. */
  close(): void {
    clearInterval(this.sweeper);
    this.sub.unsubscribe();
  }
}
