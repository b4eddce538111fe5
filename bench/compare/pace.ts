import { createInterface } from "node:readline";

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

/** A producer that emits to users by their index (`u<i>`), and can wait until what it emitted is taken. */
export interface Emitter {
  emit(user: number): void;
  /** Resolves once at most `limit` entries are still on their way (0: all of them). */
  settle(limit?: number): Promise<unknown>;
  /** What an unpaced send leaves on its way before it waits (0: it waits for all, every 500). */
  maxPending: number;
}

/**
 * The command loop of a producer process that is not jetgate's (Socket.IO's, Centrifugo's), JSON
 * lines on stdin, one answer each: {"cmd":"send","seconds":S,"users":N,"rate"?:R} -> {"sent":N}
 * (random users, as fast as they go or paced); {"cmd":"each","from":A,"to":B,"perUser":K} ->
 * {"sent":N} (K entries to each of uA..u(B-1)); {"cmd":"exit"}.
 */
export async function serveProducer(e: Emitter): Promise<void> {
  const answer = (sent: number) => process.stdout.write(JSON.stringify({ sent }) + "\n");
  for await (const line of createInterface({ input: process.stdin })) {
    const cmd = JSON.parse(line) as { cmd: string; seconds?: number; users?: number; rate?: number; perUser?: number; from?: number; to?: number };
    if (cmd.cmd === "send") {
      const until = performance.now() + (cmd.seconds ?? 10) * 1000;
      let sent = 0;
      const pick = () => Math.floor(Math.random() * cmd.users!);
      if (cmd.rate === undefined) {
        while (performance.now() < until) {
          for (let i = 0; i < 500; i++) e.emit(pick());
          sent += 500;
          await e.settle(e.maxPending);
        }
      } else {
        sent = await pace(cmd.seconds ?? 10, cmd.rate, (n) => {
          for (let i = 0; i < n; i++) e.emit(pick());
        });
      }
      await e.settle();
      answer(sent);
    } else if (cmd.cmd === "each") {
      let sent = 0;
      for (let k = 0; k < cmd.perUser!; k++) {
        for (let u = cmd.from!; u < cmd.to!; u++) {
          e.emit(u);
          if (++sent % 500 === 0) await e.settle(e.maxPending);
        }
      }
      await e.settle();
      answer(sent);
    } else if (cmd.cmd === "exit") process.exit(0);
  }
}
