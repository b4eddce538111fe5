/**
 * The SDK's position as a table: inputs (what arrives, in order with the entries) -> token, last
 * applied seq, split stages, and what the client must do (save the cursor, clear it). No socket,
 * no timers: the real-socket versions of these scenarios are in client.test.ts.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { composeSeq, seqEpoch, seqOffset, type CursorToken, type DeviceCursor, type OldRange } from "../../protocol/device.js";
import { CursorPosition, type PositionAction, type PositionInput } from "../../client/position.js";

const sig = new Uint8Array(16).fill(3);
const tok = (shard: number, epoch: number, log = "L"): CursorToken => ({ shard, epoch, log, sig });
const S = (offset: number, epoch: number) => composeSeq(epoch, offset);
// Each shard has its own epoch (a child starts at its parent's epoch + 1), so a token and a seq of
// different numberings show as different epochs.
const P = tok(1, 1);
const C1 = tok(2, 2);
const C2 = tok(3, 3);
const C3 = tok(4, 4);
const named: [string, CursorToken][] = [["P", P], ["C1", C1], ["C2", C2], ["C3", C3], ["P'", tok(1, 2)], ["C1'", tok(2, 2, "L2")], ["C1@5", tok(2, 5)]];
const T = (name: string) => named.find(([n]) => n === name)![1];
const nameOf = (t: CursorToken | undefined) => (t === undefined ? "-" : named.find(([, x]) => x.shard === t.shard && x.epoch === t.epoch && x.log === t.log)?.[0] ?? "?");
const seqText = (seq: bigint) => `${seqEpoch(seq)}:${seqOffset(seq)}`;

const auth = (cursor: CursorToken, from: bigint): PositionInput => ({ type: "auth_ok", cursor, from });
const range = (cursor: CursorToken, after: bigint, withCursor = true): OldRange => ({ shard: cursor.shard, after, until: after + 10n, ...(withCursor ? { cursor } : {}) });
const rebased = (cursor: CursorToken, to: bigint, oldRanges: OldRange[] = []): PositionInput => ({ type: "rebased", to, cursor, oldRanges });
const entries = (shard: number): PositionInput => ({ type: "entries", shard });
const synced: PositionInput = { type: "synced" };
const applied = (seq: bigint): PositionInput => ({ type: "applied", seq });
const lost: PositionInput = { type: "connection_lost" };

interface Want {
  /** token name and last applied seq as epoch:offset */
  at: string;
  actions?: string[];
  split?: { in?: string; ahead: string[]; to: string };
}
interface Case {
  name: string;
  stored?: DeviceCursor;
  steps: [PositionInput, Want][];
}

const actionText = (a: PositionAction) => (a.type === "clear" ? "clear" : `save ${nameOf(a.cursor)} ${seqText(a.cursor.seq)}`);

