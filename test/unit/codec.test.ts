import { test } from "node:test";
import assert from "node:assert/strict";
import {
  encodeFrame, decodeClientFrame, decodeServerFrame, encodeEntry, encodeLiveMsgsFrame, encodeMsgsFrame, FrameError, pack,
  composeSeq, MAX_BODY_BYTES, MAX_TOKEN_LENGTH, MsgpackWriter, ErrorCode,
  type ClientFrame, type ServerFrame, type Entry,
} from "../../protocol/index.js";

const big = composeSeq(40_000, 2n ** 47n + 5n); // far above 2^53
const sig = new Uint8Array(16).fill(7);
const entry: Entry = { seq: big, id: "m-1", lane: "chat", prev: big - 1n, ts: 1_764_000_000_000, b: new Uint8Array([1, 2, 3]) };

const clientFrames: ClientFrame[] = [
  { t: "AUTH", v: 1, token: "jwt.token.here", device: "dev_1", cursor: { shard: 3, epoch: 40_000, log: "log-a", seq: big, sig }, lanes: ["chat", "default"] },
  { t: "AUTH", v: 1, token: "t", device: "d" },
  { t: "ACK", seq: big },
  { t: "ACK", seq: 0n },
  { t: "PULL", id: 4_000_000_000, after: big, limit: 1000, lane: "chat" },
  { t: "PULL", id: 1, after: 5n, limit: 1 },
  { t: "SEND", id: 9, cmid: "c-1", b: new Uint8Array(1000).fill(9) },
  { t: "PING", id: 3 },
  { t: "PING" },
];

const serverFrames: ServerFrame[] = [
  { t: "AUTH_OK", session: "s1", user: "alice", shard: 3, epoch: 40_000, cursor: { shard: 3, epoch: 40_000, log: "log-a", sig }, from: big, head: big + 10n, trim: 0n, lanes: { chat: big }, hb: 25000 },
  { t: "ERROR", code: "CURSOR_REBASED", msg: "rebased", fatal: false, new_cursor: { shard: 4, epoch: 40_001, log: "log-b", sig }, replay_from_seq: big, old_range: { shard: 3, after: big - 9n, until: big } },
  { t: "ERROR", code: "CURSOR_EXPIRED", msg: "expired", fatal: false, trim_watermark: big, rebuild_required: true, new_cursor: { shard: 3, epoch: 1, log: "l", sig } },
  { t: "ERROR", code: "BAD_FRAME", msg: "x", fatal: true, id: 7 },
  { t: "MSGS", shard: 3, e: [entry, { ...entry, seq: big + 1n, prev: null }], id: 2, more: true },
  { t: "MSGS", shard: 0, e: [] },
  { t: "SYNCED", seq: big },
  { t: "SEND_OK", id: 9, cmid: "c-1", dup: true },
  { t: "PONG", id: 3 },
  { t: "PONG" },
  { t: "GOAWAY", reason: "drain", retry_ms: 1500 },
];

test("codec - every device frame type round-trips, u64 above 2^53 intact", () => {
  for (const f of clientFrames) assert.deepEqual(decodeClientFrame(encodeFrame(f)), f, f.t);
});

test("codec - every gateway frame type round-trips, u64 above 2^53 intact", () => {
  const norm = (v: unknown) => JSON.parse(JSON.stringify(v, (_k, x) => (typeof x === "bigint" ? `${x}n` : x instanceof Uint8Array ? [...x] : x)));
  for (const f of serverFrames) assert.deepEqual(norm(decodeServerFrame(encodeFrame(f))), norm(f), f.t);
});

test("codec - u64 fields decode from every unsigned int width to bigint", () => {
  for (const h of ["05", "cc05", "cd0005", "ce00000005", "cf0000000000000005"]) {
    const bytes = Buffer.concat([Buffer.from("82a174a341434ba3736571", "hex"), Buffer.from(h, "hex")]);
    const f = decodeClientFrame(bytes);
    assert.equal(f.t === "ACK" && f.seq, 5n, h);
  }
});

test("codec - a MSGS frame spliced from pre-encoded entries equals the plain encoding", () => {
  const e2 = { ...entry, seq: big + 1n, prev: null };
  const spliced = encodeMsgsFrame(3, [encodeEntry(entry), encodeEntry(e2)], { id: 2, more: true });
  assert.deepEqual(Buffer.from(spliced), Buffer.from(encodeFrame({ t: "MSGS", shard: 3, e: [entry, e2], id: 2, more: true })));
  const decoded = decodeServerFrame(spliced);
  assert.equal(decoded.t === "MSGS" && decoded.e[0]!.seq, big);
});

