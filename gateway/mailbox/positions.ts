/**
 * Where a seq stands in a shard's logs, and the routes a moved user's entries take through splits.
 * Pure functions over registry data: the AUTH decision, PULL and the stream reader share them, so
 * "after seq S" means the same thing everywhere: every entry whose whole seq is above S.
 */
import { composeSeq, seqEpoch, seqOffset, userHash, type EpochBoundary, type MailboxSeq, type RegistryState, type ShardState } from "../../protocol/index.js";

/** Most split hops followed; a registry with a longer chain (or a loop) is refused. */
export const MAX_HOPS = 64;

/** The last offset epoch `i`'s log holds, when the registry recorded it (a rebuild records where the old log ended). */
function recordedLogEnd(shard: ShardState, i: number): number | undefined {
  const b = shard.boundaries[i]!;
  const next = shard.boundaries.slice(i + 1).find((x) => x.log !== b.log);
  if (next === undefined || next.cause !== "rebuild" || next.prev_end_seq === 0n) return undefined;
  const lastOfLog = shard.boundaries.filter((x) => x.log === b.log).at(-1)!;
  // prev_end_seq is numbered by the old log's last epoch; anything else is not a record of its end
  return seqEpoch(next.prev_end_seq) === lastOfLog.epoch ? Number(seqOffset(next.prev_end_seq)) : undefined;
}

/**
 * The last offset of the log epoch `boundary` numbers: the stream's last offset for the current log,
 * the recorded end for a rebuilt one, undefined when nobody recorded it (a failover's lost primary).
 */
export function logEnd(shard: ShardState, boundary: EpochBoundary, currentLastOffset: number): number | undefined {
  if (boundary.log === shard.log) return currentLastOffset;
  return recordedLogEnd(shard, shard.boundaries.indexOf(boundary));
}

export type PositionProblem = "mixed_coordinates" | "beyond_head";

/**
 * Checks that `seq` is a position the server can have given a device holding a token of
 * (`epoch`, `log`) on this shard (the token's boundary is known to be on `log`):
 * - 0 is always a position (nothing applied);
 * - the seq's epoch must be one of this log's, and its offset at or after that epoch's start - 1
 *   (start - 1 is where a rebase or a split places a device before an epoch's first entry);
 * - a seq of an OLDER epoch than the token must lie before the token's epoch began (a device
 *   rebased to a point before the bump keeps the older numbering there, and only there);
 * - a seq of a NEWER epoch than the token is the device's (pushed before its new token arrived) and
 *   is read in that epoch;
 * - the offset must not pass the end of the log (the stream's last offset for the current log).
 * Returns the epoch the position is read in, or why it is refused.
 */
export function checkPosition(
  shard: ShardState,
  epoch: number,
  log: string,
  seq: MailboxSeq,
  currentLastOffset: number,
): { epoch: number } | { problem: PositionProblem; why: string } {
  if (seq === 0n) return { epoch };
  const es = seqEpoch(seq);
  const o = Number(seqOffset(seq));
  const bs = shard.boundaries.find((b) => b.epoch === es);
  if (bs === undefined || bs.log !== log) {
    return { problem: "mixed_coordinates", why: `the cursor's seq is of epoch ${es}, which its log ${log} never had` };
  }
  if (o < bs.start_offset - 1) {
    return { problem: "mixed_coordinates", why: `the cursor's seq offset ${o} is before epoch ${es} began (offset ${bs.start_offset})` };
  }
  if (es < epoch) {
    const bt = shard.boundaries.find((b) => b.epoch === epoch)!;
    if (o >= bt.start_offset) {
      return { problem: "mixed_coordinates", why: `the cursor's seq is numbered by epoch ${es} at offset ${o}, which its token's epoch ${epoch} numbers` };
    }
  }
  const end = logEnd(shard, bs, currentLastOffset);
  if (end !== undefined && o > end) {
    return { problem: "beyond_head", why: `the cursor's seq offset ${o} is beyond the last offset ${end} of its log: the server never produced it` };
  }
  return { epoch: Math.max(epoch, es) };
}

/**
 * The first offset of the shard's current log whose seq is above `after` (whole seqs: epoch bits
 * first). An `after` from before the current log (an older log, a split's parent) starts at the
 * log's first offset. Every reader computes its start this way; reading from `after`'s offset bits
 * skips entries when `after` is numbered by another log or shard.
 */
export function firstOffsetAbove(shard: ShardState, after: MailboxSeq): number {
  const bounds = shard.boundaries.filter((b) => b.log === shard.log);
  const ea = seqEpoch(after);
  for (let i = 0; i < bounds.length; i++) {
    const b = bounds[i]!;
    const end = i + 1 < bounds.length ? bounds[i + 1]!.start_offset - 1 : Number.MAX_SAFE_INTEGER;
    if (b.epoch > ea) {
      if (b.start_offset <= end) return b.start_offset;
      continue;
    }
    if (b.epoch === ea) {
      const o = Number(seqOffset(after)) + 1;
      const start = Math.max(b.start_offset, o);
      if (start <= end) return start;
    }
  }
  // every numbered offset is at or below `after`: the next one appended
  return Math.max(Number(seqOffset(after)) + 1, bounds.at(-1)!.start_offset);
}

