/**
 * What the hub does with a live push, by its shard's epoch in this gateway's registry view: the
 * one home of the stale-epoch rule (the hub decides by it; the session tests run the real hub).
 */
import type { Push, RegistryState } from "../../protocol/index.js";

/**
 * - `deliver`: the view's epoch for the shard;
 * - `stale`: an older epoch, a fenced (zombie) worker's: dropped;
 * - `hold`: a shard or an epoch the view has not seen yet (the worker recorded it, and the record
 *   is on its way here): held until the view has it.
 */
export type PushVerdict = "deliver" | "stale" | "hold";

export function pushVerdict(state: RegistryState, push: Pick<Push, "shard" | "epoch">): PushVerdict {
  const shard = state.shards.get(push.shard);
  if (shard === undefined || push.epoch > shard.epoch) return "hold";
  return push.epoch < shard.epoch ? "stale" : "deliver";
}
