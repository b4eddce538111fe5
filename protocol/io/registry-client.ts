/**
 * Reads and writes the shard registry on the JETGATE_REGISTRY stream (docs/design.md, "The registry").
 *
 * Every write is appended with Nats-Expected-Last-Sequence = the last record this client has
 * applied; a conflict means someone else wrote first, so the client waits until it has applied
 * that record, asks the mutation again with the new state, and retries. Stream-level optimistic
 * concurrency is decided in consensus on every NATS version, unlike KV CAS on 2.9.10.
 */
import type { NatsConnection } from "@nats-io/transport-node";
import {
  jetstream,
  jetstreamManager,
  DeliverPolicy,
  JetStreamApiCodes,
  JetStreamApiError,
  type ConsumerMessages,
  type JetStreamClient,
  type JetStreamManager,
} from "@nats-io/jetstream";
import { REGISTRY_STREAM, REGISTRY_SUBJECT } from "../subjects.js";
import {
  EMPTY_REGISTRY,
  RegistryError,
  ShardMap,
  applyRecord,
  decodeRecord,
  encodeRecord,
  type RegistryRecord,
  type RegistryState,
} from "../registry-model.js";
import { CONSUME_OPTIONS, isNotFound } from "./streams.js";

export type RegistryListener = (state: RegistryState) => void;

export interface RegistryClientOptions {
  /** Called for a record that fails validation; it is skipped. */
  onBadRecord?: (seq: number, err: unknown) => void;
  /** Called when following the stream failed; the client resumes after the last record it applied. */
  onFollowError?: (err: unknown) => void;
  /** How long `open` waits to catch up with the stream. */
  loadTimeoutMs?: number;
  /** Test-only (JETGATE_FAULT_REGISTRY_LAG_MS): each record is applied this long after it arrives. */
  lagMs?: number;
}

export class RegistryClient {
  private current: RegistryState = EMPTY_REGISTRY;
  private map = new ShardMap(EMPTY_REGISTRY);
  private readonly listeners = new Set<RegistryListener>();
  private readonly waiters: { seq: number; resolve: () => void }[] = [];
  private messages: ConsumerMessages | undefined;
  private readonly js: JetStreamClient;
  private closed = false;

  private constructor(
    private readonly nc: NatsConnection,
    private readonly opts: RegistryClientOptions,
  ) {
    this.js = jetstream(nc);
  }

  /** Loads the registry (every record, in order) and keeps following it. The stream must exist. */
  static async open(nc: NatsConnection, opts: RegistryClientOptions = {}): Promise<RegistryClient> {
    const client = new RegistryClient(nc, opts);
    await client.start();
    return client;
  }

  get state(): RegistryState {
    return this.current;
  }

  get shards(): ShardMap {
    return this.map;
  }

