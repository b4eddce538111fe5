/**
 * What the Dispatcher sends as a user's next unit: the first queued entry alone, or an atomic batch
 * of the entries at the head of the queue (docs/registry-and-worker.md, "Ordering"). Pure.
 */

/** Most entry bytes in one atomic batch: nats-server stages a batch until its commit. */
export const MAX_BATCH_BYTES = 1024 * 1024;

/** What the decision needs of a queued entry. */
export interface QueuedEntry {
  shard: number;
  data: Uint8Array;
  /** Sent alone from now on: it was in a batch that failed. */
  solo: boolean;
}

export interface BatchLimits {
  /** Fewest entries worth a batch: fewer go one at a time. */
  minBatch: number;
  maxBatch: number;
  maxInFlight: number;
  maxInFlightBytes: number;
  maxBatchesPerShard: number;
}

/** What the Dispatcher knows of the head entry's shard now. */
export interface ShardBatching {
  /** The stream refused atomic publish. */
  atomicOff: boolean;
  /** This Dispatcher's batches in flight to it. */
  open: number;
}

/**
 * How many entries at the head of a user's `queue` (non-empty) go out as its next unit: 1 alone;
 * more, as one atomic batch, when at least `minBatch` consecutive ones of the head's shard fit
 * (none of them in a failed batch before, within `maxBatch`, the in-flight window and
 * MAX_BATCH_BYTES). `bytes`: the unit's entry bytes.
 */
export function nextUnit(queue: readonly QueuedEntry[], limits: BatchLimits, shard: ShardBatching): { n: number; bytes: number } {
  const head = queue[0]!;
  const alone = { n: 1, bytes: head.data.byteLength };
  if (queue.length < limits.minBatch || head.solo || shard.atomicOff || shard.open >= limits.maxBatchesPerShard) return alone;
  const limit = Math.min(limits.maxBatch, limits.maxInFlight);
  const maxBytes = Math.min(limits.maxInFlightBytes, MAX_BATCH_BYTES);
  let n = 1;
  let bytes = head.data.byteLength;
  for (; n < queue.length && n < limit; n++) {
    const j = queue[n]!;
    if (j.shard !== head.shard || j.solo || bytes + j.data.byteLength > maxBytes) break;
    bytes += j.data.byteLength;
  }
  return n < limits.minBatch ? alone : { n, bytes };
}
