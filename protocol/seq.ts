/**
 * mailbox_seq arithmetic (docs/design.md, "Seqs"): `seq = epoch << 48 | offset`, compared as an unsigned u64.
 *
 * Always a bigint: a JS number loses integers above 2^53, which a seq passes at epoch 32.
 * Overflow is an error, never a wrap.
 */
import { JetgateError } from "./errors.js";

export type MailboxSeq = bigint;

export const OFFSET_BITS = 48n;
export const MAX_OFFSET = (1n << OFFSET_BITS) - 1n;
export const MAX_EPOCH = 0xffff;
export const U64_MAX = (1n << 64n) - 1n;

export class SeqRangeError extends JetgateError {
  constructor(message: string) {
    super("SEQ_RANGE", message);
  }
}

function toBigInt(what: string, v: number | bigint): bigint {
  if (typeof v === "bigint") return v;
  if (!Number.isSafeInteger(v)) throw new SeqRangeError(`${what} must be an integer, got ${v}`);
  return BigInt(v);
}

/** Compose a seq from a shard epoch (0..65535) and a log offset (0..2^48-1). */
export function composeSeq(epoch: number | bigint, offset: number | bigint): MailboxSeq {
  const e = toBigInt("epoch", epoch);
  const o = toBigInt("offset", offset);
  if (e < 0n || e > BigInt(MAX_EPOCH)) throw new SeqRangeError(`epoch ${e} outside 0..${MAX_EPOCH}`);
  if (o < 0n || o > MAX_OFFSET) throw new SeqRangeError(`offset ${o} outside 0..2^48-1`);
  return (e << OFFSET_BITS) | o;
}

/** Throws unless `seq` is a bigint in 0..2^64-1. */
export function assertSeq(seq: unknown): asserts seq is MailboxSeq {
  if (typeof seq !== "bigint") throw new SeqRangeError(`seq must be a bigint, got ${typeof seq}`);
  if (seq < 0n || seq > U64_MAX) throw new SeqRangeError(`seq ${seq} outside the u64 range`);
}

/** The epoch part (bits 63..48) as a number. */
export function seqEpoch(seq: MailboxSeq): number {
  assertSeq(seq);
  return Number(seq >> OFFSET_BITS);
}

/** The log offset part (bits 47..0) as a bigint; offsets fit a number until 2^53, but we never assume it. */
export function seqOffset(seq: MailboxSeq): bigint {
  assertSeq(seq);
  return seq & MAX_OFFSET;
}

/**
 * Buckets (seconds) of the push latency histograms, an entry's dispatch to the worker's push and to
 * a gateway's receipt: 1 ms .. 10 s; later than that is an outage, which +Inf still counts. One list
 * for both, so the two can be read against each other bucket by bucket.
 */
export const PUSH_LATENCY_BUCKETS_S = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10] as const;

/**
 * A seq as a person reads it: the u64 and its `epoch:offset` (`281474976710659 (1:3)`), for logs,
 * CLI output and demos. The u64 alone hides that a jump from 2 to 281474976710659 is an epoch change.
 */
export function seqLabel(seq: MailboxSeq): string {
  return `${seq} (${seqEpoch(seq)}:${seqOffset(seq)})`;
}

export function compareSeq(a: MailboxSeq, b: MailboxSeq): -1 | 0 | 1 {
  return a < b ? -1 : a > b ? 1 : 0;
}

/** 8-byte big-endian encoding: byte order equals numeric order. */
export function encodeSeq(seq: MailboxSeq): Uint8Array {
  assertSeq(seq);
  const out = new Uint8Array(8);
  new DataView(out.buffer).setBigUint64(0, seq, false);
  return out;
}

export function decodeSeq(bytes: Uint8Array): MailboxSeq {
  if (bytes.byteLength !== 8) throw new SeqRangeError(`an encoded seq has 8 bytes, got ${bytes.byteLength}`);
  return new DataView(bytes.buffer, bytes.byteOffset, 8).getBigUint64(0, false);
}
