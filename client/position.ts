/**
 * Where the device is in its mailbox: the token it resumes with and the last applied seq, and,
 * after a split, the stages still ahead. Pure: the client feeds it what arrives, in order with the
 * entries (docs/sdk.md, "Splits"), and does what it answers: save the cursor, or clear it.
 *
 * Stored-cursor rule: token and seq always share one numbering. During a split the device moves
 * to a stage's numbering only when that stage's entries begin, never straight to the last one
 * (that dropped C1's entries as regressions), and takes the stage's token at the same time (a
 * child token with a parent seq made a gateway skip the child's first entries; the split fault
 * scenario found it).
 */
import type { CursorToken, DeviceCursor, MailboxSeq, OldRange } from "../protocol/device.js";

/**
 * One numbering the device passes through after a split: an old shard's range, or the new shard.
 * Entering it: last applied = max(last applied, `after`), token = `cursor` if known.
 */
export interface Stage {
  shard: number;
  after: MailboxSeq;
  cursor: CursorToken | undefined;
}

/** A split in progress: old shards' ranges (one per hop, P -> C1 -> C2 ...), then the new shard. */
export interface Split {
  /** The range the device is in; undefined before the first one's entries began. */
  current: Stage | undefined;
  /** The ranges not entered yet, in order. */
  ahead: Stage[];
  /** The new shard (`replay_from_seq`, `new_cursor`): entering it ends the split. */
  target: Stage;
}

export type PositionInput =
  /** The cursor the store kept from an earlier run. */
  | { type: "stored"; cursor: DeviceCursor }
  /** AUTH_OK: `from` is the server's position for this device (its cursor, rebased, the head after a rebuild, 0 fresh). */
  | { type: "auth_ok"; cursor: CursorToken; from: MailboxSeq }
  /** CURSOR_REBASED: `to` and `cursor` are the new shard's; `oldRanges` the split's hops, if any. */
  | { type: "rebased"; to: MailboxSeq; cursor: CursorToken; oldRanges: readonly OldRange[] }
  /** A MSGS frame of `shard` is about to be applied. */
  | { type: "entries"; shard: number }
  /** SYNCED: every range and the new shard's catch-up were sent. */
  | { type: "synced" }
  /** The app's handler finished `seq` (or it was a duplicate). */
  | { type: "applied"; seq: MailboxSeq }
  /** CURSOR_EXPIRED: a rebuild; AUTH_OK's `from` (the head) follows. */
  | { type: "expired"; cursor: CursorToken }
  /** CURSOR_INVALID: a fresh start. */
  | { type: "invalid"; cursor: CursorToken | undefined }
  /** What the dead connection delivered comes again after the cursor; so does any split. */
  | { type: "connection_lost" };

export type PositionAction = { type: "save"; cursor: DeviceCursor } | { type: "clear" };

export class CursorPosition {
  private tokenValue: CursorToken | undefined;
  private seqValue: MailboxSeq = 0n;
  private splitValue: Split | undefined;

  get token(): CursorToken | undefined {
    return this.tokenValue;
  }

  /** The last applied seq. */
  get seq(): MailboxSeq {
    return this.seqValue;
  }

  get split(): Readonly<Split> | undefined {
    return this.splitValue;
  }

  /** The cursor to AUTH with: where applying stopped. */
  get cursor(): DeviceCursor | undefined {
    return this.tokenValue && { ...this.tokenValue, seq: this.seqValue };
  }

  apply(input: PositionInput): PositionAction[] {
    switch (input.type) {
      case "stored": {
        const c = input.cursor;
        this.tokenValue = { shard: c.shard, epoch: c.epoch, log: c.log, sig: c.sig };
        this.seqValue = c.seq;
        return [];
      }
      case "auth_ok":
        // during a split the old ranges play first: AUTH_OK's token is the new shard's, taken when its entries begin
        if (this.splitValue !== undefined) this.splitValue.target.cursor = input.cursor;
        else {
          this.tokenValue = input.cursor;
          this.seqValue = input.from;
        }
        return this.save();
      case "rebased":
        this.rebased(input);
        return this.save();
      case "entries":
        return this.splitValue === undefined ? [] : this.arrival(input.shard);
      case "synced":
        return this.splitValue === undefined ? [] : this.arrival(undefined);
      case "applied":
        this.seqValue = input.seq;
        return this.save();
      case "expired":
        this.tokenValue = input.cursor;
        this.seqValue = 0n;
        return [];
      case "invalid":
        this.tokenValue = input.cursor;
        this.seqValue = 0n;
        return [{ type: "clear" }];
      case "connection_lost":
        this.splitValue = undefined;
        return [];
    }
  }

  private rebased(r: Extract<PositionInput, { type: "rebased" }>): void {
    const stages: Stage[] = [...r.oldRanges.map((o) => ({ shard: o.shard, after: o.after, cursor: o.cursor })), { shard: r.cursor.shard, after: r.to, cursor: r.cursor }];
    const split = this.splitValue;
    if (split !== undefined) {
      // Another rebase before the last one's new shard began (its shard split again, or changed
      // epoch): its stages follow the ones still ahead. Its first stage is usually that same new
      // shard: one stage then, which keeps the earlier token when this frame names none.
      const target = split.target;
      if (stages[0]!.shard === target.shard) {
        const first = stages.shift()!;
        if (first.after > target.after) target.after = first.after;
        target.cursor = first.cursor ?? target.cursor;
      }
      const last = stages.pop();
      if (last !== undefined) {
        split.ahead.push(target, ...stages);
        split.target = last;
      }
    } else if (stages.length > 1) {
      // The old shards' ranges come first (their seqs are below the new shard's), each in its own
      // numbering, entered as its entries begin.
      const target = stages.pop()!;
      this.splitValue = { current: undefined, ahead: stages, target };
    } else {
      this.enter(stages[0]!);
    }
  }

  /**
   * Entries of `shard` (undefined: SYNCED) arrive during a split: entries of a later stage's shard
   * enter that stage, passing over the ranges before it that had no entries; SYNCED goes on to the
   * new shard. Entries of the stage the device is in, or of a shard no stage ahead names, change
   * nothing.
   */
  private arrival(shard: number | undefined): PositionAction[] {
    const split = this.splitValue!;
    if (shard !== undefined) {
      if (split.current?.shard === shard) return [];
      const i = split.ahead.findIndex((s) => s.shard === shard);
      if (i >= 0) {
        split.current = split.ahead[i]!;
        split.ahead.splice(0, i + 1);
        this.enter(split.current);
        return this.save();
      }
      if (split.target.shard !== shard) return [];
    }
    this.splitValue = undefined;
    this.enter(split.target);
    return this.save();
  }

  /** Moves to a stage's numbering: never below the last applied; its token when it has one. */
  private enter(s: Stage): void {
    if (s.after > this.seqValue) this.seqValue = s.after;
    if (s.cursor !== undefined) this.tokenValue = s.cursor;
  }

  private save(): PositionAction[] {
    const cursor = this.cursor;
    return cursor === undefined ? [] : [{ type: "save", cursor }];
  }
}
