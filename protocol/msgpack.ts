/**
 * msgpack for the wire: msgpackr decodes (fast, bounds-checked), our writer encodes.
 *
 * Why a writer of our own: msgpackr writes a bigint below 2^63 as a signed int64 and an integer
 * number above 2^32 (a millisecond timestamp) as a float64, while protocol v1 says every u64 is a
 * msgpack unsigned int of the smallest width. The writer also lets a frame splice in entries that
 * were encoded once (`raw`), so a fan-out encodes each entry once for all its receivers.
 * Plain msgpack only: no records, no extension types, in either direction.
 */
import { C1, Unpackr } from "msgpackr";

const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: true, int64AsType: "bigint", moreTypes: false });

export class MsgpackDecodeError extends Error {
  override readonly name = "MsgpackDecodeError";
  readonly reason: "not_msgpack" | "trailing_bytes";
  constructor(reason: "not_msgpack" | "trailing_bytes", message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.reason = reason;
  }
}

/**
 * Decodes exactly one msgpack value that fills the whole buffer. Truncated data, unknown extension
 * types and nesting deep enough to exhaust the stack all come back as MsgpackDecodeError.
 */
export function unpackOne(bytes: Uint8Array): unknown {
  let value: unknown;
  try {
    value = unpackr.unpack(bytes);
  } catch (err) {
    const msg = err instanceof Error ? err.message : String(err);
    if (msg.startsWith("Data read, but end of buffer not reached")) {
      throw new MsgpackDecodeError("trailing_bytes", "trailing bytes after the frame", { cause: err });
    }
    throw new MsgpackDecodeError("not_msgpack", `not valid msgpack: ${msg}`, { cause: err });
  }
  // msgpackr reads the reserved byte 0xc1 as its own marker instead of failing.
  if (value === C1) throw new MsgpackDecodeError("not_msgpack", "not valid msgpack: reserved byte 0xc1");
  return value;
}

const textEncoder = new TextEncoder();

/** Growable msgpack writer. */
export class MsgpackWriter {
  private buf: Uint8Array;
  private view: DataView;
  private pos = 0;

  constructor(initialSize = 256) {
    this.buf = new Uint8Array(initialSize);
    this.view = new DataView(this.buf.buffer);
  }

  get length(): number {
    return this.pos;
  }

  /** Empties the writer, keeping its buffer. */
  reset(): this {
    this.pos = 0;
    return this;
  }

  private ensure(n: number): void {
    if (this.pos + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.pos + n) size *= 2;
    const next = new Uint8Array(size);
    next.set(this.buf.subarray(0, this.pos));
    this.buf = next;
    this.view = new DataView(next.buffer);
  }

  nil(): this {
    this.ensure(1);
    this.buf[this.pos++] = 0xc0;
    return this;
  }

  bool(v: boolean): this {
    this.ensure(1);
    this.buf[this.pos++] = v ? 0xc3 : 0xc2;
    return this;
  }

  /** Unsigned int in the smallest width; accepts a safe-integer number or a bigint in 0..2^64-1. */
  uint(v: number | bigint): this {
    if (typeof v === "bigint") {
      if (v < 0n || v > 0xffffffffffffffffn) throw new RangeError(`uint out of range: ${v}`);
      if (v <= 0xffffffffn) return this.uint(Number(v));
      this.ensure(9);
      this.buf[this.pos] = 0xcf;
      this.view.setBigUint64(this.pos + 1, v);
      this.pos += 9;
      return this;
    }
    if (!Number.isSafeInteger(v) || v < 0) throw new RangeError(`uint out of range: ${v}`);
    this.ensure(9);
    const b = this.buf;
    if (v < 0x80) b[this.pos++] = v;
    else if (v <= 0xff) {
      b[this.pos++] = 0xcc;
      b[this.pos++] = v;
    } else if (v <= 0xffff) {
      b[this.pos] = 0xcd;
      this.view.setUint16(this.pos + 1, v);
      this.pos += 3;
    } else if (v <= 0xffffffff) {
      b[this.pos] = 0xce;
      this.view.setUint32(this.pos + 1, v);
      this.pos += 5;
    } else {
      b[this.pos] = 0xcf;
      this.view.setBigUint64(this.pos + 1, BigInt(v));
      this.pos += 9;
    }
    return this;
  }

