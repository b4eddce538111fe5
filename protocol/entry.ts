/**
 * What a mailbox entry looks like inside NATS:
 * - in a shard stream, the body `{id, d, ts, b}` (message id, dispatch id, ms, bytes) under the
 *   subject `mbx.<shard>.<user>.<lane>` (docs/design.md, "Users and shards");
 * - in a push batch (`jetgate.push.gw.<gateway>`, `jetgate.push.any`), an array of
 *   `{u, shard, epoch, e: Entry, pa}` published by the owning worker; `pa` is the user's previous
 *   seq over all lanes (nil when unknown), so a gateway can tell a lost push in any lane before it
 *   sends a later entry (a lane's `prev` alone finds the loss only at that lane's next entry, when
 *   the missing seq is already below what the device has).
 *
 * Both are read on hot paths (every entry a worker processes, every push a gateway fans out), so
 * they are checked by hand rather than by zod; the checks are as strict as the frame schemas.
 */
import { JetgateError } from "./errors.js";
import { MAX_BODY_BYTES, type Entry } from "./frames.js";
import { idProblem } from "./ids.js";
import { encodeWith, unpackOne } from "./msgpack.js";
import { MAX_EPOCH, U64_MAX } from "./seq.js";
import { writeEntry } from "./codec.js";

export class EntryFormatError extends JetgateError {
  constructor(message: string, options?: { cause?: unknown }) {
    super("ENTRY_FORMAT", message, options);
  }
}

export interface StoredEntry {
  /** message_id: devices dedup by it. */
  id: string;
  /** dispatch_id: the worker dedups `dispatch_id:user` by it. */
  d: string;
  ts: number;
  b: Uint8Array<ArrayBuffer>;
}

export function encodeStoredEntry(e: StoredEntry): Uint8Array {
  return encodeWith((w) => w.mapHeader(4).str("id").str(e.id).str("d").str(e.d).str("ts").uint(e.ts).str("b").bin(e.b));
}

function asMap(bytes: Uint8Array, what: string): Record<string, unknown> {
  let v: unknown;
  try {
    v = unpackOne(bytes);
  } catch (err) {
    throw new EntryFormatError(`${what} is not msgpack`, { cause: err });
  }
  if (v === null || typeof v !== "object" || Array.isArray(v) || v instanceof Uint8Array) {
    throw new EntryFormatError(`${what} is not a map`);
  }
  return v as Record<string, unknown>;
}

function checkId(kind: "message" | "dispatch" | "lane" | "user", v: unknown, what: string): string {
  const p = idProblem(kind, v);
  if (p !== undefined) throw new EntryFormatError(`${what}: ${kind} id ${p}`);
  return v as string;
}

function checkBytes(v: unknown, what: string): Uint8Array<ArrayBuffer> {
  if (!(v instanceof Uint8Array)) throw new EntryFormatError(`${what}: body must be bytes`);
  if (v.byteLength > MAX_BODY_BYTES) throw new EntryFormatError(`${what}: body over ${MAX_BODY_BYTES} bytes`);
  return v as Uint8Array<ArrayBuffer>;
}

function checkTs(v: unknown, what: string): number {
  const n = typeof v === "bigint" && v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v;
  if (typeof n !== "number" || !Number.isSafeInteger(n) || n < 0) throw new EntryFormatError(`${what}: ts must be a ms timestamp`);
  return n;
}

function checkU64(v: unknown, what: string): bigint {
  const n = typeof v === "number" && Number.isSafeInteger(v) ? BigInt(v) : v;
  if (typeof n !== "bigint" || n < 0n || n > U64_MAX) throw new EntryFormatError(`${what} must be a u64`);
  return n;
}

export function decodeStoredEntry(bytes: Uint8Array): StoredEntry {
  const m = asMap(bytes, "stored entry");
  return {
    id: checkId("message", m.id, "stored entry"),
    d: checkId("dispatch", m.d, "stored entry"),
    ts: checkTs(m.ts, "stored entry"),
    b: checkBytes(m.b, "stored entry"),
  };
}

export interface Push {
  user: string;
  shard: number;
  epoch: number;
  entry: Entry;
  /** The user's previous seq over all lanes; null when the worker could not know it. */
  prevAll: bigint | null;
}

