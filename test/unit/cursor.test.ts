import { test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { CURSOR_SIG_BYTES } from "../../protocol/index.js";
import { cursorSigner, CursorKeyError } from "../../protocol/io/index.js";

const k1 = new Uint8Array(randomBytes(32));
const k2 = new Uint8Array(randomBytes(32));

test("cursor - a signed token verifies for the same user", () => {
  const s = cursorSigner([k1]);
  const tok = s.sign("alice", 3, 7, "log-a");
  assert.equal(tok.sig.byteLength, CURSOR_SIG_BYTES);
  assert.deepEqual({ shard: tok.shard, epoch: tok.epoch, log: tok.log }, { shard: 3, epoch: 7, log: "log-a" });
  assert.equal(s.verify("alice", tok), true);
});

test("cursor - altering user, shard, epoch, log or any signature byte fails", () => {
  const s = cursorSigner([k1]);
  const tok = s.sign("alice", 3, 7, "log-a");
  assert.equal(s.verify("bob", tok), false, "user");
  assert.equal(s.verify("alice", { ...tok, shard: 4 }), false, "shard");
  assert.equal(s.verify("alice", { ...tok, epoch: 8 }), false, "epoch");
  assert.equal(s.verify("alice", { ...tok, log: "log-b" }), false, "log");
  for (let i = 0; i < tok.sig.length; i++) {
    const sig = new Uint8Array(tok.sig);
    sig[i]! ^= 0x01;
    assert.equal(s.verify("alice", { ...tok, sig }), false, `sig byte ${i}`);
  }
  assert.equal(s.verify("alice", { ...tok, sig: tok.sig.subarray(0, 15) }), false, "short sig");
  assert.equal(s.verify("alice", { ...tok, epoch: 70000 }), false, "epoch out of range");
  assert.equal(s.verify("a.b", tok), false, "unsafe user id");
});

test("cursor - a rotated key still verifies, a dropped key fails", () => {
  const old = cursorSigner([k1]).sign("alice", 1, 2, "l");
  const rotated = cursorSigner([k2, k1]);
  assert.equal(rotated.verify("alice", old), true, "old token under the rotated list");
  const fresh = rotated.sign("alice", 1, 2, "l");
  assert.equal(cursorSigner([k2]).verify("alice", fresh), true, "new tokens are signed with the first key");
  assert.equal(cursorSigner([k2]).verify("alice", old), false, "old key dropped");
});

test("cursor - an empty key list or a short key is refused by name", () => {
  assert.throws(() => cursorSigner([]), CursorKeyError);
  assert.throws(() => cursorSigner([new Uint8Array(16)]), (e: unknown) => e instanceof CursorKeyError && /at least 32/.test(e.message));
});
