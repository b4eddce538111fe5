/**
 * The ShardRunner's ports (worker/shard-ports.ts) wired to NATS and Redis. Thin on purpose: every
 * decision stays in the runner, so what is here is only the calls. The registry and the push
 * router are ports as they are (RegistryClient, PushRouter).
 */
import type { Logger } from "pino";
import type { NatsConnection } from "@nats-io/transport-node";
import { AckPolicy, DeliverPolicy, jetstream, type JetStreamClient, type JetStreamManager } from "@nats-io/jetstream";
import {
  decodeFloorRecord,
  encodeFloorRecord,
  FLOORS_STREAM,
  floorSubject,
  floorRecordEpochs,
  isWorkerConsumer,
  processingFloor,
  shardStream,
  workerConsumerName,
  type Clock,
  type FloorRecord,
  type RedisKeys,
} from "../protocol/index.js";
import { CONSUME_OPTIONS, ensureStream, floorsStreamConfig, isNotFound, logOfStream, type RedisClient, type RegistryClient } from "../protocol/io/index.js";
import { applyBatch } from "./mailbox-script.js";
import type { WorkerMetrics } from "./metrics.js";
import type { Deliveries, LogMsg, MailboxStore, PushSink, RunnerConfig, RunnerDeps, ShardLog } from "./shard-ports.js";

/** What a worker process runs its shards with (worker/main.ts builds it). */
export interface WorkerDeps {
  nc: NatsConnection;
  redis: RedisClient;
  keys: RedisKeys;
  registry: RegistryClient;
  metrics: WorkerMetrics;
  log: Logger;
  workerId: string;
  /** Where pushes go: one router for every shard of the worker, flushed after each batch's pushes. */
  pushes: PushSink;
  config: RunnerConfig;
  /** What the lease loop's ticks and durations and the runners run on (systemClock in production). */
  clock: Clock;
}

/**
 * The shard's processing floor and its worker consumers, as a takeover reads them: the one place
 * the floor is read, for a worker's takeover and for `jetgate shard takeover`. When no consumer of
 * the registry's `epoch` is listed (worker consumers are R1: one lost with its NATS node is not),
 * the newest floor record above every listed consumer's epoch stands for it (protocol/layout.ts,
 * FloorRecord).
 */
export async function readAckFloor(jsm: JetStreamManager, shard: number, epoch: number): Promise<{ floor: number; consumers: string[] }> {
  const consumers: { name: string; ack_floor: { stream_seq: number } }[] = [];
  for await (const c of jsm.consumers.list(shardStream(shard))) {
    if (isWorkerConsumer(c.name)) consumers.push(c);
  }
  const names = consumers.map((c) => c.name);
  let record: FloorRecord | undefined;
  for (const e of floorRecordEpochs(names, epoch)) if ((record = await floorRecord(jsm, shard, e)) !== undefined) break;
  return { floor: processingFloor(consumers, record), consumers: names };
}

/** The floor record of `shard` under `epoch`, from the floors stream's leader; undefined when there is none (or no stream: a deployment from before it). */
async function floorRecord(jsm: JetStreamManager, shard: number, epoch: number): Promise<FloorRecord | undefined> {
  try {
    const m = await jsm.streams.getMessage(FLOORS_STREAM, { last_by_subj: floorSubject(shard, epoch) });
    if (m === null) return undefined;
    const r = decodeFloorRecord(m.data);
    return r.epoch === epoch ? r : undefined;
  } catch (err) {
    if (isNotFound(err)) return undefined;
    throw err;
  }
}

/** A shard stream `MBX_<shard>` and its worker consumers, over JetStream. */
export class NatsShardLog implements ShardLog {
  private readonly stream: string;
  private readonly js: JetStreamClient;

  constructor(
    nc: NatsConnection,
    private readonly jsm: JetStreamManager,
    private readonly shard: number,
    private readonly ackWaitS: number,
    /** The floors stream's replicas, made with the first record if it is not there (a deployment from before it). */
    private readonly replicas: number,
  ) {
    this.stream = shardStream(shard);
    this.js = jetstream(nc);
  }

  async logId(): Promise<string | undefined> {
    return logOfStream(await this.jsm.streams.info(this.stream));
  }

  ackFloor(epoch: number): Promise<{ floor: number; consumers: string[] }> {
    return readAckFloor(this.jsm, this.shard, epoch);
  }

  async recordFloor(epoch: number, offset: number): Promise<void> {
    const record = () => this.js.publish(floorSubject(this.shard, epoch), encodeFloorRecord({ epoch, offset }));
    try {
      await record();
    } catch (err) {
      // no stream answered: made here once (what registry init makes), then written again
      if ((await ensureStream(this.jsm, floorsStreamConfig(this.replicas))).created) await record();
      else throw err;
    }
  }

  async openConsumer(epoch: number, startOffset: number): Promise<void> {
    await this.jsm.consumers.add(this.stream, {
      durable_name: workerConsumerName(epoch),
      ack_policy: AckPolicy.All,
      deliver_policy: DeliverPolicy.StartSequence,
      opt_start_seq: startOffset,
      ack_wait: this.ackWaitS * 1_000_000_000,
      max_ack_pending: 100_000,
      // R1 whatever the stream's replicas: an R3 consumer replicates every delivery through raft
      // (on an R3 cluster a third of nats-server's CPU per entry, bench/RESULTS.md). What it would
      // keep through the loss of its node, the ack floor, the worker records itself (recordFloor).
      num_replicas: 1,
    });
  }

  async deleteConsumer(name: string): Promise<void> {
    await this.jsm.consumers.delete(this.stream, name);
  }

  async consume(epoch: number, maxMessages: number): Promise<Deliveries> {
    const consumer = await this.js.consumers.get(this.stream, workerConsumerName(epoch));
    return consumer.consume({ ...CONSUME_OPTIONS, max_messages: maxMessages, abort_on_missing_resource: true });
  }

  async firstOffset(): Promise<number> {
    return (await this.jsm.streams.info(this.stream)).state.first_seq;
  }

  /** From the stream's leader. */
  async read(offset: number): Promise<LogMsg | null> {
    const sm = await this.jsm.streams.getMessage(this.stream, { seq: offset });
    return sm === null ? null : { subject: sm.subject, seq: sm.seq, data: sm.data, headers: sm.header };
  }

  async forward(subject: string, data: Uint8Array, msgId: string | undefined): Promise<void> {
    await this.js.publish(subject, data, msgId ? { msgID: msgId } : {});
  }

  async progress(epoch: number): Promise<{ pending: number; delivered: number }> {
    const info = await this.jsm.consumers.info(this.stream, workerConsumerName(epoch));
    return { pending: info.num_pending, delivered: info.delivered.stream_seq };
  }
}

/** The Redis step as a port: applyBatch over the worker's client. */
export function redisMailboxStore(redis: RedisClient, keys: RedisKeys): MailboxStore {
  return { apply: (shared, entries) => applyBatch(redis, keys, shared, entries) };
}

/** The ports of one shard's runner; `jsm` is the worker's JetStream manager. */
export function shardRunnerDeps(d: WorkerDeps, jsm: JetStreamManager, shard: number): RunnerDeps {
  return {
    shardLog: new NatsShardLog(d.nc, jsm, shard, d.config.JETGATE_WORKER_ACK_WAIT_S, d.config.JETGATE_STREAM_REPLICAS),
    mailboxes: redisMailboxStore(d.redis, d.keys),
    pushes: d.pushes,
    registry: d.registry,
    metrics: d.metrics,
    log: d.log,
    workerId: d.workerId,
    config: d.config,
    clock: d.clock,
  };
}
