/**
 * Runs one owned shard: takeover (claim, resume or epoch bump: worker/takeover.ts), then ordered
 * consumption in batches (worker/shard-pump.ts feeds worker/shard-batch.ts), fenced as soon as the
 * registry shows a newer epoch (worker/epoch-guard.ts), and on a planned stop the release of its
 * epoch. It talks to the world through four ports (worker/shard-ports.ts): the shard's log, the
 * Redis step, the pushes and the registry.
 *
 * Release (a planned stop: SIGTERM, rebalancing): stop consuming, finish the batch in hand, then
 * record that the epoch was given back at the last offset done. Nothing of this runner can be
 * pushed after that record, so the next owner needs no fence: same epoch, same numbering. A release
 * that cannot be written (NATS away, or a fence came first) leaves the epoch claimed: the next owner
 * bumps it, as after a crash.
 */
import type { TakeoverPlan } from "../protocol/index.js";
import { EpochGuard } from "./epoch-guard.js";
import { ShardBatches } from "./shard-batch.js";
import type { Deliveries, RunnerDeps } from "./shard-ports.js";
import { pump } from "./shard-pump.js";
import { writeRelease, type ReleaseOutcome, type Stopped } from "./release.js";
import { takeShard } from "./takeover.js";

export type RunnerState =
  | { type: "starting" }
  | { type: "running"; epoch: number }
  | { type: "stopped"; reason: string };

const TAKEN: Record<TakeoverPlan["mode"], string> = {
  claim: "shard taken over (claimed the epoch)",
  resume: "shard taken over (resumed a released epoch: no epoch spent)",
  bump: "shard taken over (a new epoch fences the previous owner)",
};

export class ShardRunner {
  private stateValue: RunnerState = { type: "starting" };
  private deliveries: Deliveries | undefined;
  private batches: ShardBatches | undefined;
  private loop: Promise<void> = Promise.resolve();
  /** The takeover in hand: a stop waits for it, so a runner stopped meanwhile never starts consuming. */
  private starting: Promise<void> = Promise.resolve();
  private stopRequested = false;
  private readonly label: { shard: string };
  private unsubscribe: (() => void) | undefined;

  constructor(
    readonly shard: number,
    private readonly d: RunnerDeps,
  ) {
    this.label = { shard: String(shard) };
  }

  get state(): RunnerState {
    return this.stateValue;
  }

  /** The last log offset this runner has done. */
  get offset(): number {
    return this.batches?.offset ?? 0;
  }

  /** The epoch this runner works under, once running. */
  get epoch(): number | undefined {
    return this.stateValue.type === "running" ? this.stateValue.epoch : undefined;
  }

  /** Takes the shard over and starts consuming; resolves once running (or stopped on failure). */
  start(): Promise<void> {
    this.starting = this.begin();
    return this.starting;
  }

  private async begin(): Promise<void> {
    const d = this.d;
    try {
      const taken = await takeShard({ shard: this.shard, workerId: d.workerId, registry: d.registry, shardLog: d.shardLog, log: d.log });
      if ("refused" in taken) {
        this.stateValue = { type: "stopped", reason: taken.refused };
        return;
      }
      const { epoch, startOffset, mode } = taken;
      const guard = new EpochGuard({
        shard: this.shard,
        epoch,
        workerId: d.workerId,
        registry: d.registry,
        log: d.log,
        running: () => this.stateValue.type === "running" && this.stateValue.epoch === epoch,
        fence: (newEpoch) => this.fence(newEpoch),
        clock: d.clock,
      });
      this.batches = new ShardBatches({ ...d, shard: this.shard }, guard, taken);
      this.stateValue = { type: "running", epoch };
      d.metrics.epoch.set(this.label, epoch);
      d.metrics.takeovers.inc({ ...this.label, mode });
      // stopped while taking over (a rebalancing, a SIGTERM): the epoch is this runner's, nothing
      // processed under it; the stop (or release) that is waiting ends it here
      if (this.stopRequested) return;
      this.unsubscribe = guard.watch();
      d.log.info({ shard: this.shard, epoch, startOffset, mode }, TAKEN[mode]);
      this.loop = this.consume(epoch, this.batches);
    } catch (err) {
      d.log.error({ shard: this.shard, err }, "takeover failed");
      this.stateValue = { type: "stopped", reason: `takeover failed: ${(err as Error).message}` };
    }
  }

