/**
 * The gateway's timers for its sessions (TimerPort). A delay under WHEEL_AFTER_MS (the AUTH
 * deadline, an ACK flush) is a Node timer. A longer one (a token's expiry, minutes to hours away,
 * held by every idle session) waits on a wheel of one-second buckets that one timer per gateway
 * turns: a Node Timeout and its timer list cost an idle session about 350 bytes, a bucket entry a
 * small object in a Set. The wheel calls a long delay's function at the start of its second, up
 * to a second early; the caller checks the time (SessionClock arms the rest, which is short).
 */
import type { TimerHandle } from "../../protocol/index.js";
import type { TimerPort } from "../ports.js";

/** Delays at least this long wait on the wheel. */
export const WHEEL_AFTER_MS = 60_000;

class WheelEntry {
  /** False once cleared: a turn that already took the entry from its bucket skips it. */
  live = true;
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
  /** The last second a turn covered: the next turn looks at the seconds after it only. */
  private turnedSec: number;

  constructor(private readonly near: TimerPort) {
    this.turnedSec = Math.floor(near.now() / 1000);
  }

  now(): number {
    return this.near.now();
  }

  monotonic(): number {
    return this.near.monotonic();
  }

  setTimeout<A = undefined>(fn: (arg: A) => void, ms: number, ...rest: undefined extends A ? [arg?: A] : [arg: A]): TimerHandle {
    const arg = rest[0] as A;
    if (ms < WHEEL_AFTER_MS) return this.near.setTimeout(fn as (arg: unknown) => void, ms, arg);
    const e = new WheelEntry(fn as (arg: unknown) => void, arg, Math.floor((this.near.now() + ms) / 1000));
    let bucket = this.buckets.get(e.sec);
    if (bucket === undefined) this.buckets.set(e.sec, (bucket = new Set()));
    bucket.add(e);
    this.armTick();
    return e;
  }

  /** Intervals are the near clock's (the sessions arm none; the interface has them). */
  setInterval(fn: () => void, ms: number): TimerHandle {
    return this.near.setInterval(fn, ms);
  }

  clearInterval(handle: TimerHandle | undefined): void {
    this.near.clearInterval(handle);
  }

  clearTimeout(handle: TimerHandle | undefined): void {
    if (!(handle instanceof WheelEntry)) return this.near.clearTimeout(handle);
    handle.live = false;
    const bucket = this.buckets.get(handle.sec);
    if (bucket?.delete(handle) === true && bucket.size === 0) this.buckets.delete(handle.sec);
  }

  /** Entries waiting on the wheel. */
  get waiting(): number {
    let n = 0;
    for (const b of this.buckets.values()) n += b.size;
    return n;
  }

  /**
   * Calls every entry whose second has begun; the turn after is armed first, so one that throws
   * stops no other. A turn looks up the seconds since the last one (one, normally), not every
   * bucket: with day-long tokens there are tens of thousands.
   */
  turn(): void {
    this.tick = undefined;
    const nowSec = Math.floor(this.near.now() / 1000);
    const due: WheelEntry[] = [];
    const take = (sec: number, bucket: Set<WheelEntry>) => {
      this.buckets.delete(sec);
      for (const e of bucket) due.push(e);
    };
    // a clock that stepped back, or a long pause: look at every bucket
    if (nowSec >= this.turnedSec && nowSec - this.turnedSec <= this.buckets.size) {
      for (let sec = this.turnedSec + 1; sec <= nowSec; sec++) {
        const bucket = this.buckets.get(sec);
        if (bucket !== undefined) take(sec, bucket);
      }
    } else {
      for (const [sec, bucket] of this.buckets) if (sec <= nowSec) take(sec, bucket);
    }
    this.turnedSec = nowSec;
    this.armTick();
    const errors: unknown[] = [];
    for (const e of due) {
      if (!e.live) continue; // cleared by an entry called before it in this turn
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