  onChange(listener: RegistryListener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  private async start(): Promise<void> {
    const last = await this.head();
    void this.follow();
    await this.waitFor(last, this.opts.loadTimeoutMs ?? 10_000);
  }

  private jsm: JetStreamManager | undefined;

  /** The stream seq of the newest registry record on the server. */
  private async head(): Promise<number> {
    // One manager for the client's life: creating one costs an account-info round trip.
    const jsm = (this.jsm ??= await jetstreamManager(this.nc));
    try {
      return (await jsm.streams.info(REGISTRY_STREAM)).state.last_seq;
    } catch (err) {
      if (isNotFound(err)) throw new RegistryError(`stream ${REGISTRY_STREAM} does not exist: run \`jetgate registry init\``, { cause: err });
      throw err;
    }
  }

  /**
   * Catches up with the server: resolves once every record written before this call is applied.
   * A worker calls it before acting on its epoch, so a paused process that wakes up cannot act on
   * a view older than the registry (one round trip).
   */
  async sync(timeoutMs = 5000): Promise<RegistryState> {
    await this.waitFor(await this.head(), timeoutMs);
    return this.current;
  }

  /**
   * Follows the stream for the client's life. It never rejects: a failure (a consumer that could
   * not be recreated, a dropped connection) is reported and following resumes after the last
   * record applied, so a process is never left with a frozen registry or killed by it.
   */
  private async follow(): Promise<void> {
    for (let attempt = 0; !this.closed; attempt++) {
      try {
        const from = this.current.seq;
        const consumer = await this.js.consumers.get(
          REGISTRY_STREAM,
          from === 0 ? { deliver_policy: DeliverPolicy.All } : { deliver_policy: DeliverPolicy.StartSequence, opt_start_seq: from + 1 },
        );
        this.messages = await consumer.consume(CONSUME_OPTIONS);
        if (this.closed) await this.messages.close();
        const lag = this.opts.lagMs ?? 0;
        for await (const m of this.messages) {
          attempt = 0;
          // timers of one delay fire in the order they were set: records stay in order
          if (lag > 0) setTimeout(() => this.apply(m.seq, m.data), lag);
          else this.apply(m.seq, m.data);
        }
      } catch (err) {
        if (!this.closed) this.opts.onFollowError?.(err);
      }
      if (!this.closed) await new Promise((r) => setTimeout(r, Math.min(100 * 2 ** Math.min(attempt, 5), 3000)));
    }
  }

  private apply(seq: number, data: Uint8Array): void {
    if (seq <= this.current.seq) return; // already applied (a resumed consumer may repeat)
    try {
      const record = decodeRecord(data);
      this.current = applyRecord(this.current, seq, record);
      this.map = new ShardMap(this.current);
    } catch (err) {
      // Skipped records still advance the position, so writers are not stuck behind them.
      this.current = { ...this.current, seq };
      this.opts.onBadRecord?.(seq, err);
    }
    this.settleWaiters();
    for (const l of this.listeners) l(this.current);
  }

  private settleWaiters(): void {
    for (let i = this.waiters.length - 1; i >= 0; i--) {
      const w = this.waiters[i]!;
      if (this.current.seq >= w.seq) {
        this.waiters.splice(i, 1);
        w.resolve();
      }
    }
  }

  /** Resolves once the record at `seq` (or later) has been applied. */
  waitFor(seq: number, timeoutMs = 10_000): Promise<void> {
    if (this.current.seq >= seq) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        const i = this.waiters.indexOf(waiter);
        if (i >= 0) this.waiters.splice(i, 1);
        reject(new RegistryError(`registry did not reach record ${seq} within ${timeoutMs} ms (at ${this.current.seq})`));
      }, timeoutMs);
      const waiter = {
        seq,
        resolve: () => {
          clearTimeout(timer);
          resolve();
        },
      };
      this.waiters.push(waiter);
    });
  }

  /**
   * Appends the record `mutate` builds from the current state, retrying on write conflicts with a
   * fresh state. `mutate` returns null when there is nothing to write (then null is returned).
   * Resolves after the record is acknowledged by JetStream and applied locally.
   */
  async update(
    mutate: (state: RegistryState) => RegistryRecord | null,
    { attempts = 50 }: { attempts?: number } = {},
  ): Promise<{ seq: number; state: RegistryState } | null> {
    for (let i = 0; i < attempts; i++) {
      if (this.closed) throw new RegistryError("registry client is closed");
      const base = this.current;
      const record = mutate(base);
      if (record === null) return null;
      try {
        const ack = await this.js.publish(REGISTRY_SUBJECT, encodeRecord(record), { expect: { lastSequence: base.seq } });
        await this.waitFor(ack.seq);
        return { seq: ack.seq, state: this.current };
      } catch (err) {
        if (!isWrongLastSequence(err)) throw err;
        // Someone else wrote first: wait until we have applied their record, then try again.
        await this.waitFor(base.seq + 1).catch(() => undefined);
      }
    }
    throw new RegistryError(`registry write lost ${attempts} races in a row`);
  }

  async close(): Promise<void> {
    this.closed = true;
    await this.messages?.close().catch(() => undefined);
  }
}

function isWrongLastSequence(err: unknown): boolean {
  return (
    err instanceof JetStreamApiError &&
    (err.code === JetStreamApiCodes.StreamWrongLastSequence || err.code === JetStreamApiCodes.StreamWrongLastSequenceUnknown)
  );
}
