/**
 * A clock that moves only when the test says (protocol/clock.ts's Clock): `advance(ms)` fires what
 * falls due in time order, each at its own time, including timers armed by callbacks during the
 * advance. A 10 s hold or a 50 ms freshness window is then a step, not a wait.
 */
import type { Clock, TimerHandle } from "../../protocol/index.js";

interface Pending {
  at: number;
  /** When armed (or an interval last re-armed): of two timers due at once the earlier fires first, as Node's. */
  order: number;
  fn: (arg: unknown) => void;
  arg: unknown;
  /** An interval's period; undefined for a timeout. */
  every: number | undefined;
}

export class ManualClock implements Clock {
  private mono = 0;
  /** Timer ids, and the order timers were armed (or an interval re-armed) in. */
  private seq = 1;
  private readonly timers = new Map<number, Pending>();

  /** `start`: what now() reads before any advance (ms since the epoch); monotonic() starts at 0. */
  constructor(private readonly start = 0) {}

  now(): number {
    return this.start + this.mono;
  }

  monotonic(): number {
    return this.mono;
  }

  setTimeout<A = undefined>(fn: (arg: A) => void, ms: number, ...arg: undefined extends A ? [arg?: A] : [arg: A]): TimerHandle {
    return this.arm(fn as (arg: unknown) => void, arg[0], Math.max(0, ms), undefined);
  }

  clearTimeout(h: TimerHandle | undefined): void {
    if (typeof h === "number") this.timers.delete(h);
  }

  /** A period under 1 ms is 1 ms (as Node's), or an advance would never end. */
  setInterval(fn: () => void, ms: number): TimerHandle {
    const every = Math.max(1, ms);
    return this.arm(fn, undefined, every, every);
  }

  clearInterval(h: TimerHandle | undefined): void {
    this.clearTimeout(h);
  }

  /** Timers armed and not yet fired or cleared (an interval counts until cleared). */
  get pending(): number {
    return this.timers.size;
  }

  /** Moves time `ms` on, firing each timer due by then at its time, earliest first. */
  advance(ms: number): void {
    const end = this.mono + ms;
    for (;;) {
      let due: [number, Pending] | undefined;
      for (const e of this.timers) {
        const t = e[1];
        if (t.at <= end && (due === undefined || t.at < due[1].at || (t.at === due[1].at && t.order < due[1].order))) due = e;
      }
      if (due === undefined) break;
      const [id, t] = due;
      this.mono = t.at;
      if (t.every === undefined) this.timers.delete(id);
      else {
        t.at += t.every;
        t.order = this.seq++;
      }
      t.fn(t.arg);
    }
    this.mono = end;
  }

  private arm(fn: (arg: unknown) => void, arg: unknown, ms: number, every: number | undefined): number {
    const id = this.seq++;
    this.timers.set(id, { at: this.mono + ms, order: id, fn, arg, every });
    return id;
  }
}

const turn = () => new Promise<void>((r) => setImmediate(r));

/** `ms` of `clock`'s time, a millisecond at a time with a turn of the event loop between. */
export async function pass(clock: ManualClock, ms: number): Promise<void> {
  for (let i = 0; i < ms; i++) {
    clock.advance(1);
    await turn();
  }
}

/** Steps `clock` a millisecond at a time, a turn between, until `done` (at most `maxMs`). */
export async function passUntil(clock: ManualClock, done: () => boolean, maxMs = 60_000): Promise<void> {
  for (let i = 0; !done() && i < maxMs; i++) {
    clock.advance(1);
    await turn();
  }
}

/** Steps `clock` until `p` settles (at most `maxMs` of its time); `p`'s value. */
export async function driven<T>(clock: ManualClock, p: Promise<T>, maxMs = 60_000): Promise<T> {
  let done = false;
  void p.then(() => (done = true), () => (done = true));
  await passUntil(clock, () => done, maxMs);
  return p;
}
