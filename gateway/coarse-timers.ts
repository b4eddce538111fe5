/**
 * The gateway's timers for its sessions (TimerPort). A delay under WHEEL_AFTER_MS (the AUTH
 * deadline, an ACK flush) is a Node timer. A longer one (a token's expiry, minutes to hours away,
 * held by every idle session) waits on a wheel of one-second buckets that one timer per gateway
 * turns: a Node Timeout and its timer list cost an idle session about 350 bytes, a bucket entry a
 * small object in a Set. The wheel calls a long delay's function at the start of its second, up
 * to a second early; the caller checks the time (SessionClock arms the rest, which is short).
 */
import type { TimerPort } from "./ports.js";

/** Delays at least this long wait on the wheel. */
export const WHEEL_AFTER_MS = 60_000;

class WheelEntry {
  constructor(
    readonly fn: (arg: unknown) => void,
    readonly arg: unknown,
    readonly sec: number,
  ) {}
}

function turn(w: CoarseTimers): void {
  w.turn();
}

export class CoarseTimers implements TimerPort {
  /** Entries by the second they are due in (ms / 1000, floored). */
  private readonly buckets = new Map<number, Set<WheelEntry>>();
  private tick: unknown;

  constructor(private readonly near: TimerPort) {}

  now(): number {
    return this.near.now();
  }

  setTimeout<A>(fn: (arg: A) => void, ms: number, arg: A): unknown {
    if (ms < WHEEL_AFTER_MS) return this.near.setTimeout(fn, ms, arg);
    const e = new WheelEntry(fn as (arg: unknown) => void, arg, Math.floor((this.near.now() + ms) / 1000));
    let bucket = this.buckets.get(e.sec);
    if (bucket === undefined) this.buckets.set(e.sec, (bucket = new Set()));
    bucket.add(e);
    this.armTick();
    return e;
  }

  clearTimeout(handle: unknown): void {
    if (!(handle instanceof WheelEntry)) return this.near.clearTimeout(handle);
    const bucket = this.buckets.get(handle.sec);
    if (bucket?.delete(handle) === true && bucket.size === 0) this.buckets.delete(handle.sec);
  }

  /** Entries waiting on the wheel. */
  get waiting(): number {
    let n = 0;
    for (const b of this.buckets.values()) n += b.size;
    return n;
  }

  /** Calls every entry whose second has begun; the turn after is armed first, so one that throws stops no other. */
  turn(): void {
    this.tick = undefined;
    const nowSec = Math.floor(this.near.now() / 1000);
    const due: WheelEntry[] = [];
    for (const [sec, bucket] of this.buckets) {
      if (sec > nowSec) continue;
      this.buckets.delete(sec);
      for (const e of bucket) due.push(e);
    }
    this.armTick();
    const errors: unknown[] = [];
    for (const e of due) {
      try {
        e.fn(e.arg);
      } catch (err) {
        errors.push(err);
      }
    }
    if (errors.length > 0) throw errors[0];
  }

  /** One timer for the whole wheel, at the next whole second, while anything waits on it. */
  private armTick(): void {
    if (this.tick !== undefined || this.buckets.size === 0) return;
    this.tick = this.near.setTimeout(turn, 1000 - (this.near.now() % 1000), this);
  }
}
