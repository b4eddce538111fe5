/**
 * What a JetStream answer to one of the Dispatcher's appends means: an entry appended (at which
 * offset), a failure worth another attempt or not; for an atomic batch, committed (its first
 * offset) or refused as a batch. Pure: the Dispatcher (protocol/io/dispatch-flight.ts) acts on it.
 */
import { backoffCeiling } from "./backoff.js";

/** An answer to a publish: a NATS status (503: no stream listens on the subject), or JetStream's JSON. */
export interface AckAnswer {
  status?: { code: number; description: string };
  data: Uint8Array;
}

const ACK_SEQ = /^\{"stream":"[^"]*",(?:"domain":"[^"]*",)?"seq":(\d+)(,"duplicate":true)?\}$/;
/** nats-server's refusal of a batch as such (not of its entries): atomic publish disabled on the stream. */
export const ATOMIC_DISABLED = 10174;
const ackText = new TextDecoder();

type AckBody = { seq?: unknown; duplicate?: unknown; count?: unknown; error?: { code?: number; err_code?: number; description?: string } };

/**
 * A JetStream publish ack. The common shape, `{"stream":..,"seq":N[,"duplicate":true]}`, is read
 * with one regular expression (JSON.parse and its object cost more than the rest of the ack's
 * handling); anything else, errors included, goes through JSON.parse.
 */
export function readAck(data: Uint8Array): AckBody | undefined {
  const text = ackText.decode(data);
  const m = ACK_SEQ.exec(text);
  if (m !== null) return { seq: Number(m[1]), duplicate: m[2] !== undefined };
  try {
    const v = JSON.parse(text) as unknown;
    return v !== null && typeof v === "object" ? (v as AckBody) : undefined;
  } catch {
    return undefined;
  }
}

/** A JetStream error answer as one line. */
function errorText(e: { code?: number; description?: string }): string {
  return `${e.code ?? 0} ${e.description ?? ""}`.trim();
}

export type EntryAck =
  | { type: "appended"; offset: number; duplicate: boolean }
  /** `retryable`: the same publish may succeed (a timeout, 503 no stream yet, a 5xx); otherwise the entry is rejected. */
  | { type: "failed"; message: string; retryable: boolean };

/** One entry's answer. */
export function entryAck(a: AckAnswer): EntryAck {
  // 503: no stream is listening on the subject (yet): worth a retry
  if (a.status !== undefined) return { type: "failed", message: `${a.status.code} ${a.status.description}`, retryable: a.status.code === 503 };
  const body = readAck(a.data);
  if (body === undefined) return { type: "failed", message: "unreadable ack", retryable: true };
  if (body.error) {
    const code = body.error.code ?? 0;
    return { type: "failed", message: errorText(body.error), retryable: code === 503 || code >= 500 };
  }
  if (typeof body.seq !== "number") return { type: "failed", message: "ack without seq", retryable: true };
  return { type: "appended", offset: body.seq, duplicate: body.duplicate === true };
}

export type BatchAck =
  /** The batch's entries are at the n offsets from `first` on, in order. */
  | { type: "committed"; first: number }
  /** Not appended as a batch (it may still be, whole, after a timeout): its entries go one at a time. `atomicOff`: the stream takes no batches. */
  | { type: "refused"; why: string; atomicOff: boolean };

/**
 * An atomic batch's commit answer: `{"stream":..,"seq":<last offset>,"batch":..,"count":n}`. The
 * batch's entries are at the n offsets ending there (a commit appends them together, in order).
 */
export function batchAck(a: AckAnswer, n: number): BatchAck {
  if (a.status !== undefined) return { type: "refused", why: `${a.status.code} ${a.status.description}`, atomicOff: false };
  const body = readAck(a.data);
  if (body === undefined) return { type: "refused", why: "unreadable ack", atomicOff: false };
  if (body.error) return { type: "refused", why: errorText(body.error), atomicOff: body.error.err_code === ATOMIC_DISABLED };
  if (typeof body.seq !== "number" || body.count !== n) return { type: "refused", why: `batch ack without seq or with count ${String(body.count)} for ${n} entries`, atomicOff: false };
  return { type: "committed", first: body.seq - n + 1 };
}

/**
 * What the Dispatcher does with a unit (an entry, or an atomic batch) whose ack deadline passed,
 * the `attempt`th of `attempts`. `read`: nats-server has read its publish (it answered that publish
 * or a later one, or a PING sent after it), or the connection it went out on is gone. `heldLast`:
 * it was not read yet at its previous deadline.
 * - `retry`: read a whole deadline ago and not answered (the answer was lost, or JetStream took
 *   longer than the deadline): publish it again (a batch: its entries one at a time), with the same
 *   Nats-Msg-Id.
 * - `hold`: not read yet (NATS stalled, or far behind): a copy would only wait behind it in the
 *   client's buffer, so none is sent; the publish keeps its reply token, so its answer, when it
 *   comes, still settles it. Also when it was read only since its previous deadline (a stall that
 *   ended): its answer gets a whole deadline from then, not what was left of one. Each deadline
 *   counts as an attempt.
 * - `give up`: its last deadline: the result is DISPATCH_TIMEOUT (it may or may not be appended).
 */
export function afterDeadline(read: boolean, heldLast: boolean, attempt: number, attempts: number): "retry" | "hold" | "give up" {
  if (attempt >= attempts) return "give up";
  return read && !heldLast ? "retry" : "hold";
}

/**
 * Whether an entry that answered `duplicate` after an unanswered attempt of its own (an entry, or
 * its batch) was appended by someone else: a caller's earlier request with the same dispatch_id.
 * `stored`: the stream's bytes at the offset the duplicate names, `sent` the entry's. The entry's
 * bytes carry the dispatch call's timestamp (ms), so they equal the stored ones only when the
 * Dispatcher's own earlier attempt is what landed (or an identical call of the same millisecond).
 * Unknown (`stored` undefined: the read failed): not a duplicate, the likelier case after an
 * attempt of its own went unanswered.
 */
export function appendedByAnother(stored: Uint8Array | undefined, sent: Uint8Array): boolean {
  if (stored === undefined) return false;
  return stored.byteLength !== sent.byteLength || Buffer.compare(stored, sent) !== 0;
}

/** The wait before attempt `attempt + 1` of an entry whose attempt `attempt` failed: 100 ms doubling, at most 1 s. */
export function retryDelayMs(attempt: number): number {
  return backoffCeiling(attempt, ENTRY_RETRY);
}
const ENTRY_RETRY = { baseMs: 50, capMs: 1000 };
