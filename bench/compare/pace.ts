/**
 * The pace of a paced send, shared by every producer of `npm run bench` (jetgate's, the JetStream
 * floor's, Socket.IO's and the bare uWebSockets.js server): each 10 ms tick sends what is due by
 * the clock since the start, not a fixed count per tick, so a tick that ran late (a busy event
 * loop, a timer fired late) is made up at the next one. With a fixed count per tick, timers late
 * by a millisecond or two on a loaded 2-core machine cut the rate by 10-20%, and the sustained-rate
 * probes read it as the system falling short.
 */
const TICK_MS = 10;

/** How many of `rate`/s are due `elapsedMs` after the start. */
export const dueAt = (rate: number, elapsedMs: number): number => Math.floor((rate * elapsedMs) / 1000);

/**
 * Calls `send(n)` with what is due every tick for `seconds`; resolves to how many were sent. What
 * a tick sends is bounded only by what is due: a producer that cannot keep up falls behind, and
 * the count says so.
 */
export async function pace(seconds: number, rate: number, send: (n: number) => void): Promise<number> {
  const t0 = performance.now();
  const end = seconds * 1000;
  let sent = 0;
  for (;;) {
    const elapsed = performance.now() - t0;
    if (elapsed >= end) break;
    // the first tick sends one tick's worth at once, as before
    const n = Math.max(dueAt(rate, elapsed + TICK_MS), 1) - sent;
    if (n > 0) {
      send(n);
      sent += n;
    }
    const wait = TICK_MS - ((performance.now() - t0) % TICK_MS);
    await new Promise((r) => setTimeout(r, wait));
  }
  return sent;
}
