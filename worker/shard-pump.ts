/**
 * From the consumer's deliveries to batches. A reader moves deliveries into a bounded queue; the
 * processor takes everything queued (up to a batch) as one batch and never waits to fill one, so a
 * live entry's Redis step starts as soon as the batch before it is through its own. The reader
 * pauses while the queue holds two batches.
 */
import type { DeliveredMsg, Deliveries } from "./shard-ports.js";

/** The queue between the reader and the processor. */
export class BatchQueue<T> {
  private readonly items: T[] = [];
  /** Resolves the processor waiting for an item. */
  private wake: (() => void) | undefined;
  /** Resolves the reader waiting for room. */
  private room: (() => void) | undefined;
  private done = false;
  private closed = false;
  private readonly reader: Promise<void>;

  constructor(
    source: AsyncIterable<T>,
    private readonly limit: number,
    onError: (err: unknown) => void,
  ) {
    this.reader = this.read(source, onError);
  }

  private async read(source: AsyncIterable<T>, onError: (err: unknown) => void): Promise<void> {
    try {
      for await (const m of source) {
        this.items.push(m);
        this.wake?.();
        if (this.items.length >= this.limit && !this.closed) await new Promise<void>((r) => (this.room = r));
      }
    } catch (err) {
      onError(err);
    } finally {
      this.done = true;
      this.wake?.();
    }
  }

  /** Everything queued, up to `max`, once there is something; undefined once the source ended and nothing is left. */
  async take(max: number): Promise<T[] | undefined> {
    while (this.items.length === 0) {
      if (this.done) return undefined;
      await new Promise<void>((r) => (this.wake = r));
      this.wake = undefined;
    }
    const batch = this.items.splice(0, max);
    this.room?.();
    this.room = undefined;
    return batch;
  }

  /**
   * Lets a paused reader go on and waits for it to end (stop the source first). A stopped NATS
   * consumer still yields the rest of the chunk in hand: the reader no longer pauses for those
   * (nothing takes them), or it would wait for room forever and the stop with it.
   */
  async close(): Promise<void> {
    this.closed = true;
    this.room?.();
    await this.reader;
  }
}

export interface PumpHooks<P> {
  /** Whether the runner still runs; checked before each batch. */
  running(): boolean;
  /** A batch's work up to what leaves the process (the Redis step); undefined when the runner must stop. */
  prepare(batch: DeliveredMsg[]): Promise<P | undefined>;
  /** What leaves the process (the confirmation, pushes, ack); false when the runner must stop. */
  emit(prepared: P): Promise<boolean>;
  /** The loop ended (the runner stopped, a batch failed, the consumer ended): stop the deliveries. */
  ended(): void;
  error(msg: string, err: unknown): void;
}

/**
 * Runs batches of `deliveries` through `hooks` until the runner stops; resolves once the reader has
 * ended. Two batches overlap: the next is prepared (its Redis step) while the last is emitted. Emits
 * run one at a time, in batch order, so pushes and acks keep the offsets' order, and a batch is
 * emitted only after the one before it was: a fence or a failure that stops one stops every batch
 * behind it.
 */
export async function pump<P>(deliveries: Deliveries, batchSize: number, hooks: PumpHooks<P>): Promise<void> {
  const queue = new BatchQueue(deliveries, batchSize * 2, (err) => hooks.error("consume failed", err));
  const emit = (p: P) =>
    hooks.emit(p).catch((err: unknown) => {
      hooks.error("batch failed", err);
      return false;
    });
  let emitting: Promise<boolean> = Promise.resolve(true);
  while (hooks.running()) {
    const batch = await queue.take(batchSize);
    if (batch === undefined) break;
    let prepared: P | undefined;
    try {
      prepared = await hooks.prepare(batch);
    } catch (err) {
      hooks.error("batch failed", err);
    }
    if (!(await emitting) || prepared === undefined) break;
    emitting = emit(prepared);
  }
  await emitting;
  hooks.ended();
  await queue.close();
}
