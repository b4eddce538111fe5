import { test } from "node:test";
import assert from "node:assert/strict";
import {
  encodeStoredEntry, decodeStoredEntry, encodePush, encodePushBatch, decodePushBatch, decodeCacheRecord, EntryFormatError, pack,
  composeSeq, MAX_BODY_BYTES,
} from "../../protocol/index.js";

const b = new Uint8Array([9, 8, 7]);

test("entry - stored entry round-trips", () => {
  const e = { id: "m1", d: "d1", ts: 1_764_000_000_000, b };
  assert.deepEqual(decodeStoredEntry(encodeStoredEntry(e)), e);
});

test("entry - a push batch round-trips with seqs above 2^53 and an unknown prev, in order", () => {
  const entry = { seq: composeSeq(100, 5), id: "m1", lane: "chat", prev: null, ts: 5, b };
  const withPrev = { ...entry, seq: composeSeq(100, 6), prev: composeSeq(100, 4) };
  const pushes = [
    { user: "ann", shard: 7, epoch: 100, entry, prevAll: null },
    { user: "bob", shard: 7, epoch: 100, entry: withPrev, prevAll: composeSeq(100, 4) },
  ];
  assert.deepEqual(decodePushBatch(encodePushBatch(pushes.map(encodePush))), { pushes, unreadable: 0 });
  assert.deepEqual(decodePushBatch(encodePushBatch([])), { pushes: [], unreadable: 0 });
});

test("entry - a push that does not read is left out of its batch and counted; the others are kept", () => {
  const good = { user: "ann", shard: 1, epoch: 1, entry: { seq: composeSeq(1, 1), id: "m", lane: "l", prev: null, ts: 1, b }, prevAll: null };
  const bad = [
    pack({ u: "a b", shard: 1, epoch: 1, e: {} }), // unsafe user id
    pack({ u: "ann", shard: 1, epoch: 70000, e: {} }), // epoch over 16 bits
    pack({ u: "ann", shard: 1, epoch: 1, e: 5 }), // e not a map
    pack({ u: "ann", shard: 1, epoch: 1, e: { seq: -1, id: "a", lane: "l", prev: null, ts: 1, b } }), // negative seq
    pack(7), // not a map
  ];
  const got = decodePushBatch(encodePushBatch([encodePush(good), ...bad, encodePush(good)]));
  assert.equal(got.unreadable, bad.length);
  assert.deepEqual(got.pushes, [good, good]);
});

test("entry - a cache record rebuilds the entry", () => {
  const e = decodeCacheRecord("00000281474976710657", "", "l", encodeStoredEntry({ id: "m", d: "d", ts: 3, b }));
  assert.deepEqual({ ...e, b: [...e.b] }, { seq: composeSeq(1, 1), id: "m", lane: "l", prev: null, ts: 3, b: [...b] });
});

test("entry - malformed entries and pushes are refused by name", () => {
  const bad: [string, () => unknown][] = [
    ["stored: not msgpack", () => decodeStoredEntry(new Uint8Array([0xc1]))],
    ["stored: not a map", () => decodeStoredEntry(pack([1]))],
    ["stored: bad message id", () => decodeStoredEntry(pack({ id: "a b", d: "d", ts: 1, b }))],
    ["stored: body not bytes", () => decodeStoredEntry(pack({ id: "a", d: "d", ts: 1, b: "x" }))],
    ["stored: body too big", () => decodeStoredEntry(pack({ id: "a", d: "d", ts: 1, b: new Uint8Array(MAX_BODY_BYTES + 1) }))],
    ["stored: negative ts", () => decodeStoredEntry(pack({ id: "a", d: "d", ts: -1, b }))],
    ["push batch: not msgpack", () => decodePushBatch(new Uint8Array([0xc1]))],
    ["push batch: not an array", () => decodePushBatch(pack({ u: "ann" }))],
    ["cache: bad seq", () => decodeCacheRecord("x", "", "l", encodeStoredEntry({ id: "m", d: "d", ts: 3, b }))],
    ["cache: bad lane", () => decodeCacheRecord("1", "", "a.b", encodeStoredEntry({ id: "m", d: "d", ts: 3, b }))],
  ];
  for (const [name, fn] of bad) assert.throws(fn, EntryFormatError, name);
});