  /** Signed int (negative values only reach here; non-negative ones are written as uint). */
  int(v: number | bigint): this {
    if (v >= 0) return this.uint(v);
    const n = BigInt(v);
    if (n < -0x8000000000000000n) throw new RangeError(`int out of range: ${v}`);
    this.ensure(9);
    if (n >= -32n) {
      this.buf[this.pos++] = Number(n) & 0xff;
      return this;
    }
    if (n >= -0x80000000n) {
      this.buf[this.pos] = 0xd2;
      this.view.setInt32(this.pos + 1, Number(n));
      this.pos += 5;
      return this;
    }
    this.buf[this.pos] = 0xd3;
    this.view.setBigInt64(this.pos + 1, n);
    this.pos += 9;
    return this;
  }

  float(v: number): this {
    this.ensure(9);
    this.buf[this.pos] = 0xcb;
    this.view.setFloat64(this.pos + 1, v);
    this.pos += 9;
    return this;
  }

  str(s: string): this {
    const len = s.length;
    if (len < 32) {
      // Short strings (keys, ids, lanes) are almost always ASCII: copy the char codes directly,
      // which is far cheaper than a TextEncoder call per string.
      this.ensure(1 + len);
      const b = this.buf;
      const start = this.pos + 1;
      let i = 0;
      for (; i < len; i++) {
        const c = s.charCodeAt(i);
        if (c >= 0x80) break;
        b[start + i] = c;
      }
      if (i === len) {
        b[this.pos] = 0xa0 | len;
        this.pos = start + len;
        return this;
      }
    }
    // Worst case 3 bytes per UTF-16 unit; write the body first, then the header in front of it.
    const max = s.length * 3;
    this.ensure(5 + max);
    const headerLen = max < 32 ? 1 : max <= 0xff ? 2 : max <= 0xffff ? 3 : 5;
    const start = this.pos + headerLen;
    const { written } = textEncoder.encodeInto(s, this.buf.subarray(start));
    const n = written ?? 0;
    const b = this.buf;
    if (headerLen === 1) b[this.pos] = 0xa0 | n;
    else if (headerLen === 2) {
      b[this.pos] = 0xd9;
      b[this.pos + 1] = n;
    } else if (headerLen === 3) {
      b[this.pos] = 0xda;
      this.view.setUint16(this.pos + 1, n);
    } else {
      b[this.pos] = 0xdb;
      this.view.setUint32(this.pos + 1, n);
    }
    this.pos = start + n;
    return this;
  }

  bin(bytes: Uint8Array): this {
    const n = bytes.byteLength;
    this.ensure(5 + n);
    if (n <= 0xff) {
      this.buf[this.pos++] = 0xc4;
      this.buf[this.pos++] = n;
    } else if (n <= 0xffff) {
      this.buf[this.pos] = 0xc5;
      this.view.setUint16(this.pos + 1, n);
      this.pos += 3;
    } else {
      this.buf[this.pos] = 0xc6;
      this.view.setUint32(this.pos + 1, n);
      this.pos += 5;
    }
    this.buf.set(bytes, this.pos);
    this.pos += n;
    return this;
  }

  private header(n: number, fix: number, m16: number, m32: number): this {
    this.ensure(5);
    if (n < 16) this.buf[this.pos++] = fix | n;
    else if (n <= 0xffff) {
      this.buf[this.pos] = m16;
      this.view.setUint16(this.pos + 1, n);
      this.pos += 3;
    } else {
      this.buf[this.pos] = m32;
      this.view.setUint32(this.pos + 1, n);
      this.pos += 5;
    }
    return this;
  }

