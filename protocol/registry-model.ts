/**
 * The shard registry as data, and the pure rules over it (docs/design.md, "Epochs and logs" and
 * "The registry").
 *
 * The registry is a log of records on the JETGATE_REGISTRY stream. Each record carries the whole
 * new state of every shard it changes, so one append can change several shards atomically (a split
 * changes parent and child). State is the fold of all records. Records cross a trust boundary (any
 * NATS client with access could write one), so they are parsed with zod.
 */
import { z } from "zod";
import { JetgateError } from "./errors.js";
import { HASH_SPACE, userHash } from "./hash.js";
import { idSchema } from "./ids.js";
import { composeSeq, MAX_EPOCH, MAX_OFFSET, U64_MAX, type MailboxSeq } from "./seq.js";

export class RegistryError extends JetgateError {
  constructor(message: string, options?: { cause?: unknown }) {
    super("REGISTRY", message, options);
  }
}

/** Why an epoch went up (docs/design.md, "Epochs and logs"): E1 takeover, E2 split/merge, E3 rebuild, E4 failover. */
export const EpochCause = z.enum(["init", "takeover", "split", "merge", "rebuild", "failover"]);
export type EpochCause = z.output<typeof EpochCause>;

/** A seq as it is stored in JSON: a decimal string (JSON numbers lose integers above 2^53). */
const seqJson = z
  .union([z.string().regex(/^\d{1,20}$/, "must be a decimal string"), z.bigint()])
  .transform((v) => BigInt(v))
  .refine((v) => v <= U64_MAX, "must fit in 64 bits");
const u32 = z.number().int().min(0).max(0xffffffff);
const offset = z.number().int().min(0).max(Number(MAX_OFFSET));
const epoch = z.number().int().min(0).max(MAX_EPOCH);

export const EpochBoundarySchema = z.object({
  epoch,
  cause: EpochCause,
  /** Stream generation id: which physical log this epoch's offsets refer to. */
  log: idSchema("log"),
  /** First log offset processed under this epoch. */
  start_offset: offset,
  start_seq: seqJson,
  /** Seq of the last entry before this boundary, in the numbering of its time (0 if none). */
  prev_end_seq: seqJson,
});
export type EpochBoundary = z.output<typeof EpochBoundarySchema>;

export const HashRangeSchema = z
  .object({ lo: u32, hi: u32 })
  .refine((r) => r.lo <= r.hi, "range lo must not exceed hi");
export type HashRange = z.output<typeof HashRangeSchema>;

export const SplitBoundarySchema = z.object({
  parent: u32,
  child: u32,
  range: HashRangeSchema,
  /** Last seq, in the parent's numbering, that belongs to the parent for moved users. */
  split_at_seq: seqJson,
  /** First seq of the child shard. */
  child_start_seq: seqJson,
});
export type SplitBoundary = z.output<typeof SplitBoundarySchema>;

export const ShardStateSchema = z.object({
  shard: u32,
  /** Hash range of users this shard owns (empty for a retired shard, see `status`). */
  range: HashRangeSchema,
  status: z.enum(["active", "retired"]),
  epoch,
  /** Current log (stream generation id); equals the last boundary's log. */
  log: idSchema("log"),
  /** Ascending by epoch; the last one is the current epoch's. */
  boundaries: z.array(EpochBoundarySchema).min(1),
  /** Splits this shard took part in, as parent or child. */
  splits: z.array(SplitBoundarySchema),
  /**
   * Who works under the current epoch (see `isClaimed`): null when an operation (init, an
   * operator's takeover, split, rebuild, failover) wrote it and no worker has claimed it yet; the
   * worker id when a worker claimed it or bumped to it. Absent in records of older versions:
   * treated as claimed, so a rolling upgrade never lets two workers share an epoch.
   */
  owner: z.string().max(128).nullable().optional(),
  /**
   * Set by a planned handoff (op `release`): the owner of the current epoch stopped on purpose
   * after finishing every offset up to this one, and gave the epoch up (owner null). The next
   * worker claims the same epoch and consumes from the offset after it: nothing to fence, nothing
   * renumbered. Kept by that claim (a lower bound for a later takeover's start), dropped by any
   * epoch bump.
   */
  released_offset: offset.optional(),
});
export type ShardState = z.output<typeof ShardStateSchema>;

export const RegistryRecordSchema = z.object({
  v: z.literal(1),
  /** `release`: a worker handed its epoch back on purpose (see `releaseEpoch`); the rest as the causes. */
  op: z.enum(["init", "takeover", "release", "split", "merge", "rebuild", "failover"]),
  /** Wall-clock ms when written (informational). */
  at: z.number().int().min(0),
  /** Who wrote it (worker id, `cli`, ...). */
  by: z.string().max(128),
  shards: z.array(ShardStateSchema).min(1),
});
export type RegistryRecord = z.output<typeof RegistryRecordSchema>;

