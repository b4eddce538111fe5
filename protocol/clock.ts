/**
 * Time behind one port: what the gateway's hub and sessions, the worker's epoch guard and the
 * device SDK read the time and arm timers on. Production passes `systemClock`; tests pass a clock
 * they step by hand (test/harness/manual-clock.ts), so a 10 s hold or a 50 ms freshness window is
 * tested without waiting for it. Browser-safe: no Node module, no process.
 */

/** What a clock's setTimeout or setInterval returns: opaque, only handed back to the same clock to clear it. */
export type TimerHandle = unknown;

export interface Clock {
  /**
   * Wall time, ms since the epoch, that never steps: the process's start on the wall clock plus the
   * monotonic time since, so a wall clock set back or forth moves no deadline. For times compared
   * with another machine's (a token's `exp`, an entry's `ts`).
   */
  now(): number;
  /** Ms from an arbitrary origin, for durations only. */
  monotonic(): number;
  /**
   * Calls `fn(arg)` after `ms`. Passing `arg` spares a closure per caller (a timer per idle session);
   * it may be left out only when `fn` takes none (or accepts undefined).
   */
  setTimeout<A = undefined>(fn: (arg: A) => void, ms: number, ...arg: undefined extends A ? [arg?: A] : [arg: A]): TimerHandle;
  clearTimeout(h: TimerHandle | undefined): void;
  setInterval(fn: () => void, ms: number): TimerHandle;
  clearInterval(h: TimerHandle | undefined): void;
}

/** A Node timer's unref, where the runtime has one (a browser's timer is a number). */
function unref(t: unknown): unknown {
  (t as { unref?: () => unknown }).unref?.();
  return t;
}

/**
 * The runtime's clocks and timers. Each global is looked up at each call, so node:test's mock
 * timers reach them (mock timers do not reach `now` and `monotonic`, which read `performance`).
 * `unrefTimers`: the timers never keep a Node process up (a server's sockets do that).
 */
export function globalClock(opts: { unrefTimers: boolean }): Clock {
  const hold = opts.unrefTimers ? unref : (t: unknown) => t;
  return {
    now: () => performance.timeOrigin + performance.now(),
    monotonic: () => performance.now(),
    setTimeout: (fn, ms, ...arg) => hold(setTimeout(fn, ms, ...arg)),
    clearTimeout: (h) => clearTimeout(h as Parameters<typeof clearTimeout>[0]),
    setInterval: (fn, ms) => hold(setInterval(fn, ms)),
    clearInterval: (h) => clearInterval(h as Parameters<typeof clearInterval>[0]),
  };
}

/** The servers' clock: the runtime's, with timers that never keep the process up. */
export const systemClock: Clock = globalClock({ unrefTimers: true });

/** Resolves after `ms` on `clock` (on systemClock the wait alone keeps no process up). Needs only its setTimeout. */
export function sleep(clock: Pick<Clock, "setTimeout">, ms: number): Promise<void> {
  return new Promise((resolve) => clock.setTimeout(() => resolve(), ms));
}
