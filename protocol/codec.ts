/**
 * Frame codec: bytes <-> validated frames. Pure; tested byte by byte without a server.
 */
import type { z } from "zod";
import { JetgateError, ErrorCode } from "./errors.js";
import { MsgpackDecodeError, encodeWith, unpackOne, type MsgpackWriter } from "./msgpack.js";
import {
  CLIENT_FRAME_TYPES,
  ClientFrameSchema,
  SERVER_FRAME_TYPES,
  ServerFrameSchema,
  type ClientFrame,
  type Entry,
  type ServerFrame,
} from "./frames.js";

export type FrameErrorReason =
  | "not_binary"
  | "too_large"
  | "not_msgpack"
  | "trailing_bytes"
  | "not_map"
  | "unknown_type"
  | "invalid_field";

/** A frame that cannot be accepted. `code` is the ERROR code to answer with. */
export class FrameError extends JetgateError {
  readonly reason: FrameErrorReason;
  /** The frame's `t` when it was readable. */
  readonly frameType: string | undefined;
  constructor(reason: FrameErrorReason, message: string, frameType?: string, options?: { cause?: unknown }) {
    super(reason === "too_large" ? ErrorCode.TOO_LARGE : ErrorCode.BAD_FRAME, message, options);
    this.reason = reason;
    this.frameType = frameType;
  }
}

export interface DecodeOptions {
  /** Frames above this many bytes are rejected before parsing. */
  maxBytes?: number;
}

function toBytes(data: unknown): Uint8Array {
  if (data instanceof Uint8Array) return data;
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  throw new FrameError("not_binary", "frames must be binary msgpack");
}

function describeIssues(error: z.ZodError, t: string): string {
  const issue = error.issues[0];
  if (issue === undefined) return `${t}: invalid`;
  const path = issue.path.length > 0 ? `.${issue.path.join(".")}` : "";
  const more = error.issues.length > 1 ? ` (+${error.issues.length - 1} more)` : "";
  return `${t}${path}: ${issue.message}${more}`;
}

function decodeWith<T>(
  data: unknown,
  types: readonly string[],
  schema: z.ZodType<T>,
  opts: DecodeOptions,
): T {
  const bytes = toBytes(data);
  if (opts.maxBytes !== undefined && bytes.byteLength > opts.maxBytes) {
    throw new FrameError("too_large", `frame of ${bytes.byteLength} bytes exceeds ${opts.maxBytes}`);
  }
  let value: unknown;
  try {
    value = unpackOne(bytes);
  } catch (err) {
    if (err instanceof MsgpackDecodeError) throw new FrameError(err.reason, err.message, undefined, { cause: err });
    throw err;
  }
  if (value === null || typeof value !== "object" || Array.isArray(value) || value instanceof Uint8Array) {
    throw new FrameError("not_map", "a frame must be a msgpack map");
  }
  const t = (value as { t?: unknown }).t;
  if (typeof t !== "string" || !types.includes(t)) {
    const shown = typeof t === "string" ? JSON.stringify(t.slice(0, 32)) : typeof t;
    throw new FrameError("unknown_type", `unknown frame type ${shown}`);
  }
  const parsed = schema.safeParse(value);
  if (!parsed.success) throw new FrameError("invalid_field", describeIssues(parsed.error, t), t);
  return parsed.data;
}

/** Decodes and validates one frame from a device. Throws FrameError. */
export function decodeClientFrame(data: unknown, opts: DecodeOptions = {}): ClientFrame {
  return decodeWith(data, CLIENT_FRAME_TYPES, ClientFrameSchema, opts);
}

/** Decodes and validates one frame from a gateway (used by the device SDK). Throws FrameError. */
export function decodeServerFrame(data: unknown, opts: DecodeOptions = {}): ServerFrame {
  return decodeWith(data, SERVER_FRAME_TYPES, ServerFrameSchema, opts);
}

/**
 * Encodes any frame. Every number of protocol v1 (seqs, ids, epochs, timestamps, durations) is an
 * unsigned integer and goes out as a msgpack uint; anything else (a fractional or negative number,
 * NaN, Infinity) is refused here with a FrameError rather than sent as a float the peer refuses.
 */
export function encodeFrame(frame: ClientFrame | ServerFrame): Uint8Array {
  try {
    return encodeWith((w) => w.value(frame, true));
  } catch (err) {
    if (err instanceof RangeError) throw new FrameError("invalid_field", `${frame.t}: every number on the wire is an unsigned integer (${err.message})`, frame.t, { cause: err });
    throw err;
  }
}

/** Encodes one entry on its own, for splicing into MSGS frames with `encodeMsgsFrame`. */
export function encodeEntry(entry: Entry): Uint8Array {
  return encodeWith((w) => writeEntry(w, entry));
}

/** Writes an entry map; field order is part of the byte-level contract of spliced frames. */
export function writeEntry(w: MsgpackWriter, entry: Entry): void {
  w.mapHeader(6);
  w.str("seq").uint(entry.seq);
  w.str("id").str(entry.id);
  w.str("lane").str(entry.lane);
  w.str("prev");
  if (entry.prev === null) w.nil();
  else w.uint(entry.prev);
  w.str("ts").uint(entry.ts);
  w.str("b").bin(entry.b);
}

/**
 * A MSGS frame from entries encoded once by `encodeEntry`: the fan-out path shares those bytes
 * among every connection instead of encoding per receiver.
 */
export function encodeMsgsFrame(
  shard: number,
  encodedEntries: readonly Uint8Array[],
  extra: { id?: number; more?: boolean } = {},
): Uint8Array {
  return encodeWith((w) => {
    w.mapHeader(3 + (extra.id !== undefined ? 1 : 0) + (extra.more !== undefined ? 1 : 0));
    w.str("t").str("MSGS");
    w.str("shard").uint(shard);
    w.str("e").arrayHeader(encodedEntries.length);
    for (const e of encodedEntries) w.raw(e);
    if (extra.id !== undefined) w.str("id").uint(extra.id);
    if (extra.more !== undefined) w.str("more").bool(extra.more);
  });
}

/**
 * A live MSGS frame (no `id`, no `more`) of the `n` entries `entryAt` gives, written in one pass:
 * the same bytes as encodeMsgsFrame over their encodeEntry, without an allocation per entry (a
 * frame that only one connection sends).
 */
export function encodeLiveMsgsFrame(shard: number, n: number, entryAt: (i: number) => Entry): Uint8Array {
  return encodeWith((w) => {
    w.mapHeader(3);
    w.str("t").str("MSGS");
    w.str("shard").uint(shard);
    w.str("e").arrayHeader(n);
    for (let i = 0; i < n; i++) writeEntry(w, entryAt(i));
  });
}