/** A record of `op` by `by` (a worker id, `cli`) with the new states of `shards`, stamped now. */
export function registryRecord(op: RegistryRecord["op"], by: string, shards: ShardState[]): RegistryRecord {
  return { v: 1, op, at: Date.now(), by, shards };
}

/** JSON.stringify's replacer for seqs: bigints as decimal strings, the registry's JSON form. */
export function bigintsAsStrings(_key: string, v: unknown): unknown {
  return typeof v === "bigint" ? v.toString() : v;
}

export function encodeRecord(record: RegistryRecord): Uint8Array {
  return new TextEncoder().encode(JSON.stringify(record, bigintsAsStrings));
}

export function decodeRecord(bytes: Uint8Array): RegistryRecord {
  let raw: unknown;
  try {
    raw = JSON.parse(new TextDecoder().decode(bytes));
  } catch (err) {
    throw new RegistryError("registry record is not JSON", { cause: err });
  }
  const parsed = RegistryRecordSchema.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new RegistryError(`invalid registry record: ${issue?.path.join(".")}: ${issue?.message}`);
  }
  return checkShardInvariants(parsed.data);
}

/** Rules zod cannot state per field: boundaries ascend, the last one is the shard's epoch and log. */
function checkShardInvariants(record: RegistryRecord): RegistryRecord {
  for (const s of record.shards) {
    const last = s.boundaries[s.boundaries.length - 1]!;
    if (last.epoch !== s.epoch || last.log !== s.log) {
      throw new RegistryError(`shard ${s.shard}: last boundary (epoch ${last.epoch}, log ${last.log}) is not the current epoch/log`);
    }
    for (let i = 1; i < s.boundaries.length; i++) {
      if (s.boundaries[i]!.epoch <= s.boundaries[i - 1]!.epoch) throw new RegistryError(`shard ${s.shard}: boundaries must ascend by epoch`);
    }
    for (const b of s.boundaries) {
      if (b.start_seq !== composeSeq(b.epoch, b.start_offset)) throw new RegistryError(`shard ${s.shard}: boundary ${b.epoch} start_seq mismatch`);
    }
  }
  return record;
}

/** The folded registry: every shard's current state and the stream seq of the last record applied. */
export interface RegistryState {
  readonly seq: number;
  readonly shards: ReadonlyMap<number, ShardState>;
}

export const EMPTY_REGISTRY: RegistryState = { seq: 0, shards: new Map() };

/**
 * Applies one record. A record may only raise a shard's epoch (or keep it for a pure range change,
 * a worker's claim or its release); one that would lower it is refused, so a forged or replayed
 * record cannot move epochs back. At the same epoch the owner may only go from unclaimed to a
 * worker (a claim), or from a worker back to unclaimed by that worker's own `release` record, with
 * the same log and boundaries and an offset that does not go back: a record that hands a claimed
 * epoch to someone else is refused, so no two workers ever work under one epoch.
 */
export function applyRecord(state: RegistryState, seq: number, record: RegistryRecord): RegistryState {
  const shards = new Map(state.shards);
  for (const s of record.shards) {
    const prev = shards.get(s.shard);
    if (prev !== undefined && s.epoch < prev.epoch) {
      throw new RegistryError(`record ${seq} lowers shard ${s.shard} epoch from ${prev.epoch} to ${s.epoch}`);
    }
    if (prev !== undefined && s.epoch === prev.epoch && isClaimed(prev) && s.owner !== prev.owner) {
      const refusal = releaseRefusal(prev, s, record);
      if (refusal !== undefined) throw new RegistryError(`record ${seq} reassigns epoch ${s.epoch} of shard ${s.shard}, claimed by ${prev.owner ?? "a worker of an older version"}: ${refusal}`);
    }
    shards.set(s.shard, s);
  }
  return { seq, shards };
}

/** Why `next` is not a valid release of `prev`'s claimed epoch; undefined when it is one. */
function releaseRefusal(prev: ShardState, next: ShardState, record: RegistryRecord): string | undefined {
  if (record.op !== "release" || next.owner !== null) return "only its owner's release may give it up";
  if (prev.owner === undefined || record.by !== prev.owner) return `a release by ${record.by}, not by the owner`;
  if (next.released_offset === undefined) return "a release without the offset it ends at";
  if (prev.released_offset !== undefined && next.released_offset < prev.released_offset) return `a release at offset ${next.released_offset}, below the previous one (${prev.released_offset})`;
  if (next.log !== prev.log || next.boundaries.length !== prev.boundaries.length) return "a release that changes the log or the boundaries";
  return undefined;
}

