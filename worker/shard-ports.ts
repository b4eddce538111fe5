/**
 * What a ShardRunner needs from the world, as four ports: the shard's stream (ShardLog), the Redis
 * step (MailboxStore), the gateways (PushSink) and the registry (RegistryView). The runner decides;
 * the ports only carry. worker/shard-adapters.ts wires them to NATS and Redis, and
 * test/unit/shard-runner.test.ts to memory.
 */
import type { Logger } from "pino";
import type { Clock, Config, Push, RegistryRecord, RegistryState } from "../protocol/index.js";
import type { ApplyEntryResult, BatchEntry, BatchShared } from "./mailbox-script.js";
import type { WorkerMetrics } from "./metrics.js";

/** A message of the shard stream: delivered by the epoch's consumer, or read by offset to fill a hole. */
export interface LogMsg {
  subject: string;
  /** Its offset in the shard's log (the stream sequence). */
  seq: number;
  data: Uint8Array;
  /** Read only to forward the entry with its Nats-Msg-Id. */
  headers?: { get(key: string): string };
}

/** A message the consumer delivered; `ack` acknowledges it and every offset below it (AckAll). */
export interface DeliveredMsg extends LogMsg {
  ack(): void;
  /** When the stream stored it (JetStream's delivery info; absent in memory): the worker_fetch_wait stage. */
  readonly info?: { readonly timestampNanos: number };
}

/** The consumer's deliveries, in order, until `stop` (or until the consumer ends). */
export interface Deliveries extends AsyncIterable<DeliveredMsg> {
  stop(): void;
}

/** The shard's stream and its worker consumers (`w_<epoch>`). */
export interface ShardLog {
  /** The log id the stream says it holds; undefined for a stream jetgate did not make. */
  logId(): Promise<string | undefined>;
  /**
   * The names of the shard's worker consumers and its processing floor (`processingFloor`), with
   * the floor record of an epoch up to `epoch` (the registry's) newer than every consumer listed.
   */
  ackFloor(epoch: number): Promise<{ floor: number; consumers: string[] }>;
  /** Records how far `epoch`'s consumer got (FloorRecord); resolves once it is stored. */
  recordFloor(epoch: number, offset: number): Promise<void>;
  /** Makes `epoch`'s consumer: AckAll, delivering from `startOffset`. */
  openConsumer(epoch: number, startOffset: number): Promise<void>;
  deleteConsumer(name: string): Promise<void>;
  /** Deliveries of `epoch`'s consumer, at most `maxMessages` in flight. */
  consume(epoch: number, maxMessages: number): Promise<Deliveries>;
  /** The lowest offset the stream still holds (retention removes older ones). */
  firstOffset(): Promise<number>;
  /** The message at `offset`; null when the stream does not hold it. */
  read(offset: number): Promise<LogMsg | null>;
  /** Appends an entry to another shard's stream (a split's forward), keeping its Nats-Msg-Id. */
  forward(subject: string, data: Uint8Array, msgId: string | undefined): Promise<void>;
  /** `epoch`'s consumer: entries not yet delivered, and the highest offset delivered. */
  progress(epoch: number): Promise<{ pending: number; delivered: number }>;
}

/** The Redis step of a batch: one script call per Redis node (worker/mailbox-script.ts). Results in entry order. */
export interface MailboxStore {
  apply(shared: BatchShared, entries: readonly BatchEntry[]): Promise<ApplyEntryResult[]>;
}

/** Where pushes go (worker/push-router.ts): queued by `route`, published by `flush`. */
export interface PushSink {
  route(push: Push, routes: readonly string[] | undefined): void;
  flush(): void;
}

/** The registry as this process follows it (protocol/io/registry-client.ts). */
export interface RegistryView {
  /** Every record applied locally so far. */
  readonly state: RegistryState;
  /** Which shard owns a user now (a split's forward). */
  readonly shards: { shardOf(user: string): number | undefined };
  /** Resolves once every record on the server is applied locally. */
  sync(): Promise<unknown>;
  onChange(listener: (state: RegistryState) => void): () => void;
  /**
   * Appends the record `mutate` builds from the current state (null: nothing to write, then null),
   * retried on a conflict with the state that won; resolves once it is acknowledged and applied.
   */
  update(mutate: (state: RegistryState) => RegistryRecord | null): Promise<{ state: RegistryState } | null>;
}

export type RunnerConfig = Pick<
  Config,
  | "JETGATE_WORKER_BATCH"
  | "JETGATE_WORKER_ACK_WAIT_S"
  | "JETGATE_HOT_CACHE_MAXLEN"
  | "JETGATE_HOT_CACHE_TTL_S"
  | "JETGATE_DEDUP_TTL_S"
  | "JETGATE_STREAM_MAX_AGE_S"
  | "JETGATE_STREAM_REPLICAS"
  | "JETGATE_FAULT_EXIT_AFTER"
>;

/** A runner's ports (worker/shard-adapters.ts wires them to NATS and Redis) and its process's own parts. */
export interface RunnerDeps {
  shardLog: ShardLog;
  mailboxes: MailboxStore;
  /** Where pushes go: one sink for every shard of the worker, flushed after each batch's pushes. */
  pushes: PushSink;
  registry: RegistryView;
  metrics: WorkerMetrics;
  log: Logger;
  workerId: string;
  config: RunnerConfig;
  /** What the runner's waits (the epoch guard's, the Redis step's retries), freshness and stage times run on (default: systemClock); tests step a manual one. */
  clock?: Clock;
}
