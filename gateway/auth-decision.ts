/**
 * The AUTH cursor decision (ADR-0004 section 4, DESIGN section 6) as a pure function.
 *
 * Given the device's cursor `{shard, epoch, log, seq}` (its signature already checked), the
 * registry, the trim watermark of each shard involved and the user's head, it says where the
 * session starts: `from` is the device's last-applied seq as the server takes it in the numbering of
 * the user's current shard, and the device is sent every entry with a greater seq. `from` is never
 * below the cursor's seq when the cursor stays on the same shard, so nothing goes backwards.
 */
import {
  composeSeq,
  deriveSeq,
  seqEpoch,
  seqOffset,
  userHash,
  type MailboxSeq,
  type OldRange,
  type RegistryState,
  type ShardState,
} from "../protocol/index.js";

export interface CursorIn {
  shard: number;
  epoch: number;
  log: string;
  seq: MailboxSeq;
  /** Whether the server's signature over (user, shard, epoch, log) verified. */
  sigValid: boolean;
}

export interface AuthInput {
  user: string;
  cursor: CursorIn | undefined;
  registry: RegistryState;
  /** The shard that owns the user now. */
  userShard: number;
  /** Trim watermark (seq of the newest entry removed by retention, 0 if none) of each shard involved. */
  trims: ReadonlyMap<number, MailboxSeq>;
  /** The user's highest seq in the current shard (0 if none). */
  head: MailboxSeq;
}

export type AuthCase = "fresh" | "normal" | "rebased" | "rebased_new_log" | "split" | "expired" | "invalid";

export interface AuthDecision {
  case: AuthCase;
  /** The shard, epoch and log of the cursor the device gets now. */
  shard: number;
  epoch: number;
  log: string;
  /** Send every entry of `shard` with a greater seq. */
  from: MailboxSeq;
  /** For `rebased` and `split`: the device's new last-applied value (`replay_from_seq`). */
  replayFrom?: MailboxSeq;
  /** For `split`: ranges of old shards to stream first, in order. */
  oldRanges?: OldRange[];
  /** For `expired`: the trim watermark that passed the cursor. */
  trim?: MailboxSeq;
  /** Why, for logs and `invalid`/`expired` messages. */
  reason?: string;
}

function current(shard: ShardState): { epoch: number; log: string } {
  return { epoch: shard.epoch, log: shard.log };
}