test("codec - a live MSGS frame written in one pass equals the spliced and the plain encodings", () => {
  const e2 = { ...entry, seq: big + 1n, prev: big };
  const entries = [entry, e2];
  const live = encodeLiveMsgsFrame(3, entries.length, (i) => entries[i]!);
  assert.deepEqual(Buffer.from(live), Buffer.from(encodeMsgsFrame(3, entries.map(encodeEntry))));
  assert.deepEqual(Buffer.from(live), Buffer.from(encodeFrame({ t: "MSGS", shard: 3, e: entries })));
});

/** Raw map bytes, so a case can carry values the typed encoder would not produce. */
function raw(fields: unknown): Uint8Array {
  return pack(fields);
}
function rawWith(prefixHex: string, key: string, valueHex: string): Uint8Array {
  const w = new MsgpackWriter();
  return Buffer.concat([Buffer.from(prefixHex, "hex"), w.str(key).toBytes(), Buffer.from(valueHex, "hex")]);
}

const rejections: { name: string; data: unknown; reason: string; code?: string; match?: RegExp; maxBytes?: number }[] = [
  { name: "text frame", data: "{\"t\":\"PING\"}", reason: "not_binary" },
  { name: "oversize frame", data: raw({ t: "PING" }), reason: "too_large", code: ErrorCode.TOO_LARGE, maxBytes: 3 },
  { name: "not msgpack", data: Buffer.from("c1", "hex"), reason: "not_msgpack" },
  { name: "truncated", data: raw({ t: "ACK", seq: 5 }).subarray(0, 6), reason: "not_msgpack" },
  { name: "huge declared length", data: Buffer.from("81a174dbffffffff41", "hex"), reason: "not_msgpack" },
  { name: "trailing garbage", data: Buffer.concat([raw({ t: "PING" }), Buffer.from([0])]), reason: "trailing_bytes" },
  { name: "array, not map", data: raw(["PING"]), reason: "not_map" },
  { name: "integer, not map", data: raw(5), reason: "not_map" },
  { name: "bin, not map", data: raw(new Uint8Array(3)), reason: "not_map" },
  { name: "unknown t", data: raw({ t: "HELLO" }), reason: "unknown_type" },
  { name: "missing t", data: raw({ seq: 1 }), reason: "unknown_type" },
  { name: "gateway frame type from a device", data: raw({ t: "PONG" }), reason: "unknown_type" },
  { name: "missing field", data: raw({ t: "ACK" }), reason: "invalid_field", match: /ACK\.seq/ },
  { name: "mistyped field", data: raw({ t: "ACK", seq: "5" }), reason: "invalid_field", match: /ACK\.seq/ },
  { name: "negative seq", data: raw({ t: "ACK", seq: -1 }), reason: "invalid_field", match: /ACK\.seq/ },
  { name: "negative seq as int64", data: raw({ t: "ACK", seq: -(2n ** 40n) }), reason: "invalid_field" },
  { name: "float seq", data: raw({ t: "ACK", seq: 1.5 }), reason: "invalid_field" },
  { name: "seq over 2^53 as float", data: raw({ t: "ACK", seq: 2 ** 70 }), reason: "invalid_field" },
  { name: "epoch over 16 bits", data: raw({ t: "AUTH", v: 1, token: "t", device: "d", cursor: { shard: 1, epoch: 70000, log: "l", seq: 1, sig } }), reason: "invalid_field", match: /cursor\.epoch/ },
  { name: "request id over 32 bits", data: raw({ t: "PING", id: 2 ** 33 }), reason: "invalid_field" },
  { name: "wrong protocol version", data: raw({ t: "AUTH", v: 2, token: "t", device: "d" }), reason: "invalid_field", match: /version/ },
  { name: "oversize token", data: raw({ t: "AUTH", v: 1, token: "x".repeat(MAX_TOKEN_LENGTH + 1), device: "d" }), reason: "invalid_field" },
  { name: "oversize body", data: raw({ t: "SEND", id: 1, cmid: "c", b: new Uint8Array(MAX_BODY_BYTES + 1) }), reason: "invalid_field", match: /SEND\.b/ },
  { name: "body as string", data: raw({ t: "SEND", id: 1, cmid: "c", b: "text" }), reason: "invalid_field" },
  { name: "short cursor sig", data: raw({ t: "AUTH", v: 1, token: "t", device: "d", cursor: { shard: 1, epoch: 1, log: "l", seq: 1, sig: new Uint8Array(15) } }), reason: "invalid_field" },
  { name: "device id with a dot", data: raw({ t: "AUTH", v: 1, token: "t", device: "a.b" }), reason: "invalid_field", match: /device id/ },
  { name: "device id with a wildcard", data: raw({ t: "AUTH", v: 1, token: "t", device: "a>" }), reason: "invalid_field" },
  { name: "cmid with a space", data: raw({ t: "SEND", id: 1, cmid: "a b", b: new Uint8Array(1) }), reason: "invalid_field" },
  { name: "overlong device id", data: raw({ t: "AUTH", v: 1, token: "t", device: "d".repeat(65) }), reason: "invalid_field" },
  { name: "lane with a star", data: raw({ t: "PULL", id: 1, after: 0, limit: 10, lane: "*" }), reason: "invalid_field" },
  { name: "duplicate lanes", data: raw({ t: "AUTH", v: 1, token: "t", device: "d", lanes: ["a", "a"] }), reason: "invalid_field" },
  { name: "PULL limit over the page size", data: raw({ t: "PULL", id: 1, after: 0, limit: 1001 }), reason: "invalid_field" },
  { name: "unknown key", data: raw({ t: "PING", extra: 1 }), reason: "invalid_field" },
  { name: "__proto__ key", data: Buffer.concat([Buffer.from("82", "hex"), pack("t"), pack("PING"), pack("__proto__"), pack({ id: 1 })]), reason: "invalid_field" },
  { name: "extension value (timestamp)", data: rawWith("82a174a450494e47", "id", "d6ff00000001"), reason: "invalid_field" },
  { name: "unknown extension type", data: rawWith("82a174a450494e47", "id", "d4010a"), reason: "not_msgpack" },
  { name: "deep nesting", data: Buffer.concat([Buffer.from("82a174a450494e47a26964", "hex"), Buffer.alloc(100_000, 0x91), Buffer.from("c0", "hex")]), reason: "not_msgpack" },
];