/**
 * True when a worker works (or worked) under the shard's current epoch: it claimed it, or bumped
 * to it, or the record predates claims (no `owner` field). Only an unclaimed epoch (owner null,
 * written by an operation) may be claimed; a worker taking a claimed one bumps.
 */
export function isClaimed(shard: ShardState): boolean {
  return shard.owner !== null;
}

/**
 * The shard with its current epoch claimed by `worker`: the same epoch and boundaries, the owner
 * set. Written with optimistic concurrency, so of two workers racing for one epoch only one claims
 * it. Pure.
 */
export function claimEpoch(shard: ShardState, worker: string): ShardState {
  if (isClaimed(shard)) throw new RegistryError(`shard ${shard.shard}: epoch ${shard.epoch} is claimed already (${shard.owner ?? "by an older version"})`);
  return { ...shard, owner: worker };
}

/**
 * The shard with its current epoch given back by its owner after a planned stop: every offset up to
 * `offset` is done (Redis, pushes, ack), nothing past it was pushed. Unclaimed again, the epoch is
 * claimed by the next worker, which consumes from `offset + 1` (see planTakeover). Written with
 * optimistic concurrency like a claim, so a fence that came first wins and the release is not
 * written. Pure.
 */
export function releaseEpoch(shard: ShardState, worker: string, offset: number): ShardState {
  if (shard.owner !== worker) throw new RegistryError(`shard ${shard.shard}: epoch ${shard.epoch} is not claimed by ${worker} (${shard.owner === null ? "unclaimed" : (shard.owner ?? "an older version")})`);
  return { ...shard, owner: null, released_offset: offset };
}

/** The range of shard `i` of `n` when the hash space is cut evenly. */
export function evenRange(i: number, n: number): HashRange {
  return { lo: Math.floor((i * HASH_SPACE) / n), hi: Math.floor(((i + 1) * HASH_SPACE) / n) - 1 };
}

/** Shards 0..n-1 at epoch 0, each on its own log; epoch 0 is unclaimed (the first worker claims it). */
export function initialShards(n: number, logs: readonly string[]): ShardState[] {
  if (logs.length !== n) throw new RegistryError(`need ${n} log ids, got ${logs.length}`);
  return logs.map((log, i) => ({
    shard: i,
    range: evenRange(i, n),
    status: "active" as const,
    epoch: 0,
    log,
    boundaries: [{ epoch: 0, cause: "init" as const, log, start_offset: 1, start_seq: composeSeq(0, 1), prev_end_seq: 0n }],
    splits: [],
    owner: null,
  }));
}

/**
 * The seq of the entry at `offset` of `log`: the latest boundary of that log whose start_offset
 * is at or below it gives the epoch. Undefined when no boundary of that log covers the offset.
 */
export function deriveSeq(shard: ShardState, log: string, offset: number): MailboxSeq | undefined {
  for (let i = shard.boundaries.length - 1; i >= 0; i--) {
    const b = shard.boundaries[i]!;
    if (b.log === log && b.start_offset <= offset) return composeSeq(b.epoch, offset);
  }
  return undefined;
}

export interface EpochBump {
  cause: EpochCause;
  /** First offset to process under the new epoch. */
  start_offset: number;
  /** The log of the new epoch; defaults to the current one (E1, and E2 for the parent). */
  log?: string;
  /** For a new log (E3, E4): the last offset of the old log, to record prev_end_seq. */
  prev_end_offset?: number;
  /**
   * How far the epoch rises (default 1). A failover to a copy whose registry may lag rises by a
   * margin, so the new epoch is above any epoch the lost primary wrote after the copy's last record.
   */
  epochs?: number;
  /**
   * Who works under the new epoch: null for an operation's bump (the first worker that takes the
   * shard claims it instead of bumping again), the worker id for a worker's own takeover. Left out,
   * the new epoch counts as claimed (no `owner` field): the safe default, at worst one more bump.
   */
  owner?: string | null;
}

