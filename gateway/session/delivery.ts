/**
 * The delivery invariants of one session in one small object: what was sent, what is accounted
 * for, which pushes wait while the session syncs, what a push is (next, duplicate, after a gap),
 * and which ACKs can be true. No I/O: the session asks it and acts.
 */
import type { Entry, MailboxSeq, Push } from "../../protocol/index.js";

export type PushKind =
  /** At or below what the session accounted for: drop it. */
  | "duplicate"
  /** Its predecessor is unknown or was never seen here: fill from the mailbox first. */
  | "gap"
  /** Follows what the session has: send it. */
  | "next";

export class Delivery {
  /** Last seq sent on this connection (the cursor the device will report). */
  lastSent: MailboxSeq = 0n;
  /** Highest seq this session has accounted for, sent or filtered out by its lanes. */
  lastKnown: MailboxSeq = 0n;
  /** Seqs refused by `select` for being at or below the last sent (never expected; counted). */
  regressions = 0;
  /** The highest seq the device can hold: a position it was given, an entry sent, a PULL reply. */
  private bound: MailboxSeq = 0n;
  private held: Push[] = [];
  private overflow = false;

  constructor(
    private readonly lanes: ReadonlySet<string> | undefined,
    private readonly maxHeld: number,
  ) {}

  /** The session's position moves to at least `seq` (AUTH's start, a rebase, a split hop). */
  moveTo(seq: MailboxSeq): void {
    if (seq > this.lastSent) this.lastSent = seq;
    this.lastKnown = this.lastSent;
    if (seq > this.bound) this.bound = seq;
  }

  /** Of `entries` (increasing seq), those to send now; the rest are accounted for or refused. */
  select(entries: readonly Entry[]): Entry[] {
    const out: Entry[] = [];
    for (const e of entries) {
      if (e.seq > this.lastKnown) this.lastKnown = e.seq;
      if (this.lanes !== undefined && !this.lanes.has(e.lane)) continue;
      if (e.seq <= this.lastSent) {
        this.regressions++;
        continue;
      }
      out.push(e);
      this.lastSent = e.seq;
    }
    if (this.lastSent > this.bound) this.bound = this.lastSent;
    return out;
  }

  /**
   * Whether `select` would send every one of `pushes`' entries (increasing seq); if so they are
   * taken as sent, as `select` takes them, and nothing is allocated. False changes nothing.
   */
  takeAll(pushes: readonly Push[]): boolean {
    let last = this.lastSent;
    for (const p of pushes) {
      const e = p.entry;
      if (e.seq <= last || (this.lanes !== undefined && !this.lanes.has(e.lane))) return false;
      last = e.seq;
    }
    if (last > this.lastKnown) this.lastKnown = last;
    this.lastSent = last;
    if (last > this.bound) this.bound = last;
    return true;
  }

  /** Whether this session's device asked for entries of `lane` (AUTH `lanes`; all when absent). */
  wants(lane: string): boolean {
    return this.lanes === undefined || this.lanes.has(lane);
  }

  /** True when the device asked for every lane. */
  get allLanes(): boolean {
    return this.lanes === undefined;
  }

  classify(push: Push): PushKind {
    if (push.entry.seq <= this.lastKnown) return "duplicate";
    if (push.prevAll === null || push.prevAll > this.lastKnown) return "gap";
    return "next";
  }

  /** Keeps a push that arrived while syncing; beyond the bound the session re-reads instead. */
  hold(push: Push): void {
    if (this.held.length >= this.maxHeld) this.overflow = true;
    else this.held.push(push);
  }

  /** The next held push, "overflow" when too many came (drop them, read the mailbox), undefined when none. */
  nextHeld(): Push | "overflow" | undefined {
    if (this.overflow) {
      this.overflow = false;
      this.held = [];
      return "overflow";
    }
    return this.held.shift();
  }

  clearHeld(): void {
    this.held = [];
    this.overflow = false;
  }

  /** A PULL reply went out with entries up to `seq`. */
  pulled(seq: MailboxSeq): void {
    if (seq > this.bound) this.bound = seq;
  }

  /** An ACK can only name a seq the device could have got. */
  canAck(seq: MailboxSeq): boolean {
    return seq <= this.bound;
  }

  /** The highest seq an ACK may name now. */
  get ackBound(): MailboxSeq {
    return this.bound;
  }
}