/**
 * Encodes one push on its own, for splicing into batches with `encodePushBatch`: a push routed to
 * several gateways is encoded once. The entry inside is the wire entry.
 */
export function encodePush(p: Push): Uint8Array {
  return encodeWith((w) => {
    w.mapHeader(5).str("u").str(p.user).str("shard").uint(p.shard).str("epoch").uint(p.epoch).str("pa");
    if (p.prevAll === null) w.nil();
    else w.uint(p.prevAll);
    w.str("e");
    writeEntry(w, p.entry);
  });
}

/** One NATS message of pushes (a msgpack array), from pushes encoded by `encodePush`. */
export function encodePushBatch(encoded: readonly Uint8Array[]): Uint8Array {
  return encodeWith((w) => {
    w.arrayHeader(encoded.length);
    for (const e of encoded) w.raw(e);
  });
}

/**
 * The pushes of a batch message, in order. A push that does not read is left out and counted (one
 * bad push must not cost the others); a message that is not a batch at all throws.
 */
export function decodePushBatch(bytes: Uint8Array): { pushes: Push[]; unreadable: number } {
  let v: unknown;
  try {
    v = unpackOne(bytes);
  } catch (err) {
    throw new EntryFormatError("push batch is not msgpack", { cause: err });
  }
  if (!Array.isArray(v)) throw new EntryFormatError("push batch is not an array");
  const pushes: Push[] = [];
  let unreadable = 0;
  for (const item of v) {
    try {
      pushes.push(readPush(item));
    } catch (err) {
      if (!(err instanceof EntryFormatError)) throw err;
      unreadable++;
    }
  }
  return { pushes, unreadable };
}

function readPush(v: unknown): Push {
  if (v === null || typeof v !== "object" || Array.isArray(v) || v instanceof Uint8Array) throw new EntryFormatError("push is not a map");
  const m = v as Record<string, unknown>;
  const user = checkId("user", m.u, "push");
  const shard = m.shard;
  const epoch = m.epoch;
  if (typeof shard !== "number" || !Number.isInteger(shard) || shard < 0 || shard > 0xffffffff) throw new EntryFormatError("push: bad shard");
  if (typeof epoch !== "number" || !Number.isInteger(epoch) || epoch < 0 || epoch > MAX_EPOCH) throw new EntryFormatError("push: bad epoch");
  const e = m.e;
  if (e === null || typeof e !== "object" || Array.isArray(e) || e instanceof Uint8Array) throw new EntryFormatError("push: e must be a map");
  const x = e as Record<string, unknown>;
  const entry: Entry = {
    seq: checkU64(x.seq, "push seq"),
    id: checkId("message", x.id, "push"),
    lane: checkId("lane", x.lane, "push"),
    prev: x.prev === null || x.prev === undefined ? null : checkU64(x.prev, "push prev"),
    ts: checkTs(x.ts, "push"),
    b: checkBytes(x.b, "push"),
  };
  const prevAll = m.pa === null || m.pa === undefined ? null : checkU64(m.pa, "push pa");
  return { user, shard, epoch, entry, prevAll };
}

/**
 * A hot-cache record (Redis stream entry of fields `s`, `p`, `l`, `e`): `s` the seq and `p` the prev
 * as 20-digit decimals (`p` empty when unknown), `l` the lane, `e` the stored entry body exactly as
 * it is in the shard stream. `prev` is decided inside the Redis script, and reusing the stream body
 * spares the worker an encode per entry.
 */
export function decodeCacheRecord(seq: string, prev: string, lane: string, body: Uint8Array): Entry {
  if (!/^\d{1,20}$/.test(seq) || (prev !== "" && !/^\d{1,20}$/.test(prev))) throw new EntryFormatError("cache record: bad seq or prev");
  const e = decodeStoredEntry(body);
  return {
    seq: checkU64(BigInt(seq), "cache seq"),
    id: e.id,
    lane: checkId("lane", lane, "cache record"),
    prev: prev === "" ? null : checkU64(BigInt(prev), "cache prev"),
    ts: e.ts,
    b: e.b,
  };
}