/** The shard with its epoch raised (by one unless told) and the boundary of the new epoch appended. Pure. */
export function bumpEpoch(shard: ShardState, bump: EpochBump): ShardState {
  const step = bump.epochs ?? 1;
  if (!Number.isInteger(step) || step < 1) throw new RegistryError(`epoch step must be a positive integer, got ${step}`);
  const next = shard.epoch + step;
  if (next > MAX_EPOCH) throw new RegistryError(`shard ${shard.shard} has used all ${MAX_EPOCH} epochs`);
  const log = bump.log ?? shard.log;
  const current = shard.boundaries[shard.boundaries.length - 1]!;
  const lastOffset = log === shard.log ? bump.start_offset - 1 : bump.prev_end_offset;
  const prevEnd = lastOffset !== undefined && lastOffset > 0 ? deriveSeq(shard, shard.log, lastOffset) : undefined;
  const boundary: EpochBoundary = {
    epoch: next,
    cause: bump.cause,
    log,
    start_offset: bump.start_offset,
    start_seq: composeSeq(next, bump.start_offset),
    prev_end_seq: prevEnd ?? current.prev_end_seq,
  };
  const { owner: _previous, released_offset: _released, ...rest } = shard;
  return { ...rest, epoch: next, log, boundaries: [...shard.boundaries, boundary], ...(bump.owner !== undefined ? { owner: bump.owner } : {}) };
}

/** Looks users up by hash among the active shards; numbers offsets as the registry state it was built from. */
export class ShardMap {
  private readonly ranges: { lo: number; hi: number; shard: number }[];

  constructor(private readonly state: RegistryState) {
    this.ranges = [...state.shards.values()]
      .filter((s) => s.status === "active")
      .map((s) => ({ lo: s.range.lo, hi: s.range.hi, shard: s.shard }))
      .sort((a, b) => a.lo - b.lo);
  }

  /** The shard owning this hash, or undefined when no active shard covers it. */
  shardOfHash(h: number): number | undefined {
    let lo = 0;
    let hi = this.ranges.length - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      const r = this.ranges[mid]!;
      if (h < r.lo) hi = mid - 1;
      else if (h > r.hi) lo = mid + 1;
      else return r.shard;
    }
    return undefined;
  }

  shardOf(user: string): number | undefined {
    return this.shardOfHash(userHash(user));
  }

  /**
   * The mailbox_seq of the entry at `offset` of the shard's current log, as this registry state
   * numbers it (`deriveSeq`); undefined for a shard it does not know.
   */
  seqOf(shard: number, offset: number): MailboxSeq | undefined {
    const s = this.state.shards.get(shard);
    return s === undefined ? undefined : deriveSeq(s, s.log, offset);
  }
}

/** True when the shard's range covers this user. */
export function ownsUser(shard: ShardState, user: string): boolean {
  const h = userHash(user);
  return shard.status === "active" && h >= shard.range.lo && h <= shard.range.hi;
}

export interface SplitPlan {
  /** Id of the new child shard (unused so far). */
  child: number;
  childLog: string;
  /** The part of the parent's range that moves to the child: its lower or upper half by default. */
  moved: HashRange;
  /** Last offset of the parent's log that stays the parent's for moved users (the cut). */
  cutOffset: number;
}

/**
 * A split (E2) as the new states of parent and child. The parent keeps the rest of its range and
 * bumps its epoch (from cut + 1); the child starts at parent epoch + 1 on its own log, so a moved
 * user's seqs keep increasing; both record the ShardSplitBoundary. Both epochs are unclaimed: the
 * workers that take parent and child claim them. Pure.
 */
export function splitShard(parent: ShardState, plan: SplitPlan): [ShardState, ShardState] {
  const r = parent.range;
  const m = plan.moved;
  if (m.lo > m.hi || m.lo < r.lo || m.hi > r.hi || (m.lo !== r.lo && m.hi !== r.hi) || (m.lo === r.lo && m.hi === r.hi)) {
    throw new RegistryError(`shard ${parent.shard}: moved range ${m.lo}..${m.hi} must be a proper lower or upper part of ${r.lo}..${r.hi}`);
  }
  const kept: HashRange = m.lo === r.lo ? { lo: m.hi + 1, hi: r.hi } : { lo: r.lo, hi: m.lo - 1 };
  const bumped = bumpEpoch(parent, { cause: "split", start_offset: plan.cutOffset + 1, owner: null });
  const childEpoch = bumped.epoch;
  const splitAt = plan.cutOffset > 0 ? (deriveSeq(parent, parent.log, plan.cutOffset) ?? composeSeq(parent.epoch, plan.cutOffset)) : 0n;
  const boundary: SplitBoundary = {
    parent: parent.shard,
    child: plan.child,
    range: m,
    split_at_seq: splitAt,
    child_start_seq: composeSeq(childEpoch, 1),
  };
  const child: ShardState = {
    shard: plan.child,
    range: m,
    status: "active",
    epoch: childEpoch,
    log: plan.childLog,
    boundaries: [{ epoch: childEpoch, cause: "split", log: plan.childLog, start_offset: 1, start_seq: composeSeq(childEpoch, 1), prev_end_seq: splitAt }],
    splits: [boundary],
    owner: null,
  };
  return [{ ...bumped, range: kept, splits: [...parent.splits, boundary] }, child];
}