/** The shard `child` was split from, and the split record; undefined for a shard that was never a child. */
export function parentOf(registry: RegistryState, child: ShardState): { parent: ShardState; split: ShardState["splits"][number] } | undefined {
  const split = child.splits.find((s) => s.child === child.shard);
  const parent = split === undefined ? undefined : registry.shards.get(split.parent);
  return parent === undefined || split === undefined ? undefined : { parent, split };
}

/** The shard whose numbering `seq` is in, walking from `shard` up its parents (a seq older than a child is its parent's). */
export function numberingShard(registry: RegistryState, shard: ShardState, seq: MailboxSeq): ShardState {
  let s = shard;
  for (let hops = 0; seq > 0n && seqEpoch(seq) < s.boundaries[0]!.epoch && hops < MAX_HOPS; hops++) {
    const p = parentOf(registry, s);
    if (p === undefined) break;
    s = p.parent;
  }
  return s;
}

export interface Range {
  shard: number;
  /** Entries with seq above this ... */
  after: MailboxSeq;
  /** ... and at or below this (undefined: to the end). */
  until?: MailboxSeq;
}

/**
 * The ranges a user's entries after `at` (numbered by shard `from`) take to shard `to`: the rest of
 * each old shard up to its split's cut, then `to` after the last child's start. Hops whose range
 * is empty are left out. Undefined when no chain of splits leads from `from` to `to` for this user.
 */
export function splitRoute(registry: RegistryState, user: string, from: ShardState, to: number, at: MailboxSeq): { old: Required<Range>[]; at: MailboxSeq } | undefined {
  const h = userHash(user);
  const old: Required<Range>[] = [];
  let s = from;
  for (let hops = 0; s.shard !== to; hops++) {
    const split = s.splits.find((x) => x.parent === s.shard && h >= x.range.lo && h <= x.range.hi);
    const child = split === undefined ? undefined : registry.shards.get(split.child);
    if (split === undefined || child === undefined || hops >= MAX_HOPS) return undefined;
    if (at < split.split_at_seq) old.push({ shard: s.shard, after: at, until: split.split_at_seq });
    at = split.child_start_seq - 1n;
    s = child;
  }
  return { old, at };
}

/**
 * Every shard a decision about this user's cursor may read: the cursor's shard, its ancestors, the
 * split chain from each of them to the user's shard, and the user's shard. The gateway reads the
 * bounds (trim, last offset) of exactly these before deciding.
 */
export function shardsInvolved(registry: RegistryState, user: string, cursorShard: number | undefined, userShard: number): number[] {
  const out = new Set<number>([userShard]);
  const start = cursorShard === undefined ? undefined : registry.shards.get(cursorShard);
  if (start === undefined) return [...out];
  const lineage: ShardState[] = [start];
  for (let s = parentOf(registry, start); s !== undefined && lineage.length <= MAX_HOPS; s = parentOf(registry, s.parent)) lineage.push(s.parent);
  const h = userHash(user);
  for (const first of lineage) {
    out.add(first.shard);
    let s: ShardState | undefined = first;
    for (let hops = 0; s !== undefined && s.shard !== userShard && hops < MAX_HOPS; hops++) {
      const cur: ShardState = s;
      const split = cur.splits.find((x) => x.parent === cur.shard && h >= x.range.lo && h <= x.range.hi);
      s = split === undefined ? undefined : registry.shards.get(split.child);
      if (s !== undefined) out.add(s.shard);
    }
  }
  return [...out];
}

/**
 * The ranges a PULL `after` reads on a session of `shard`: `after` may be numbered by an ancestor
 * (a moved user's device asking for what follows the last entry it had from the parent), in which
 * case the rest of each old shard comes first. Undefined when `after` belongs to no route to `shard`.
 */
export function pullRanges(registry: RegistryState, user: string, shard: number, after: MailboxSeq): Range[] | undefined {
  const s = registry.shards.get(shard);
  if (s === undefined) return undefined;
  const from = numberingShard(registry, s, after);
  if (from.shard === shard) return [{ shard, after }];
  const route = splitRoute(registry, user, from, shard, after);
  if (route === undefined) return undefined;
  return [...route.old, { shard, after: route.at > after ? route.at : after }];
}

/** Seq just before the first entry of the shard's current log. */
export function logStart(shard: ShardState): MailboxSeq {
  const first = shard.boundaries.find((b) => b.log === shard.log)!;
  return composeSeq(first.epoch, Math.max(0, first.start_offset - 1));
}
