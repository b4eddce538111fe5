/**
 * The worker's batch, as pure steps (no I/O): which delivered messages a batch takes and which
 * offsets it must fetch first (`planBatch`), and what it pushes once Redis has answered
 * (`pushesOf`). ShardRunner does the I/O between them.
 */
import type { Entry, Push } from "../protocol/index.js";
import type { ApplyEntryResult } from "./mailbox-script.js";

export interface BatchPlan {
  /** Indexes of the messages to process, in order; each preceded by the offsets in `holes` that come before it. */
  take: number[];
  /** Offset ranges (inclusive) the consumer skipped, keyed by the index of the message they precede. */
  holes: Map<number, [from: number, to: number]>;
  /** The message to acknowledge (AckAll): the one of the highest offset, or the last when every one is a redelivery. */
  ack: number;
  /** The last offset done once the batch is: the highest offset seen, or `lastOffset` when none is new. */
  maxOffset: number;
}

/**
 * Plans a batch of messages at `offsets` (the consumer's stream sequences, in delivery order) after
 * `lastOffset`. A redelivery of an offset already done (or earlier in the batch) is skipped. The
 * consumer reads the whole stream, so offsets come one after another: a hole means a delivery was
 * lost on the way (a NATS node dying with a pull response in flight), and with AckAll acking past
 * it would drop it for good, so it is fetched from the stream first. The ack goes to the highest
 * offset, never simply the last message: a Redis stall that outlasts the ack wait makes the server
 * send every unacknowledged message again, a batch can end with such an older one, and acking it
 * left the newer ones unacknowledged (processed again, a regression counted for nothing).
 */
export function planBatch(offsets: readonly number[], lastOffset: number): BatchPlan {
  const take: number[] = [];
  const holes = new Map<number, [number, number]>();
  let maxOffset = lastOffset;
  let ack = offsets.length - 1;
  for (let i = 0; i < offsets.length; i++) {
    const o = offsets[i]!;
    if (o <= maxOffset) continue;
    if (o > maxOffset + 1) holes.set(i, [maxOffset + 1, o - 1]);
    take.push(i);
    maxOffset = o;
    ack = i;
  }
  return { take, holes, ack, maxOffset };
}

export interface BatchItem {
  user: string;
  lane: string;
  seq: bigint;
  id: string;
  ts: number;
  b: Uint8Array<ArrayBuffer>;
}

/** The pushes of a batch's first copies, with their routes; duplicates (another offset of the same dispatch) counted, not pushed. */
export function pushesOf(
  items: readonly BatchItem[],
  results: readonly ApplyEntryResult[],
  shard: number,
  epoch: number,
): { pushes: { push: Push; routes: readonly string[] | undefined }[]; duplicates: number } {
  if (results.length !== items.length) throw new Error(`pushesOf: ${results.length} Redis results for ${items.length} entries`);
  const pushes: { push: Push; routes: readonly string[] | undefined }[] = [];
  let duplicates = 0;
  for (let i = 0; i < items.length; i++) {
    const it = items[i]!;
    const r = results[i]!;
    if (!r.first) {
      duplicates++;
      continue;
    }
    const entry: Entry = { seq: it.seq, id: it.id, lane: it.lane, prev: r.prev === null ? null : BigInt(r.prev), ts: it.ts, b: it.b };
    pushes.push({ push: { user: it.user, shard, epoch, entry, prevAll: r.prevAll === null ? null : BigInt(r.prevAll) }, routes: r.routes });
  }
  return { pushes, duplicates };
}