/** The lower or upper half of a shard's range. */
export function halfRange(r: HashRange, upper: boolean): HashRange {
  const mid = r.lo + Math.floor((r.hi - r.lo) / 2);
  return upper ? { lo: mid + 1, hi: r.hi } : { lo: r.lo, hi: mid };
}

/**
 * First offset a new owner must process: one past the ack floor of the shard's consumers, but
 * never below a boundary written from an ack floor (takeover) or the start of the current log.
 * A split boundary is written by an operator from the stream's last offset, so entries between the
 * floor and the cut may still be unprocessed: they are processed, numbered by the older boundary.
 * The first owner after a split also starts no later than the cut: what the fenced owner processed
 * past it went out under the old epoch (gateways that knew the split dropped those pushes) and was
 * acked, so a moved user's entry there was never forwarded to the child (the split fault scenario
 * lost one that way). Processed again, moved users' entries are forwarded, the rest pushed again
 * under the new epoch (devices drop the repeats by message id).
 */
export function processingStart(shard: ShardState, ackFloor: number): number {
  // a release's offset: its owner finished everything up to it (the ack of the last batch may not
  // have reached the consumer's floor)
  let lower = shard.released_offset !== undefined ? shard.released_offset + 1 : 1;
  for (const b of shard.boundaries) {
    if (b.log === shard.log && b.cause !== "split" && b.cause !== "merge") lower = Math.max(lower, b.start_offset);
  }
  const start = Math.max(ackFloor + 1, lower);
  const last = shard.boundaries[shard.boundaries.length - 1]!;
  return last.cause === "split" && last.log === shard.log ? Math.min(start, last.start_offset) : start;
}

/** How a worker takes a shard over: which epoch it works under and from where it consumes. */
export interface TakeoverPlan {
  /**
   * `claim`: the current epoch was written by an operation and no worker has it yet, so the worker
   * claims it (a record that changes no epoch). `resume`: the epoch's owner released it after a
   * planned stop, so the worker claims it and goes on after the released offset. `bump`: a worker
   * has (or had) it and did not release it, so the worker bumps the epoch (E1, the fence).
   */
  mode: "claim" | "resume" | "bump";
  /** First offset to consume. */
  startOffset: number;
  /** First offset numbered by the epoch the worker works under; offsets below by older boundaries. */
  boundaryStart: number;
}

/**
 * The takeover of a shard whose worker consumers' ack floor is `ackFloor`. Pure.
 *
 * Bump (as always): consume from `processingStart`, the new boundary at or above the current one.
 * Claim: the operation's boundary is the one worked under, and consumption starts at its start, or
 * below it where `processingStart` says so (a split's cut above the floor). Never above it: what the
 * fenced owner processed past the boundary before it saw the new epoch went out under the old one,
 * was dropped by gateways as stale and acked, so it is processed again (devices drop repeats by
 * message id); a takeover boundary was written from an ack floor, so nothing below it is missed.
 */
export function planTakeover(shard: ShardState, ackFloor: number): TakeoverPlan {
  const current = shard.boundaries[shard.boundaries.length - 1]!;
  // a release: the same log under the same epoch from the offset after it; the split rules do not
  // apply again (the owner that released had done what they ask)
  if (!isClaimed(shard) && shard.released_offset !== undefined) return { mode: "resume", startOffset: shard.released_offset + 1, boundaryStart: current.start_offset };
  const start = processingStart(shard, ackFloor);
  if (!isClaimed(shard)) return { mode: "claim", startOffset: Math.min(start, current.start_offset), boundaryStart: current.start_offset };
  return { mode: "bump", startOffset: start, boundaryStart: Math.max(start, current.start_offset) };
}

/**
 * Whether the entry at `seq` for `user` in this shard's stream is the shard's own or must be
 * forwarded: a user moved by a split stays the parent's up to split_at_seq (the cut).
 */
export function entryOwner(shard: ShardState, user: string, seq: MailboxSeq): "own" | "forward" {
  const h = userHash(user);
  if (h >= shard.range.lo && h <= shard.range.hi) return "own";
  for (const s of shard.splits) {
    if (s.parent === shard.shard && h >= s.range.lo && h <= s.range.hi && seq <= s.split_at_seq) return "own";
  }
  return "forward";
}
