/**
 * The AUTH cursor decision (docs/design.md, "Cursor cases") as a pure function.
 *
 * Given the device's cursor `{shard, epoch, log, seq}` (its signature already checked), the
 * registry, the bounds (trim watermark, last offset) of every shard involved and the user's head,
 * it says where the session starts: `from` is the device's last-applied seq as the server takes it
 * in the numbering of the user's current shard, and the device is sent every entry with a greater
 * seq. `from` is never below the cursor's seq when the cursor stays on the same shard, so nothing
 * goes backwards. docs/gateway.md has the table of cases.
 */
import { deriveSeq, seqEpoch, seqOffset, type MailboxSeq, type RegistryState, type ShardState } from "../../protocol/index.js";
import { checkPosition, logStart, numberingShard, parentOf, splitRoute, type PositionProblem } from "./positions.js";

export interface CursorIn {
  shard: number;
  epoch: number;
  log: string;
  seq: MailboxSeq;
  /** Whether the server's signature over (user, shard, epoch, log) verified. */
  sigValid: boolean;
}

/** What the gateway knows of one shard's stream when it decides. */
export interface ShardBounds {
  /** Seq of the newest entry retention removed (0 if none), in today's numbering. */
  trim: MailboxSeq;
  /** The stream's last offset (0 when empty): no seq of the current log lies beyond it. */
  lastOffset: number;
}

export interface AuthInput {
  user: string;
  cursor: CursorIn | undefined;
  registry: RegistryState;
  /** The shard that owns the user now. */
  userShard: number;
  /** Bounds of every shard `shardsInvolved` names (a missing one is a programming error: it throws). */
  bounds: ReadonlyMap<number, ShardBounds>;
  /** The user's highest seq in the current shard (0 if none). */
  head: MailboxSeq;
}

/** Where the session goes on: the shard, epoch and log of the device's new token, and the seq catch-up starts after. */
interface Start {
  shard: number;
  epoch: number;
  log: string;
  /** Send every entry of `shard` with a greater seq (for rebases and splits: `replay_from_seq`). */
  from: MailboxSeq;
}

export interface OldRange {
  shard: number;
  after: MailboxSeq;
  until: MailboxSeq;
}

export type InvalidCheck = "signature" | "unknown_shard" | "no_route" | PositionProblem;

export type AuthDecision =
  | (Start & { case: "fresh" })
  | (Start & { case: "normal" })
  /** An older epoch of the same log: the cursor's offset in today's numbering. */
  | (Start & { case: "rebased" })
  /** A rebuilt or failed-over log: the whole current log is replayed. */
  | (Start & { case: "rebased_new_log" })
  /** Moved by one or more splits: `oldRanges` (one per hop, in order) first, then `shard` after `from`. */
  | (Start & { case: "split"; oldRanges: OldRange[] })
  /** Retention passed the cursor (or no replay can be safe): continue from the head after a rebuild. */
  | (Start & { case: "expired"; trim: MailboxSeq; reason: string })
  /** A cursor the server never issued or never could have: a fresh start from 0. */
  | (Start & { case: "invalid"; check: InvalidCheck; reason: string });

export type AuthCase = AuthDecision["case"];

function current(shard: ShardState): Omit<Start, "from"> {
  return { shard: shard.shard, epoch: shard.epoch, log: shard.log };
}

/**
 * Where a cursor of epoch `epoch`, log `log`, seq `seq` stands in the shard's current numbering.
 * Same log: the cursor's offset translated (nothing skipped, nothing repeated). Another or unknown
 * log: just before the current log (the whole log is replayed; devices dedup by message_id).
 */
export function positionIn(shard: ShardState, epoch: number, log: string, seq: MailboxSeq): { at: MailboxSeq; sameLog: boolean } {
  const known = shard.boundaries.find((b) => b.epoch === epoch);
  if (known !== undefined && known.log === log && log === shard.log) {
    const translated = deriveSeq(shard, log, Number(seqOffset(seq)));
    const at = translated !== undefined && translated > seq ? translated : seq;
    return { at, sameLog: true };
  }
  const start = logStart(shard);
  return { at: start > seq ? start : seq, sameLog: false };
}

/**
 * The user's head, at most the newest seq of the shard's stream. A watermark beyond it can only be
 * a stale cache (a Redis that outlived the log it described: a new deployment beside an old Redis),
 * never a place to continue from: the session would stand beyond every entry of the log, and its
 * next rebase would be refused. A bound read a moment ago may be below a head that is real: that
 * costs a few entries sent again (devices dedup by message_id), never one skipped.
 */
function headWithin(head: MailboxSeq, shard: ShardState, lastOffset: number): MailboxSeq {
  const newest = lastOffset === 0 ? 0n : (deriveSeq(shard, shard.log, lastOffset) ?? head);
  return head > newest ? newest : head;
}

