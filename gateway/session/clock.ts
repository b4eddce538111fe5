/**
 * A session's deadlines on one timer: the AUTH deadline, the token's expiry and the next ACK
 * flush. Each is a time (ms since the epoch, Infinity when unset); one timeout is armed for the
 * earliest, and moved when that changes. It replaced a timer per kind and the hub's sweep over
 * every session each second: an expiry is told at its time, not up to a second late, and a
 * session's deadlines are in one place. An idle session's one pending deadline is its token's
 * expiry, far away: the gateway's TimerPort (coarse-timers.ts) keeps such delays on a shared wheel,
 * not a Node timer each, so the clock costs an idle session little more than the sweep did.
 */
import type { TimerPort } from "../ports.js";

export type Deadline = "auth" | "expiry" | "ack";

/** Who is told of a passed deadline (the session itself: no closure per session). */
export interface DeadlineOwner {
  /** Called once per deadline that passed, after it was unset (it may set it again). */
  onDeadline(kind: Deadline): void;
}

/** Node's longest timeout (about 24.8 days): a later deadline is armed in steps (a longer delay fires at once). */
export const MAX_DELAY_MS = 2 ** 31 - 1;
/** The order deadlines due at once are told in. */
const KINDS: readonly Deadline[] = ["auth", "expiry", "ack"];

function fire(c: SessionClock): void {
  c.fire();
}

export class SessionClock {
  private auth = Infinity;
  private expiry = Infinity;
  private ack = Infinity;
  private handle: unknown;
  /** The deadline the timer is armed for (Infinity: none armed). */
  private armedFor = Infinity;
  private firing = false;

  constructor(
    private readonly owner: DeadlineOwner,
    private readonly timers: TimerPort,
  ) {}

  get now(): number {
    return this.timers.now();
  }

  /** Sets or moves the deadline `kind` to `at` (ms since the epoch). */
  set(kind: Deadline, at: number): void {
    this[kind] = at;
    this.arm();
  }

  clear(kind: Deadline): void {
    if (this[kind] === Infinity) return;
    this[kind] = Infinity;
    this.arm();
  }

  isSet(kind: Deadline): boolean {
    return this[kind] !== Infinity;
  }

  /** Unsets every deadline and the timer (the session closed). */
  stop(): void {
    this.auth = this.expiry = this.ack = Infinity;
    this.arm();
  }

  /** The timer fired: tells each deadline that passed, then arms for the next (a timer may fire a little early). */
  fire(): void {
    this.handle = undefined;
    this.armedFor = Infinity;
    this.firing = true;
    try {
      for (const kind of KINDS) {
        if (this[kind] > this.timers.now()) continue;
        this[kind] = Infinity;
        this.owner.onDeadline(kind);
      }
    } finally {
      this.firing = false;
      this.arm();
    }
  }

  private arm(): void {
    if (this.firing) return; // fire() arms once the deadlines it tells are done
    const next = Math.min(this.auth, this.expiry, this.ack);
    if (next === this.armedFor) return;
    if (this.handle !== undefined) this.timers.clearTimeout(this.handle);
    this.handle = undefined;
    this.armedFor = next;
    if (next === Infinity) return;
    const delay = Math.min(next - this.timers.now(), MAX_DELAY_MS);
    this.handle = this.timers.setTimeout(fire, Math.max(delay, 1), this);
  }
}
