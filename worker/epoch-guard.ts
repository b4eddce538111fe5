/**
 * Fencing, in one place: whether the registry still lets a runner work under its epoch. Checked
 * whenever the registry changes, before each batch and between Redis retries (`holds`, on the
 * state applied locally), and against the registry's head before anything leaves the process
 * (`confirm`). The takeover checks its own record with `superseded` too.
 */
import type { Logger } from "pino";
import { backoffCeiling, sleep, systemClock, type Clock, type RegistryState, type ShardState } from "../protocol/index.js";
import type { RegistryView } from "./shard-ports.js";

/** Retries of Redis and of the registry while they are away: 100 ms doubling to 2 s. */
export const RETRY_BACKOFF = { baseMs: 100, capMs: 2000 };
/** How long a read of the registry head confirms the epoch for (see EpochGuard.confirm). */
const CONFIRM_FRESH_MS = 50;

/**
 * True when the registry's view of the shard no longer lets `worker` work under `epoch`: a newer
 * epoch, or (never written by a correct writer: applyRecord refuses it) the same epoch owned by
 * someone else.
 */
export function superseded(cur: ShardState, epoch: number, worker: string): boolean {
  return cur.epoch > epoch || (cur.epoch === epoch && cur.owner !== worker);
}

export interface GuardDeps {
  shard: number;
  epoch: number;
  workerId: string;
  registry: RegistryView;
  log: Logger;
  /** Whether the runner still runs under `epoch`. */
  running(): boolean;
  /** The registry shows `newEpoch` (or another owner): the runner stops. */
  fence(newEpoch: number): void;
  /** The retries' waits and the confirmation's freshness (default: systemClock); tests step a manual one. */
  clock?: Clock;
}

export class EpochGuard {
  /** When (the clock's monotonic time) the registry head was last read and still showed this epoch. */
  private confirmedAt = -Infinity;
  private readonly clock: Clock;

  constructor(private readonly d: GuardDeps) {
    this.clock = d.clock ?? systemClock;
  }

  get epoch(): number {
    return this.d.epoch;
  }

  /** Fences the runner as soon as the registry, as applied locally, supersedes its epoch. */
  watch(): () => void {
    return this.d.registry.onChange((state) => void this.check(state));
  }

  /** True while the runner runs and the registry applied locally still shows its epoch; fences it otherwise. */
  holds(): boolean {
    return this.check(this.d.registry.state);
  }

  private check(state: RegistryState): boolean {
    if (!this.d.running()) return false;
    const s = state.shards.get(this.d.shard);
    if (s !== undefined && superseded(s, this.d.epoch, this.d.workerId)) {
      this.d.fence(s.epoch);
      return false;
    }
    return true;
  }

  /**
   * True once the registry, read up to its head, still shows the epoch; retried while NATS is away.
   * A confirmation younger than CONFIRM_FRESH_MS (monotonic clock, which also runs while the
   * process is stopped) stands for the next batches: a worker woken from SIGSTOP, or stalled for
   * any other reason, always reads the head again before it pushes.
   */
  async confirm(): Promise<boolean> {
    if (this.clock.monotonic() - this.confirmedAt < CONFIRM_FRESH_MS) return this.holds();
    for (let attempt = 0; ; attempt++) {
      if (!this.holds()) return false;
      try {
        const asked = this.clock.monotonic();
        await this.d.registry.sync();
        this.confirmedAt = asked;
        return this.holds();
      } catch (err) {
        if (attempt % 10 === 0) this.d.log.warn({ shard: this.d.shard, err: (err as Error).message }, "cannot confirm the epoch; retrying");
        await sleep(this.clock, backoffCeiling(attempt, RETRY_BACKOFF));
      }
    }
  }
}