export function decideAuth(input: AuthInput): AuthDecision {
  const { registry, userShard } = input;
  const shard = registry.shards.get(userShard);
  if (shard === undefined) throw new Error(`user shard ${userShard} is not in the registry`);
  const bounds = (s: number): ShardBounds => {
    const b = input.bounds.get(s);
    if (b === undefined) throw new Error(`no bounds for shard ${s}: gather them with shardsInvolved`);
    return b;
  };
  const here = current(shard);
  const head = headWithin(input.head, shard, bounds(shard.shard).lastOffset);
  const expired = (trim: MailboxSeq, reason: string): AuthDecision => ({ case: "expired", ...here, from: head > trim ? head : trim, trim, reason });
  const invalid = (check: InvalidCheck, reason: string): AuthDecision => ({ case: "invalid", ...here, from: 0n, check, reason });

  let cursor = input.cursor;
  if (cursor === undefined) return { case: "fresh", ...here, from: 0n };
  if (!cursor.sigValid) return invalid("signature", "cursor signature does not verify");
  let cursorShard = registry.shards.get(cursor.shard);
  if (cursorShard === undefined) return invalid("unknown_shard", `cursor names shard ${cursor.shard}, unknown to the registry`);

  // A split child's token with a seq still in the parent's numbering (an SDK that took the child's
  // token before the old range was done, then was cut off): the seq is the parent's, and so is the
  // cursor; read in the child's log, its offset would skip the child's first entries.
  const numbering = numberingShard(registry, cursorShard, cursor.seq);
  if (numbering !== cursorShard) {
    const b = numbering.boundaries.filter((x) => x.epoch <= seqEpoch(cursor!.seq)).at(-1);
    if (b === undefined) return invalid("mixed_coordinates", `the cursor's seq is older than shard ${numbering.shard}, the first of its lineage`);
    cursorShard = numbering;
    cursor = { ...cursor, shard: numbering.shard, epoch: b.epoch, log: b.log };
  }

  // 0) a position the server never produced, or whose seq and (epoch, log) disagree
  const token = cursor;
  if (cursorShard.boundaries.some((b) => b.epoch === token.epoch && b.log === token.log)) {
    const p = checkPosition(cursorShard, cursor.epoch, cursor.log, cursor.seq, bounds(cursorShard.shard).lastOffset);
    if ("problem" in p) return invalid(p.problem, p.why);
    cursor = { ...cursor, epoch: p.epoch };
  } else if (seqEpoch(cursor.seq) > cursor.epoch) {
    return invalid("mixed_coordinates", "the cursor's seq is of a newer epoch than its token, on a (epoch, log) the registry never had");
  }

  // 3) the user moved to another shard by one or more splits
  if (cursorShard.shard !== userShard) return decideSplit(input, cursorShard, shard, cursor, bounds);

  // the registry has not seen the cursor's epoch: a failover to a copy that lagged
  if (cursor.epoch > shard.epoch) return expired(bounds(shard.shard).trim, `cursor epoch ${cursor.epoch} is ahead of the registry's ${shard.epoch}`);
  const { at, sameLog } = positionIn(shard, cursor.epoch, cursor.log, cursor.seq);
  if (!sameLog && cursor.seq > logStart(shard)) {
    // An unknown (epoch, log) whose seq is inside the current log's numbering: no replay of the
    // current log can start at or above it without skipping entries. Only a rebuild is safe.
    return expired(bounds(shard.shard).trim, "cursor's log is unknown and its seq overlaps the current log");
  }
  // 1) retention removed entries the device has not seen
  const trim = bounds(shard.shard).trim;
  if (at < trim) return expired(trim, "entries after the cursor were removed by retention");
  // 4) same epoch, same log
  if (cursor.epoch === shard.epoch && cursor.log === shard.log) return { case: "normal", ...here, from: cursor.seq };
  // 2) an older epoch (or an unknown log): rebase
  return { case: sameLog ? "rebased" : "rebased_new_log", ...here, from: at };
}

function decideSplit(
  input: AuthInput,
  cursorShard: ShardState,
  target: ShardState,
  cursor: CursorIn,
  bounds: (s: number) => ShardBounds,
): AuthDecision {
  const here = current(target);
  const { at } = positionIn(cursorShard, cursor.epoch, cursor.log, cursor.seq);
  const route = splitRoute(input.registry, input.user, cursorShard, target.shard, at);
  if (route === undefined) {
    const why = parentOf(input.registry, target) === undefined ? "" : " (its shard was split, but not from the cursor's)";
    return { case: "invalid", ...here, from: 0n, check: "no_route", reason: `no split leads from shard ${cursorShard.shard} to shard ${target.shard} for this user${why}` };
  }
  const head = headWithin(input.head, target, bounds(target.shard).lastOffset);
  const expired = (trim: MailboxSeq, where: number): AuthDecision => ({
    case: "expired", ...here, from: head > trim ? head : trim, trim,
    reason: `entries of shard ${where} after the cursor were removed by retention`,
  });
  // each hop's retention: the device must still be able to get all of every range
  const firstTrim = bounds(cursorShard.shard).trim;
  if (at < firstTrim) return expired(bounds(target.shard).trim, cursorShard.shard);
  for (const r of route.old) if (r.after < bounds(r.shard).trim) return expired(bounds(target.shard).trim, r.shard);
  const targetTrim = bounds(target.shard).trim;
  if (route.at < targetTrim) return expired(targetTrim, target.shard);
  return { case: "split", ...here, from: route.at, oldRanges: route.old };
}