/** Seq just before the first entry of the shard's current log. */
function logStart(shard: ShardState): MailboxSeq {
  const first = shard.boundaries.find((b) => b.log === shard.log)!;
  return composeSeq(first.epoch, Math.max(0, first.start_offset - 1));
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

function expired(shard: ShardState, trim: MailboxSeq, head: MailboxSeq, reason: string): AuthDecision {
  return { case: "expired", ...current(shard), shard: shard.shard, from: head > trim ? head : trim, trim, reason };
}

export function decideAuth(input: AuthInput): AuthDecision {
  const { registry, userShard } = input;
  let cursor = input.cursor;
  const shard = registry.shards.get(userShard);
  if (shard === undefined) throw new Error(`user shard ${userShard} is not in the registry`);
  const trimOf = (s: number) => input.trims.get(s) ?? 0n;
  const base = { ...current(shard), shard: shard.shard };
  const fresh = (c: AuthCase, reason?: string): AuthDecision => ({ case: c, ...base, from: 0n, ...(reason ? { reason } : {}) });

  if (cursor === undefined) return fresh("fresh");
  if (!cursor.sigValid) return fresh("invalid", "cursor signature does not verify");
  let cursorShard = registry.shards.get(cursor.shard);
  if (cursorShard === undefined) return fresh("invalid", `cursor names shard ${cursor.shard}, unknown to the registry`);
  // A device may hold entries of a newer epoch than its token (pushed before the mid-session
  // CURSOR_REBASED with the new token reached it). The seq is the device's own report, the token is
  // signed: accept the seq's epoch when the registry knows it on the token's log.
  const seqEp = seqEpoch(cursor.seq);
  if (seqEp > cursor.epoch) {
    const b = cursorShard.boundaries.find((x) => x.epoch === seqEp);
    if (b === undefined || b.log !== cursor.log) return fresh("invalid", "cursor seq is from an epoch its log never had");
    cursor = { ...cursor, epoch: seqEp };
  }

  // A split child's token with a seq still in the parent's numbering (an SDK that took the child's
  // token before the old range was done, then was cut off): the seq is the parent's, and so is the
  // cursor; read in the child's log, its offset would skip the child's first entries.
  for (let hops = 0; cursor.seq > 0n && seqEpoch(cursor.seq) < cursorShard.boundaries[0]!.epoch && hops < 64; hops++) {
    const parentCursor = inParent(registry, cursorShard, cursor);
    if (parentCursor === undefined) break;
    [cursorShard, cursor] = parentCursor;
  }

  // 3) the user moved to another shard by one or more splits
  if (cursor.shard !== userShard) return decideSplit(input, cursorShard, shard, cursor);

  // the registry has not seen the cursor's epoch: a failover to a copy that lagged
  if (cursor.epoch > shard.epoch) {
    return expired(shard, trimOf(shard.shard), input.head, `cursor epoch ${cursor.epoch} is ahead of the registry's ${shard.epoch}`);
  }
  const { at, sameLog } = positionIn(shard, cursor.epoch, cursor.log, cursor.seq);
  if (!sameLog && cursor.seq > logStart(shard)) {
    // An unknown (epoch, log) whose seq is inside the current log's numbering: no replay of the
    // current log can start at or above it without skipping entries. Only a rebuild is safe.
    return expired(shard, trimOf(shard.shard), input.head, "cursor's log is unknown and its seq overlaps the current log");
  }
  // 1) retention removed entries the device has not seen
  const trim = trimOf(shard.shard);
  if (at < trim) return expired(shard, trim, input.head, "entries after the cursor were removed by retention");
  // 4) same epoch, same log
  if (cursor.epoch === shard.epoch && cursor.log === shard.log) return { case: "normal", ...base, from: cursor.seq };
  // 2) an older epoch (or an unknown log): rebase
  return { case: sameLog ? "rebased" : "rebased_new_log", ...base, from: at, replayFrom: at };
}

/** The cursor read in the numbering of the shard `child` was split from; undefined if it was not. */
function inParent(registry: RegistryState, child: ShardState, cursor: CursorIn): [ShardState, CursorIn] | undefined {
  const split = child.splits.find((s) => s.child === child.shard);
  const parent = split === undefined ? undefined : registry.shards.get(split.parent);
  if (parent === undefined) return undefined;
  const ep = seqEpoch(cursor.seq);
  const b = parent.boundaries.filter((x) => x.epoch <= ep).at(-1);
  if (b === undefined) return undefined;
  return [parent, { ...cursor, shard: parent.shard, epoch: b.epoch, log: b.log }];
}

function decideSplit(input: AuthInput, cursorShard: ShardState, target: ShardState, cursor: CursorIn): AuthDecision {
  const h = userHash(input.user);
  const oldRanges: OldRange[] = [];
  let from = cursorShard;
  let { at } = positionIn(cursorShard, cursor.epoch, cursor.log, cursor.seq);
  const trim = input.trims.get(cursorShard.shard) ?? 0n;
  if (at < trim) return expired(target, input.trims.get(target.shard) ?? 0n, input.head, "entries of the old shard after the cursor were removed by retention");
  for (let hops = 0; from.shard !== target.shard; hops++) {
    const split = from.splits.find((s) => s.parent === from.shard && h >= s.range.lo && h <= s.range.hi);
    const child = split === undefined ? undefined : input.registry.shards.get(split.child);
    if (split === undefined || child === undefined || hops > 64) {
      return {
        case: "invalid",
        ...current(target),
        shard: target.shard,
        from: 0n,
        reason: `no split leads from shard ${cursorShard.shard} to shard ${target.shard} for this user`,
      };
    }
    if (at < split.split_at_seq) oldRanges.push({ shard: from.shard, after: at, until: split.split_at_seq });
    at = split.child_start_seq - 1n;
    from = child;
  }
  return { case: "split", ...current(target), shard: target.shard, from: at, replayFrom: at, oldRanges };
}
