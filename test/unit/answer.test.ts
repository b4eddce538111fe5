import { test } from "node:test";
import assert from "node:assert/strict";
import { ErrorCode, EMPTY_REGISTRY, applyRecord, composeSeq, initialShards, type RegistryState } from "../../protocol/index.js";
import { cursorSigner } from "../../protocol/io/index.js";
import type { AuthDecision } from "../../gateway/mailbox/auth-decision.js";
import { planAnswer, type AnswerFor } from "../../gateway/session/answer.js";

const signer = cursorSigner([new Uint8Array(32).fill(3)]);
const sign = (s: number, e: number, l: string) => signer.sign("alice", s, e, l);
const reg: RegistryState = applyRecord(EMPTY_REGISTRY, 1, { v: 1, op: "init", at: 0, by: "t", shards: initialShards(3, ["l0", "l1", "l2"]) });
const auth = (hadCursor = true): AnswerFor => ({ kind: "auth", session: "s", user: "alice", head: composeSeq(0, 9), trim: 0n, lanes: new Map([["a", composeSeq(0, 9)]]), hb: 1000, hadCursor });
const base = { shard: 2, epoch: 0, log: "l2" };

test("answer - each case's frames on AUTH: the ERROR (if any) first, then AUTH_OK with the same token and from", () => {
  const cases: [AuthDecision, string | undefined][] = [
    [{ case: "fresh", ...base, from: 0n }, undefined],
    [{ case: "normal", ...base, from: composeSeq(0, 3) }, undefined],
    [{ case: "rebased", ...base, from: composeSeq(0, 3) }, ErrorCode.CURSOR_REBASED],
    [{ case: "rebased_new_log", ...base, from: composeSeq(0, 0) }, ErrorCode.CURSOR_REBASED],
    [{ case: "split", ...base, from: composeSeq(0, 0), oldRanges: [] }, ErrorCode.CURSOR_REBASED],
    [{ case: "expired", ...base, from: composeSeq(0, 9), trim: composeSeq(0, 4), reason: "r" }, ErrorCode.CURSOR_EXPIRED],
    [{ case: "invalid", ...base, from: 0n, check: "beyond_head", reason: "r" }, ErrorCode.CURSOR_INVALID],
  ];
  for (const [d, code] of cases) {
    const a = planAnswer(d, reg, sign, auth());
    assert.deepEqual(a.frames.map((f) => f.t), code === undefined ? ["AUTH_OK"] : ["ERROR", "AUTH_OK"], d.case);
    const ok = a.frames.at(-1)!;
    assert.ok(ok.t === "AUTH_OK");
    assert.deepEqual([ok.from, ok.cursor, ok.shard], [d.from, a.token, 2]);
    if (code !== undefined) {
      const e = a.frames[0]!;
      assert.ok(e.t === "ERROR");
      assert.deepEqual([e.code, e.fatal, e.new_cursor], [code, false, a.token]);
      if (code === ErrorCode.CURSOR_REBASED) assert.equal(e.replay_from_seq, d.from);
    }
  }
  // an invalid decision without a cursor from the device (nothing to call invalid): AUTH_OK alone
  assert.deepEqual(planAnswer({ case: "invalid", ...base, from: 0n, check: "unknown_shard", reason: "r" }, reg, sign, auth(false)).frames.map((f) => f.t), ["AUTH_OK"]);
});

test("answer - a split's old ranges, each with its shard's token, and the first as old_range", () => {
  const d: AuthDecision = { case: "split", ...base, from: composeSeq(0, 0), oldRanges: [
    { shard: 0, after: composeSeq(0, 3), until: composeSeq(0, 7) },
    { shard: 1, after: composeSeq(0, 0), until: composeSeq(0, 5) },
  ] };
  const a = planAnswer(d, reg, sign, { kind: "rebase" });
  assert.deepEqual(a.ranges, d.oldRanges);
  const e = a.frames[0]!;
  assert.ok(e.t === "ERROR");
  assert.deepEqual(e.old_ranges!.map((r) => [r.shard, r.cursor!.shard, signer.verify("alice", r.cursor!)]), [[0, 0, true], [1, 1, true]]);
  assert.deepEqual(e.old_range, e.old_ranges![0]);
  assert.equal(a.frames.length, 1, "mid-session: no AUTH_OK");
});

test("answer - mid-session, a normal decision still gives the device its new token", () => {
  const a = planAnswer({ case: "normal", ...base, from: composeSeq(0, 3) }, reg, sign, { kind: "rebase" });
  assert.deepEqual(a.frames.map((f) => (f.t === "ERROR" ? f.code : f.t)), [ErrorCode.CURSOR_REBASED]);
});
