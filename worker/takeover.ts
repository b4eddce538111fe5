/**
 * A worker's takeover of a shard (docs/registry-and-worker.md, "Takeover"): read the ack floor of
 * the shard's worker consumers (or an epoch's floor record, for a consumer lost with its NATS node)
 * and let `planTakeover` decide. An epoch an operation wrote (init,
 * `jetgate shard takeover`, split, rebuild, failover) that no worker has claimed yet is claimed: a
 * record that changes no epoch, consumed from that boundary's start. An epoch its owner released is
 * claimed too (a resume), consumed from the offset after the release. Otherwise the worker appends
 * the epoch bump. Either record is written only if the shard is still as read (optimistic
 * concurrency: of two racing workers one wins), and only after it is acknowledged does the worker
 * create this epoch's consumer `w_<epoch>` and delete the older ones. A zombie owner's fetches and
 * acks then fail, and it also stops as soon as its registry view shows the newer epoch (fencing).
 */
import type { Logger } from "pino";
import {
  bumpEpoch,
  claimEpoch,
  planTakeover,
  registryRecord,
  shardStream,
  workerConsumerName,
  type ShardState,
  type TakeoverPlan,
} from "../protocol/index.js";
import { superseded } from "./epoch-guard.js";
import type { RegistryView, ShardLog } from "./shard-ports.js";

export interface TakeoverDeps {
  shard: number;
  workerId: string;
  registry: RegistryView;
  shardLog: ShardLog;
  log: Logger;
}

/** The epoch a takeover works under, where its consumer starts, and where that epoch's numbering starts. */
export interface Taken extends TakeoverPlan {
  epoch: number;
}

/** Takes the shard over: the epoch it now works under, or why it did not take it (the runner stops). */
export async function takeShard(d: TakeoverDeps): Promise<Taken | { refused: string }> {
  // the registry's head: a release written just before the lease was let go must be seen, or
  // this would bump an epoch that is free to resume
  await d.registry.sync();
  const before = d.registry.state.shards.get(d.shard);
  if (before === undefined || before.status !== "active") return { refused: "shard is not active in the registry" };
  const streamLog = await d.shardLog.logId();
  if (streamLog !== before.log) {
    d.log.error({ shard: d.shard, stream: streamLog, registry: before.log }, "stream/registry log mismatch: refusing the shard");
    return { refused: `stream ${shardStream(d.shard)} is not log ${before.log} of the registry` };
  }
  const { floor, consumers } = await d.shardLog.ackFloor(before.epoch);
  // Claim an operation's epoch, else bump. Consume from the floor (a claim: from the boundary's
  // start); a bump's new epoch starts at or above the current boundary (a split's cut may lie
  // above the floor: what is between is processed under the parent's older epoch).
  const { mode, startOffset, boundaryStart } = planTakeover(before, floor);
  let mine: ShardState | undefined;
  const written = await d.registry.update((state) => {
    const s = state.shards.get(d.shard);
    // Someone else bumped or claimed since we looked: they own it now.
    if (s === undefined || s.epoch !== before.epoch || s.owner !== before.owner) return null;
    mine = mode !== "bump" ? claimEpoch(s, d.workerId) : bumpEpoch(s, { cause: "takeover", start_offset: boundaryStart, owner: d.workerId });
    return registryRecord("takeover", d.workerId, [mine]);
  });
  if (written === null || mine === undefined) return { refused: "lost the takeover race" };
  // The epoch of the record this worker wrote (the state may already show a later record).
  const epoch: number = mine.epoch;
  const applied = written.state.shards.get(d.shard);
  if (applied === undefined || applied.epoch < epoch || superseded(applied, epoch, d.workerId)) {
    return { refused: `takeover of epoch ${epoch} superseded or not applied` };
  }
  // Only now, under the acknowledged epoch: this epoch's consumer, then retire the older ones. A
  // resumed epoch's consumer is the releaser's: made again to start after the released offset
  // (its ack floor may lag the release by the last ack). Dying in between leaves no consumer of
  // this epoch; the next takeover's start is then bounded by the released offset (processingStart).
  const name = workerConsumerName(epoch);
  if (mode === "resume") await d.shardLog.deleteConsumer(name).catch(() => undefined);
  // the floor record first: whenever this epoch's consumer exists, so does its record, which stands
  // for the consumer if its NATS node is lost (worker consumers are R1)
  await d.shardLog.recordFloor(epoch, startOffset - 1);
  await d.shardLog.openConsumer(epoch, startOffset);
  for (const c of consumers) {
    if (c !== name) await d.shardLog.deleteConsumer(c).catch(() => undefined);
  }
  return { epoch, mode, startOffset, boundaryStart };
}