  private async consume(epoch: number, batches: ShardBatches): Promise<void> {
    try {
      this.deliveries = await this.d.shardLog.consume(epoch, this.d.config.JETGATE_WORKER_BATCH * 2);
      if (this.stateValue.type !== "running") return this.deliveries.stop();
      await pump(this.deliveries, this.d.config.JETGATE_WORKER_BATCH, {
        running: () => this.stateValue.type === "running",
        prepare: (batch) => batches.prepare(batch),
        emit: (prepared) => batches.emit(prepared),
        ended: () => this.halt(this.stateValue.type === "stopped" ? this.stateValue.reason : "consumer ended"),
        error: (msg, err) => this.d.log.error({ shard: this.shard, err }, msg),
      });
    } catch (err) {
      this.d.log.error({ shard: this.shard, err }, "consuming failed");
      this.halt(`consuming failed: ${(err as Error).message}`);
    }
  }

  private fence(newEpoch: number): void {
    if (this.stateValue.type !== "running") return;
    this.d.metrics.fenced.inc(this.label);
    this.d.log.warn({ shard: this.shard, epoch: this.stateValue.epoch, newEpoch }, "fenced by a newer epoch: stopping the shard");
    this.halt(`fenced by epoch ${newEpoch}`);
  }

  private halt(reason: string): void {
    if (this.stateValue.type === "stopped") return;
    this.stateValue = { type: "stopped", reason };
    this.unsubscribe?.();
    this.deliveries?.stop();
  }

  /** Stops after the takeover and the batch in hand; resolves when the loop has ended. */
  async stop(reason: string): Promise<void> {
    this.stopRequested = true;
    await this.starting;
    this.halt(reason);
    await this.loop;
  }

  /** Stops after the takeover and the batch in hand, for a release: the epoch it worked under and the last offset done. */
  async stopForRelease(reason: string): Promise<Stopped> {
    this.stopRequested = true;
    await this.starting;
    const epoch = this.epoch;
    await this.stop(reason);
    return { shard: this.shard, epoch, offset: this.offset };
  }

  /**
   * A planned stop: stops after the batch in hand, then records that this runner's epoch is given
   * back at the last offset done, so the next owner resumes it without a new epoch. `released`
   * once the record is acknowledged; `fenced` when the registry no longer shows this runner as
   * the epoch's owner; `failed` when the record could not be written within `timeoutMs` (NATS
   * away): the epoch stays claimed and the next owner bumps it. Either way nothing more is pushed.
   * A worker giving back several shards at once writes one record for all (worker/release.ts).
   */
  async release(reason: string, timeoutMs: number): Promise<ReleaseOutcome> {
    const stopped = await this.stopForRelease(reason);
    return (await writeRelease(this.d.registry, this.d.workerId, [stopped], timeoutMs)).get(this.shard)!;
  }

  /**
   * Entries of the shard stream this runner has not finished: not yet delivered to its consumer,
   * or delivered and still waiting (for Redis, say). Counting only the undelivered ones read 0
   * through the first half minute of a Redis that refused writes: the consumer had delivered a
   * batch's worth, and stopped delivering, long before.
   */
  async lag(): Promise<number | undefined> {
    const epoch = this.epoch;
    if (epoch === undefined) return undefined;
    const p = await this.d.shardLog.progress(epoch);
    return p.pending + Math.max(0, p.delivered - this.offset);
  }
}
