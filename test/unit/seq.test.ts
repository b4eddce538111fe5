import { test } from "node:test";
import assert from "node:assert/strict";
import fc from "fast-check";
import {
  composeSeq, seqLabel, seqEpoch, seqOffset, compareSeq, encodeSeq, decodeSeq, assertSeq,
  SeqRangeError, MAX_OFFSET, MAX_EPOCH, U64_MAX,
} from "../../protocol/index.js";

const epochArb = fc.integer({ min: 0, max: MAX_EPOCH });
const offsetArb = fc.bigInt({ min: 0n, max: MAX_OFFSET });
const u64Arb = fc.bigInt({ min: 0n, max: U64_MAX });

function compareBytes(a: Uint8Array, b: Uint8Array): number {
  for (let i = 0; i < Math.min(a.length, b.length); i++) if (a[i] !== b[i]) return a[i]! < b[i]! ? -1 : 1;
  return a.length - b.length;
}

test("seq - compose and decompose round trip for every epoch, including seqs above 2^53", () => {
  fc.assert(fc.property(epochArb, offsetArb, (e, o) => {
    const s = composeSeq(e, o);
    assert.equal(typeof s, "bigint");
    assert.equal(seqEpoch(s), e);
    assert.equal(seqOffset(s), o);
  }), { numRuns: 2000 });
  // epoch 32 is where a JS number would start losing integers
  const s = composeSeq(32, 1);
  assert.ok(s > BigInt(Number.MAX_SAFE_INTEGER));
  assert.equal(seqEpoch(s), 32);
  assert.equal(seqOffset(s), 1n);
});

test("seq - byte order of the 8-byte encoding equals numeric order over the whole u64 range", () => {
  fc.assert(fc.property(u64Arb, u64Arb, (a, b) => {
    const byBytes = Math.sign(compareBytes(encodeSeq(a), encodeSeq(b)));
    assert.equal(byBytes, compareSeq(a, b));
    assert.equal(decodeSeq(encodeSeq(a)), a);
  }), { numRuns: 5000 });
  assert.deepEqual([...encodeSeq(U64_MAX)], [255, 255, 255, 255, 255, 255, 255, 255]);
  assert.deepEqual([...encodeSeq(0n)], [0, 0, 0, 0, 0, 0, 0, 0]);
});

test("seq - an epoch bump yields a seq above every seq of the previous epoch", () => {
  fc.assert(fc.property(fc.integer({ min: 0, max: MAX_EPOCH - 1 }), offsetArb, offsetArb, (e, oldOff, newOff) => {
    assert.ok(composeSeq(e + 1, newOff) > composeSeq(e, oldOff));
  }), { numRuns: 2000 });
  assert.ok(composeSeq(1, 0) > composeSeq(0, MAX_OFFSET));
});

test("seq - overflow and bad inputs throw SeqRangeError, never wrap", () => {
  const bad: [string, () => unknown][] = [
    ["offset 2^48", () => composeSeq(0, MAX_OFFSET + 1n)],
    ["epoch 2^16", () => composeSeq(MAX_EPOCH + 1, 0)],
    ["negative epoch", () => composeSeq(-1, 0)],
    ["negative offset", () => composeSeq(0, -1n)],
    ["non-integer offset", () => composeSeq(0, 1.5)],
    ["NaN epoch", () => composeSeq(Number.NaN, 1)],
    ["unsafe number offset", () => composeSeq(0, 2 ** 60)],
    ["seq above u64", () => assertSeq(U64_MAX + 1n)],
    ["negative seq", () => seqEpoch(-1n)],
    ["number seq", () => assertSeq(5)],
    ["7-byte decode", () => decodeSeq(new Uint8Array(7))],
  ];
  for (const [what, fn] of bad) {
    assert.throws(fn, (err: unknown) => err instanceof SeqRangeError && err.name === "SeqRangeError" && err.code === "SEQ_RANGE", what);
  }
});

test("seq - decodeSeq reads a view inside a larger buffer", () => {
  const buf = new Uint8Array(12);
  buf.set(encodeSeq(composeSeq(7, 99)), 3);
  assert.equal(decodeSeq(buf.subarray(3, 11)), composeSeq(7, 99));
});

test("seqLabel: the u64 and its epoch:offset, as logs, the CLI and the demos print a seq", () => {
  assert.equal(seqLabel(0n), "0 (0:0)");
  assert.equal(seqLabel(composeSeq(1, 3)), "281474976710659 (1:3)");
  assert.equal(seqLabel(U64_MAX), `${U64_MAX} (${MAX_EPOCH}:${MAX_OFFSET})`);
  fc.assert(fc.property(fc.integer({ min: 0, max: MAX_EPOCH }), fc.bigInt({ min: 0n, max: MAX_OFFSET }), (e, o) => {
    assert.equal(seqLabel(composeSeq(e, o)), `${composeSeq(e, o)} (${e}:${o})`);
  }));
});