test("codec - every rejection class gets a FrameError with its reason and code", () => {
  for (const c of rejections) {
    assert.throws(
      () => decodeClientFrame(c.data, c.maxBytes !== undefined ? { maxBytes: c.maxBytes } : {}),
      (e: unknown) => {
        assert.ok(e instanceof FrameError, `${c.name}: ${String(e)}`);
        assert.equal(e.name, "FrameError", c.name);
        assert.equal(e.reason, c.reason, `${c.name}: ${e.message}`);
        assert.equal(e.code, c.code ?? ErrorCode.BAD_FRAME, c.name);
        if (c.match) assert.match(e.message, c.match, c.name);
        return true;
      },
      c.name,
    );
  }
});

test("codec - every frame type of the protocol gets past the type check (the names are read off the unions): a bare frame is valid or invalid_field, never unknown_type", () => {
  const reasonOf = (decode: () => unknown): string => {
    try {
      decode();
      return "ok";
    } catch (e) {
      return e instanceof FrameError ? e.reason : String(e);
    }
  };
  for (const t of ["AUTH", "ACK", "PULL", "SEND", "PING", "REFRESH"]) {
    assert.match(reasonOf(() => decodeClientFrame(pack({ t }))), /^(ok|invalid_field)$/, t);
  }
  for (const t of ["AUTH_OK", "ERROR", "MSGS", "SYNCED", "SEND_OK", "PONG", "GOAWAY", "REFRESH_OK"]) {
    assert.match(reasonOf(() => decodeServerFrame(pack({ t }))), /^(ok|invalid_field)$/, t);
  }
});

test("codec - the SDK side drops unknown keys from gateway frames (forward compatible)", () => {
  const f = decodeServerFrame(pack({ t: "PONG", id: 1, future_field: "x" }));
  assert.deepEqual(f, { t: "PONG", id: 1 });
  assert.throws(() => decodeServerFrame(pack({ t: "AUTH" })), (e: unknown) => e instanceof FrameError && e.reason === "unknown_type");
});

test("codec - every number on the wire is an unsigned integer: encoding refuses anything else, by frame and value", () => {
  const bad = [1796061175500.5, 1e303, Infinity, -Infinity, NaN, -1, 2 ** 53];
  for (const exp of bad) {
    assert.throws(
      () => encodeFrame({ t: "REFRESH_OK", exp } as ServerFrame),
      (e: unknown) => e instanceof FrameError && e.reason === "invalid_field" && /^REFRESH_OK: every number on the wire is an unsigned integer/.test(e.message),
      String(exp),
    );
  }
  assert.throws(() => encodeFrame({ t: "GOAWAY", reason: "x", retry_ms: 0.5 }), FrameError);
  assert.throws(() => encodeFrame({ t: "ERROR", code: "UNAVAILABLE", msg: "x", fatal: false, retry_ms: -5 }), FrameError);
  assert.throws(() => encodeFrame({ t: "ACK", seq: -1n } as ClientFrame), FrameError);
  // what is valid still goes out, as uints, and reads back
  const ok = encodeFrame({ t: "REFRESH_OK", id: 7, exp: 1796061175000 });
  assert.deepEqual(decodeServerFrame(ok), { t: "REFRESH_OK", id: 7, exp: 1796061175000 });
  // and the encoder leaves the shared writer usable after a refusal
  assert.deepEqual(decodeServerFrame(encodeFrame({ t: "PONG", id: 1 })), { t: "PONG", id: 1 });
});
