/** Time as the SDK uses it: behind an interface, so tests can drive the heartbeat and the timers by hand. */

export type Timer = ReturnType<typeof setTimeout>;

export interface Clock {
  now(): number;
  setTimeout(f: () => void, ms: number): Timer;
  clearTimeout(t: Timer | undefined): void;
  setInterval(f: () => void, ms: number): Timer;
  clearInterval(t: Timer | undefined): void;
}

/** The global timers, looked up at each call (so node:test's mock timers reach them too). */
export const systemClock: Clock = {
  now: () => Date.now(),
  setTimeout: (f, ms) => setTimeout(f, ms),
  clearTimeout: (t) => clearTimeout(t),
  setInterval: (f, ms) => setInterval(f, ms),
  clearInterval: (t) => clearInterval(t),
};

/** Resolves after `ms` on `clock`. */
export function sleep(clock: Clock, ms: number): Promise<void> {
  return new Promise((resolve) => clock.setTimeout(resolve, ms));
}