const cases: Case[] = [
  {
    name: "AUTH_OK without a split: its cursor and `from`, saved; each applied entry saved",
    steps: [
      [auth(P, S(0, 1)), { at: "P 1:0", actions: ["save P 1:0"] }],
      [applied(S(1, 1)), { at: "P 1:1", actions: ["save P 1:1"] }],
    ],
  },
  {
    name: "no token yet: applied moves the seq, nothing to save",
    steps: [[applied(S(3, 1)), { at: "- 1:3" }]],
  },
  {
    name: "a rebase without ranges (epoch change): the new cursor at once, never below the last applied",
    stored: { ...P, seq: S(9, 1) },
    steps: [
      [rebased(T("P'"), S(4, 1)), { at: "P' 1:9", actions: ["save P' 1:9"] }],
      [rebased(T("P'"), S(2, 2)), { at: "P' 2:2", actions: ["save P' 2:2"] }],
    ],
  },
  {
    name: "one hop (P -> C1): P's range when its entries begin, then C1 with AUTH_OK's token",
    stored: { ...P, seq: S(10, 1) },
    steps: [
      [rebased(C1, S(0, 2), [range(P, S(10, 1))]), { at: "P 1:10", actions: ["save P 1:10"], split: { ahead: ["P"], to: "C1" } }],
      [auth(T("C1'"), S(0, 2)), { at: "P 1:10", actions: ["save P 1:10"], split: { ahead: ["P"], to: "C1'" } }],
      [entries(1), { at: "P 1:10", actions: ["save P 1:10"], split: { in: "P", ahead: [], to: "C1'" } }],
      [applied(S(15, 1)), { at: "P 1:15", actions: ["save P 1:15"], split: { in: "P", ahead: [], to: "C1'" } }],
      [entries(1), { at: "P 1:15", split: { in: "P", ahead: [], to: "C1'" } }],
      [entries(2), { at: "C1' 2:0", actions: ["save C1' 2:0"] }],
    ],
  },
  {
    name: "two hops: each range in its own numbering, then the new shard, never straight to the last",
    stored: { ...P, seq: S(10, 1) },
    steps: [
      [rebased(C2, S(0, 3), [range(P, S(10, 1)), range(C1, S(0, 2))]), { at: "P 1:10", actions: ["save P 1:10"], split: { ahead: ["P", "C1"], to: "C2" } }],
      [entries(1), { at: "P 1:10", actions: ["save P 1:10"], split: { in: "P", ahead: ["C1"], to: "C2" } }],
      [applied(S(20, 1)), { at: "P 1:20", actions: ["save P 1:20"], split: { in: "P", ahead: ["C1"], to: "C2" } }],
      [entries(2), { at: "C1 2:0", actions: ["save C1 2:0"], split: { in: "C1", ahead: [], to: "C2" } }],
      [applied(S(5, 2)), { at: "C1 2:5", actions: ["save C1 2:5"], split: { in: "C1", ahead: [], to: "C2" } }],
      [entries(3), { at: "C2 3:0", actions: ["save C2 3:0"] }],
    ],
  },
  {
    name: "three hops: a range with no entries is passed over when a later one's entries begin",
    stored: { ...P, seq: S(3, 1) },
    steps: [
      [rebased(C3, S(0, 4), [range(P, S(3, 1)), range(C1, S(0, 2)), range(C2, S(0, 3))]), { at: "P 1:3", actions: ["save P 1:3"], split: { ahead: ["P", "C1", "C2"], to: "C3" } }],
      [entries(2), { at: "C1 2:0", actions: ["save C1 2:0"], split: { in: "C1", ahead: ["C2"], to: "C3" } }],
      [entries(4), { at: "C3 4:0", actions: ["save C3 4:0"] }],
    ],
  },
  {
    name: "the new shard with no entries: SYNCED enters it after the last range",
    stored: { ...P, seq: S(10, 1) },
    steps: [
      [rebased(C2, S(0, 3), [range(P, S(10, 1)), range(C1, S(0, 2))]), { at: "P 1:10", actions: ["save P 1:10"], split: { ahead: ["P", "C1"], to: "C2" } }],
      [entries(2), { at: "C1 2:0", actions: ["save C1 2:0"], split: { in: "C1", ahead: [], to: "C2" } }],
      [synced, { at: "C2 3:0", actions: ["save C2 3:0"] }],
    ],
  },
  {
    name: "SYNCED before any range's entries: everything was sent, on to the new shard",
    stored: { ...P, seq: S(10, 1) },
    steps: [
      [rebased(C1, S(0, 2), [range(P, S(10, 1))]), { at: "P 1:10", actions: ["save P 1:10"], split: { ahead: ["P"], to: "C1" } }],
      [synced, { at: "C1 2:0", actions: ["save C1 2:0"] }],
    ],
  },
  {
    name: "entries of a shard no stage ahead names (or of a range already passed) change nothing",
    stored: { ...P, seq: S(10, 1) },
    steps: [
      [rebased(C2, S(0, 3), [range(P, S(10, 1)), range(C1, S(0, 2))]), { at: "P 1:10", actions: ["save P 1:10"], split: { ahead: ["P", "C1"], to: "C2" } }],
      [entries(9), { at: "P 1:10", split: { ahead: ["P", "C1"], to: "C2" } }],
      [entries(2), { at: "C1 2:0", actions: ["save C1 2:0"], split: { in: "C1", ahead: [], to: "C2" } }],
      [entries(1), { at: "C1 2:0", split: { in: "C1", ahead: [], to: "C2" } }],
    ],
  },
  {
    name: "a range without its own token (an older gateway): the token the device had stays, with the range's seq",
    stored: { ...P, seq: S(10, 1) },
    steps: [
      [rebased(C1, S(0, 2), [range(P, S(12, 1), false)]), { at: "P 1:10", actions: ["save P 1:10"], split: { ahead: ["-"], to: "C1" } }],
      [entries(1), { at: "P 1:12", actions: ["save P 1:12"], split: { in: "-", ahead: [], to: "C1" } }],
      [entries(2), { at: "C1 2:0", actions: ["save C1 2:0"] }],
    ],
  },
  {
    name: "a second rebase before the new shard began, naming that shard first: one stage, the earlier token kept",
    steps: [
      [auth(P, S(1, 1)), { at: "P 1:1", actions: ["save P 1:1"] }],
      [rebased(C1, S(0, 2), [range(P, S(1, 1))]), { at: "P 1:1", actions: ["save P 1:1"], split: { ahead: ["P"], to: "C1" } }],
      [entries(1), { at: "P 1:1", actions: ["save P 1:1"], split: { in: "P", ahead: [], to: "C1" } }],
      [applied(S(2, 1)), { at: "P 1:2", actions: ["save P 1:2"], split: { in: "P", ahead: [], to: "C1" } }],
      [rebased(C2, S(0, 3), [range(C1, S(0, 2), false)]), { at: "P 1:2", actions: ["save P 1:2"], split: { in: "P", ahead: ["C1"], to: "C2" } }],
      [entries(2), { at: "C1 2:0", actions: ["save C1 2:0"], split: { in: "C1", ahead: [], to: "C2" } }],
      [applied(S(2, 2)), { at: "C1 2:2", actions: ["save C1 2:2"], split: { in: "C1", ahead: [], to: "C2" } }],
      [entries(3), { at: "C2 3:0", actions: ["save C2 3:0"] }],
    ],
  },
  {
    name: "a second rebase naming the new shard first: its later `after` and its token win",
    steps: [
      [auth(P, S(1, 1)), { at: "P 1:1", actions: ["save P 1:1"] }],
      [rebased(C1, S(0, 2), [range(P, S(1, 1))]), { at: "P 1:1", actions: ["save P 1:1"], split: { ahead: ["P"], to: "C1" } }],
      [rebased(C2, S(0, 3), [range(T("C1'"), S(1, 2))]), { at: "P 1:1", actions: ["save P 1:1"], split: { ahead: ["P", "C1'"], to: "C2" } }],
      [entries(2), { at: "C1' 2:1", actions: ["save C1' 2:1"], split: { in: "C1'", ahead: [], to: "C2" } }],
    ],
  },
  {
    name: "a second rebase whose first range is another shard: all its stages follow the ones ahead",
    stored: { ...P, seq: S(10, 1) },
    steps: [
      [rebased(C1, S(0, 2), [range(P, S(10, 1))]), { at: "P 1:10", actions: ["save P 1:10"], split: { ahead: ["P"], to: "C1" } }],
      [rebased(C3, S(0, 4), [range(C2, S(0, 3))]), { at: "P 1:10", actions: ["save P 1:10"], split: { ahead: ["P", "C1", "C2"], to: "C3" } }],
      [entries(3), { at: "C2 3:0", actions: ["save C2 3:0"], split: { in: "C2", ahead: [], to: "C3" } }],
    ],
  },
  {
    name: "a second rebase without ranges for the same new shard (its epoch changed): the new shard moves, no stage added",
    stored: { ...P, seq: S(10, 1) },
    steps: [
      [rebased(C1, S(0, 2), [range(P, S(10, 1))]), { at: "P 1:10", actions: ["save P 1:10"], split: { ahead: ["P"], to: "C1" } }],
      [rebased(T("C1@5"), S(0, 5)), { at: "P 1:10", actions: ["save P 1:10"], split: { ahead: ["P"], to: "C1@5" } }],
      [entries(2), { at: "C1@5 5:0", actions: ["save C1@5 5:0"] }],
    ],
  },
  {
    name: "the connection lost inside a range: the split ends where it was; the cursor stays in that range's numbering",
    stored: { ...P, seq: S(10, 1) },
    steps: [
      [rebased(C2, S(0, 3), [range(P, S(10, 1)), range(C1, S(0, 2))]), { at: "P 1:10", actions: ["save P 1:10"], split: { ahead: ["P", "C1"], to: "C2" } }],
      [entries(2), { at: "C1 2:0", actions: ["save C1 2:0"], split: { in: "C1", ahead: [], to: "C2" } }],
      [applied(S(2, 2)), { at: "C1 2:2", actions: ["save C1 2:2"], split: { in: "C1", ahead: [], to: "C2" } }],
      [lost, { at: "C1 2:2" }],
      [entries(3), { at: "C1 2:2" }],
      [synced, { at: "C1 2:2" }],
    ],
  },
  {
    name: "CURSOR_EXPIRED: the new token and seq 0, nothing saved until AUTH_OK's head",
    stored: { ...P, seq: S(5, 1) },
    steps: [
      [{ type: "expired", cursor: P }, { at: "P 0:0" }],
      [auth(P, S(60, 1)), { at: "P 1:60", actions: ["save P 1:60"] }],
    ],
  },
  {
    name: "CURSOR_INVALID: the store is cleared and the device starts fresh",
    stored: { ...P, seq: S(9, 1) },
    steps: [
      [{ type: "invalid", cursor: P }, { at: "P 0:0", actions: ["clear"] }],
      [{ type: "invalid", cursor: undefined }, { at: "- 0:0", actions: ["clear"] }],
      [applied(S(1, 1)), { at: "- 1:1" }],
    ],
  },
  {
    name: "entries and SYNCED outside a split change nothing",
    steps: [
      [auth(P, S(3, 1)), { at: "P 1:3", actions: ["save P 1:3"] }],
      [entries(7), { at: "P 1:3" }],
      [synced, { at: "P 1:3" }],
    ],
  },
];

for (const c of cases) {
  test(`client position - ${c.name}`, () => {
    const p = new CursorPosition();
    if (c.stored) assert.deepEqual(p.apply({ type: "stored", cursor: c.stored }), [], "loading saves nothing");
    c.steps.forEach(([input, want], i) => {
      const actions = p.apply(input).map(actionText);
      const split = p.split && { ...(p.split.current ? { in: nameOf(p.split.current.cursor) } : {}), ahead: p.split.ahead.map((s) => nameOf(s.cursor)), to: nameOf(p.split.target.cursor) };
      const got: Want = { at: `${nameOf(p.token)} ${seqText(p.seq)}`, ...(actions.length > 0 ? { actions } : {}), ...(split ? { split } : {}) };
      assert.deepEqual(got, want, `step ${i + 1}: ${input.type}`);
    });
  });
}

test("client position - the AUTH cursor is the token with the last applied seq, and none without a token", () => {
  const p = new CursorPosition();
  assert.equal(p.cursor, undefined);
  p.apply(applied(S(4, 1)));
  assert.equal(p.cursor, undefined);
  p.apply({ type: "stored", cursor: { ...C1, seq: S(7, 2) } });
  assert.deepEqual(p.cursor, { ...C1, seq: S(7, 2) });
});
