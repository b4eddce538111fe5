import { test } from "node:test";
import assert from "node:assert/strict";
import fc from "fast-check";
import { pack, unpackOne, MsgpackWriter, MsgpackDecodeError } from "../../protocol/index.js";

const hex = (b: Uint8Array) => Buffer.from(b).toString("hex");

test("msgpack - unsigned ints use the smallest unsigned width, bigint or number", () => {
  const cases: [number | bigint, string][] = [
    [0, "00"], [127, "7f"], [128, "cc80"], [255n, "ccff"], [256, "cd0100"], [65536, "ce00010000"],
    [2 ** 32, "cf0000000100000000"], [1_700_000_000_000, "cf0000018bcfe56800"],
    [(1n << 63n) + 1n, "cf8000000000000001"], [(1n << 64n) - 1n, "cfffffffffffffffff"],
  ];
  for (const [v, h] of cases) assert.equal(hex(new MsgpackWriter().uint(v).toBytes()), h, String(v));
  assert.throws(() => new MsgpackWriter().uint(-1), RangeError);
  assert.throws(() => new MsgpackWriter().uint(1n << 64n), RangeError);
});

test("msgpack - signed ints, floats, strings, bins and containers", () => {
  assert.equal(hex(pack(-1)), "ff");
  assert.equal(hex(pack(-33)), "d2ffffffdf");
  assert.equal(hex(pack(-(2 ** 40))), "d3ffffff0000000000");
  assert.equal(hex(pack(1.5)), "cb3ff8000000000000");
  assert.equal(hex(pack("a")), "a161");
  assert.equal(hex(pack(new Uint8Array([1, 2]))), "c4020102");
  assert.equal(hex(pack({ a: 1, skip: undefined })), "81a16101");
  assert.equal(hex(pack([true, false, null])), "93c3c2c0");
});

test("msgpack - the writer's output decodes to the same value (property)", () => {
  const leaf = fc.oneof(
    fc.string({ unit: "grapheme", maxLength: 300 }),
    fc.integer({ min: -(2 ** 31), max: 2 ** 31 }),
    fc.bigInt({ min: 0n, max: (1n << 64n) - 1n }),
    fc.boolean(),
    fc.constant(null),
    fc.uint8Array({ maxLength: 70000 }).map((b) => Buffer.from(b)),
  );
  const value = fc.letrec((tie) => ({
    v: fc.oneof({ depthSize: "small" }, leaf, fc.array(tie("v"), { maxLength: 20 }),
      fc.dictionary(fc.string({ maxLength: 8 }).filter((k) => k !== "__proto__"), tie("v"), { maxKeys: 20 })),
  })).v;
  const norm = (v: unknown): unknown => {
    if (typeof v === "bigint") return v <= 0xffffffffn ? Number(v) : v;
    if (Array.isArray(v)) return v.map(norm);
    if (v instanceof Uint8Array) return hex(v);
    if (v !== null && typeof v === "object") return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, norm(x)]));
    return v;
  };
  fc.assert(fc.property(value, (v) => {
    assert.deepEqual(norm(unpackOne(pack(v))), norm(v));
  }), { numRuns: 300 });
});

test("msgpack - unpackOne names truncated data, trailing bytes and unknown extensions", () => {
  const reasons: [string, string][] = [
    ["82a174", "not_msgpack"],        // map of 2 with nothing after the first key
    ["c1", "not_msgpack"],            // reserved byte
    ["dbffffffff41", "not_msgpack"],  // str32 declaring 4 GiB
    ["c0c0", "trailing_bytes"],
    ["d4010a", "not_msgpack"],        // unknown extension type 1
  ];
  for (const [h, reason] of reasons) {
    assert.throws(() => unpackOne(Buffer.from(h, "hex")), (e: unknown) => e instanceof MsgpackDecodeError && e.reason === reason, h);
  }
  const deep = Buffer.concat([Buffer.alloc(200_000, 0x91), Buffer.from("c0", "hex")]);
  assert.throws(() => unpackOne(deep), (e: unknown) => e instanceof MsgpackDecodeError && e.reason === "not_msgpack");
});

test("msgpack - the shared scratch writer hands out copies and survives nested and large encodes", async () => {
  const { encodeWith } = await import("../../protocol/msgpack.js");
  const a = pack({ a: 1 });
  const b = pack({ b: 2 });
  assert.equal(hex(a), "81a16101", "an earlier result is not overwritten by a later encode");
  assert.equal(hex(b), "81a16202");
  const nested = encodeWith((w) => {
    w.arrayHeader(2).raw(pack("x"));
    w.raw(pack("y"));
  });
  assert.equal(hex(nested), "92a178a179");
  const big = pack(new Uint8Array(200_000));
  assert.equal(big.byteLength, 200_005);
  assert.equal(hex(pack(1)), "01", "scratch still usable after growing");
});

test("msgpack - short ASCII and non-ASCII strings both encode to valid UTF-8 msgpack", () => {
  for (const s of ["", "a", "x".repeat(31), "x".repeat(32), "é", "ab€", "日本語のテキスト", "😀".repeat(10), "a".repeat(30) + "é"]) {
    assert.equal(unpackOne(pack(s)), s, JSON.stringify(s));
  }
  assert.equal(hex(pack("abc")), "a3616263");
});

test("msgpack - small encodes share a slab without sharing bytes; a large one has its own buffer", () => {
  // enough small encodes to fill several slabs: each keeps its own bytes whatever comes after it
  const outs = Array.from({ length: 500 }, (_, i) => ({ i, b: pack({ i, s: "x".repeat(i % 97) }) }));
  for (const { i, b } of outs) assert.deepEqual(unpackOne(b), { i, s: "x".repeat(i % 97) }, `encode ${i}`);
  const [a, b] = [pack("first"), pack("second")];
  assert.equal(a.buffer, b.buffer, "two small encodes in a row: one slab");
  assert.ok(a.byteOffset + a.byteLength <= b.byteOffset || b.byteOffset + b.byteLength <= a.byteOffset, "no overlap");
  b.fill(0);
  assert.equal(unpackOne(a), "first", "writing into one leaves the other as it was");
  const large = pack(new Uint8Array(4096).fill(7));
  assert.deepEqual([large.byteOffset, large.buffer.byteLength], [0, large.byteLength], "over 1 KiB: a buffer of its own");
});
