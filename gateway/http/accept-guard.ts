/**
 * Watches the gateway's open files and closes its listener when `accept` is about to fail (and
 * spin), opening it again once files are free (the decisions: gateway/http/capacity.ts). Devices
 * past JETGATE_MAX_CONNECTIONS are refused with 503 before that (gateway/http/server.ts); what this
 * catches is the reserve running out anyway (a burst of refusals, sockets opened and left without
 * a request). Counting the open files reads /proc/self/fd, whose cost grows with the files (tens of
 * ms at 100,000): a count comes at most every 50 times its own cost (under 2% of a core), every 10
 * times while paused, and at least every 5 s. Should `accept` fail between two counts, the listener
 * spins until the next one: at most that long, and JS timers still run in between.
 */
import type { Clock, TimerHandle } from "../../protocol/index.js";
import { acceptDecision, type CapacityPlan } from "./capacity.js";

export interface AcceptGuardPorts {
  /** Files open now; undefined when they cannot be counted (the limit is reached). */
  openFiles(): number | undefined;
  /** Closes the listener: new connections are refused at once. */
  pause(): void;
  /** Listens again. */
  resume(): void;
  /** The listener was paused (true) or resumed (false), with the files open then. */
  changed(paused: boolean, open: number | undefined): void;
}

/** How often the guard looks; a count of the files goes at most every 50 times its cost (10 while paused). */
const TICK_MS = 250;
const COST_FACTOR = 50;
const PAUSED_COST_FACTOR = 10;
/** The longest between two counts, whatever they cost. */
const MAX_COUNT_GAP_MS = 5000;

export class AcceptGuard {
  private paused = false;
  private nextCount = 0;
  private timer: TimerHandle | undefined;
  /** Files counted last (for readiness and metrics). */
  lastOpen: number | undefined;

  constructor(
    private readonly plan: CapacityPlan,
    private readonly ports: AcceptGuardPorts,
    private readonly clock: Clock,
  ) {}

  get accepting(): boolean {
    return !this.paused;
  }

  start(): this {
    this.timer = this.clock.setInterval(() => this.check(), TICK_MS);
    return this;
  }

  stop(): void {
    this.clock.clearInterval(this.timer);
  }

  /** One look: counts the files when due, then pauses or resumes. */
  check(): void {
    const now = this.clock.monotonic();
    if (now < this.nextCount) return;
    const open = this.ports.openFiles();
    const cost = this.clock.monotonic() - now;
    this.lastOpen = open;
    this.nextCount = now + Math.min(MAX_COUNT_GAP_MS, Math.max(TICK_MS, cost * (this.paused ? PAUSED_COST_FACTOR : COST_FACTOR)));
    const d = acceptDecision(open, this.plan.limit, this.plan.reserve, this.paused);
    if (d === "keep") return;
    this.paused = d === "pause";
    if (this.paused) this.ports.pause();
    else this.ports.resume();
    this.ports.changed(this.paused, open);
  }
}