  arrayHeader(n: number): this {
    return this.header(n, 0x90, 0xdc, 0xdd);
  }

  mapHeader(n: number): this {
    return this.header(n, 0x80, 0xde, 0xdf);
  }

  /** Bytes that are already one or more complete msgpack values. */
  raw(bytes: Uint8Array): this {
    this.ensure(bytes.byteLength);
    this.buf.set(bytes, this.pos);
    this.pos += bytes.byteLength;
    return this;
  }

  /**
   * Any plain value: null, boolean, number (integers as int, others float64), bigint, string,
   * Uint8Array (bin), array, plain object (keys with undefined values are left out). With
   * `uintOnly` every number and bigint must be an unsigned integer (RangeError otherwise).
   */
  value(v: unknown, uintOnly = false): this {
    switch (typeof v) {
      case "string":
        return this.str(v);
      case "boolean":
        return this.bool(v);
      case "bigint":
        return uintOnly ? this.uint(v) : this.int(v);
      case "number":
        if (uintOnly) return this.uint(v);
        return Number.isSafeInteger(v) ? this.int(v) : this.float(v);
      case "undefined":
        return this.nil();
      case "object": {
        if (v === null) return this.nil();
        if (v instanceof Uint8Array) return this.bin(v);
        if (Array.isArray(v)) {
          this.arrayHeader(v.length);
          for (const item of v) this.value(item, uintOnly);
          return this;
        }
        const entries = Object.entries(v as Record<string, unknown>).filter(([, x]) => x !== undefined);
        this.mapHeader(entries.length);
        for (const [k, x] of entries) this.str(k).value(x, uintOnly);
        return this;
      }
      default:
        throw new TypeError(`cannot encode a ${typeof v} as msgpack`);
    }
  }

  /** A copy of the bytes written so far (a small one shares a slab with others: see copyOut). */
  toBytes(): Uint8Array {
    return copyOut(this.buf, this.pos);
  }
}

/**
 * Outputs up to POOLED_MAX bytes are carved from a shared slab instead of each getting an
 * ArrayBuffer of its own, as Node's Buffer.allocUnsafe pools: an ArrayBuffer per encode (every
 * entry, push and frame on the live path) is a malloc, a free and a backing store for the
 * garbage collector to track, and in a busy gateway's profile those stood out. The views are
 * plain Uint8Arrays (byteOffset may be non-zero); one kept alive keeps its slab's SLAB_BYTES.
 */
const SLAB_BYTES = 8 * 1024;
const POOLED_MAX = SLAB_BYTES / 8;
let slab = new ArrayBuffer(SLAB_BYTES);
let slabUsed = 0;

function copyOut(src: Uint8Array, n: number): Uint8Array {
  if (n > POOLED_MAX) return src.slice(0, n);
  if (slabUsed + n > SLAB_BYTES) {
    slab = new ArrayBuffer(SLAB_BYTES);
    slabUsed = 0;
  }
  const out = new Uint8Array(slab, slabUsed, n);
  out.set(src.subarray(0, n));
  // 8-byte aligned, as Node's pool keeps its slices
  slabUsed += (n + 7) & ~7;
  return out;
}

const scratch = new MsgpackWriter(64 * 1024);
let scratchBusy = false;

/**
 * Encodes with a shared scratch writer and returns a copy of the bytes: one allocation per encode
 * on hot paths. `write` must be synchronous; a nested call gets a writer of its own.
 */
export function encodeWith(write: (w: MsgpackWriter) => void): Uint8Array {
  if (scratchBusy) {
    const w = new MsgpackWriter();
    write(w);
    return w.toBytes();
  }
  scratchBusy = true;
  try {
    write(scratch.reset());
    return scratch.toBytes();
  } finally {
    scratchBusy = false;
  }
}

/** Encodes one plain value (see MsgpackWriter.value). */
export function pack(v: unknown): Uint8Array {
  return encodeWith((w) => w.value(v));
}
