/**
 * A dispatch as the Dispatcher (protocol/io/dispatch.ts) takes it, its validation and its
 * outcomes. Pure: what is valid, and what a caller is told.
 */
import { JetgateError } from "./errors.js";
import { idProblem } from "./ids.js";
import type { ShardMap } from "./registry-model.js";
import type { MailboxSeq } from "./seq.js";

export const MAX_RECIPIENTS = 10_000;

/**
 * Recipients validated or scheduled per event-loop turn, and publishes sent per turn: a large
 * dispatch is sliced so that no call holds the event loop for long.
 */
export const DISPATCH_SLICE = 500;

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
 * NATS cannot be reached (the connection is down and reconnecting, or closed), or the Dispatcher's
 * queue has no room for the whole request (queueRefusal): nothing of this dispatch was published.
 * Retry after `retryAfterMs`; `POST /v1/dispatch` answers it with 503 and Retry-After.
 */
export class DispatchUnavailableError extends JetgateError {
  readonly retryAfterMs: number;
  constructor(message: string, retryAfterMs: number) {
    super("DISPATCH_UNAVAILABLE", message);
    this.retryAfterMs = retryAfterMs;
  }
}

/** How soon a caller refused while NATS is away, or while the queue is full, should try again. */
export const DISPATCH_RETRY_AFTER_MS = 2000;

/**
 * What an entry counts in the Dispatcher's queue beyond its bytes: about what it holds while it
 * waits (its job, subject and Nats-Msg-Id strings, its result), so that a queue of small entries
 * is bounded in memory as well as a queue of large ones is in bytes.
 */
export const QUEUED_ENTRY_COST = 256;

/** What dispatching `entryBytes` (the encoded entry) to `recipients` users counts in the queue. */
export function queuedCost(recipients: number, entryBytes: number): number {
  return recipients * (entryBytes + QUEUED_ENTRY_COST);
}

/**
 * The refusal of a request that does not fit in the queue: what is queued or in flight (`queued`,
 * counted by queuedCost) plus the request's `cost` over `max`. An empty queue takes any request,
 * so one larger than `max` is not refused for ever; nothing of a refused one is published.
 */
export function queueRefusal(queued: number, cost: number, max: number): DispatchUnavailableError | undefined {
  if (queued === 0 || queued + cost <= max) return undefined;
  return new DispatchUnavailableError(
    `the dispatch queue is full (${queued} bytes queued or in flight, this request ${cost}, limit ${max}): nothing was published`,
    DISPATCH_RETRY_AFTER_MS,
  );
}

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

/**
 * What a Dispatcher needs of the registry: which shard owns a user, and how that shard numbers an
 * offset of its current log. `RegistryClient.shards` (a ShardMap) is one; pass `() => registry.shards`.
 */
export type DispatchRegistryView = Pick<ShardMap, "shardOf" | "seqOf">;

/** A request found valid, with each recipient's shard. */
export type ValidDispatch = DispatchRequest & { shards: number[] };

export interface DispatchRules {
  lanes: ReadonlySet<string>;
  maxBodyBytes: number;
  /** The registry view, asked once the recipients are known to be worth looking up. */
  shards: () => DispatchRegistryView;
}

/**
 * Validates the whole request, pausing (yield) after every DISPATCH_SLICE recipients; throws
 * DispatchValidationError naming the field. By hand, not with zod: this is the library's hot path,
 * called per dispatch (a schema parse cost more than the rest of a one-recipient dispatch); the
 * messages are the schema's.
 */
export function* validation(req: DispatchRequest, rules: DispatchRules): Generator<void, ValidDispatch> {
  const bad = (field: string, message: string) => new DispatchValidationError(field, message);
  if (req === null || typeof req !== "object") throw bad("request", "must be an object");
  for (const k in req) if (!REQUEST_FIELDS.has(k)) throw bad("request", `unrecognized key ${JSON.stringify(k)}`);
  for (const [field, kind] of [["dispatch_id", "dispatch"], ["message_id", "message"]] as const) {
    const p = idProblem(kind, req[field]);
    if (p !== undefined) throw bad(field, `${kind} id ${p}`);
  }
  if (!rules.lanes.has(req.lane)) {
    const p = idProblem("lane", req.lane);
    throw bad("lane", p !== undefined ? `lane id ${p}` : `unknown lane ${JSON.stringify(req.lane)}; configured lanes: ${[...rules.lanes].join(", ")}`);
  }
  const recipients = req.recipients;
  if (!Array.isArray(recipients)) throw bad("recipients", "must be an array of user ids");
  if (recipients.length === 0) throw bad("recipients", "must name at least one recipient");
  if (recipients.length > MAX_RECIPIENTS) throw bad("recipients", `must name at most ${MAX_RECIPIENTS} recipients`);
  const map = rules.shards();
  const shards = new Array<number>(recipients.length);
  for (let i = 0; i < recipients.length; i++) {
    const p = idProblem("user", recipients[i]);
    if (p !== undefined) throw bad(`recipients.${i}`, `user id ${p}`);
    const s = map.shardOf(recipients[i]!);
    if (s === undefined) throw bad(`recipients.${i}`, "no shard owns this user: is the registry initialised?");
    shards[i] = s;
    if ((i + 1) % DISPATCH_SLICE === 0) yield;
  }
  if (recipients.length > 1 && new Set(recipients).size !== recipients.length) throw bad("recipients", "recipients must be unique");
  if (!(req.body instanceof Uint8Array)) throw bad("body", "must be bytes");
  if (req.body.byteLength > rules.maxBodyBytes) throw bad("body", `${req.body.byteLength} bytes exceeds the limit of ${rules.maxBodyBytes}`);
  return { ...req, shards };
}

/** How many recipients a request names, whatever it holds (validation says what is wrong with it). */
export function recipientCount(req: DispatchRequest): number {
  return req !== null && typeof req === "object" && Array.isArray(req.recipients) ? req.recipients.length : 0;
}

/**
 * A dispatch_id given twice in one batch with anything else different: one of the two would be
 * dropped as a duplicate (same Nats-Msg-Id), silently. The same dispatch twice is a retry and fine.
 */
export function repeatedDispatch(reqs: readonly DispatchRequest[]): DispatchValidationError | undefined {
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
