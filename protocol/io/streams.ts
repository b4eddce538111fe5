/**
 * JetStream streams of jetgate (docs/design.md, "Epochs and logs": a shard stream's log) and their settings, in one place.
 *
 * Each shard stream records its log id (stream generation) in its description, so a worker can
 * tell the stream the registry means from one recreated behind its back.
 */
import { randomBytes } from "node:crypto";
import { nanos } from "@nats-io/transport-node";
import {
  DiscardPolicy,
  JetStreamApiCodes,
  JetStreamApiError,
  RetentionPolicy,
  StorageType,
  type JetStreamManager,
  type StreamConfig,
  type StreamInfo,
} from "@nats-io/jetstream";
import type { Config } from "../config.js";
import { FLOORS_STREAM, FLOORS_SUBJECTS, INGRESS_STREAM, INGRESS_SUBJECTS, REGISTRY_STREAM, REGISTRY_SUBJECT, shardStream, shardSubjects } from "../subjects.js";

export type StreamSettings = Pick<
  Config,
  "JETGATE_STREAM_REPLICAS" | "JETGATE_STREAM_MAX_AGE_S" | "JETGATE_STREAM_MAX_BYTES" | "JETGATE_DUPLICATE_WINDOW_S"
>;

/** A fresh stream generation id. */
export function newLogId(): string {
  return randomBytes(9).toString("base64url");
}

const LOG_PREFIX = "jetgate log ";

export function logOfStream(info: StreamInfo): string | undefined {
  const d = info.config.description;
  return d?.startsWith(LOG_PREFIX) ? d.slice(LOG_PREFIX.length) : undefined;
}

export function shardStreamConfig(shard: number, log: string, s: StreamSettings): Partial<StreamConfig> & { name: string } {
  return {
    name: shardStream(shard),
    description: `${LOG_PREFIX}${log}`,
    subjects: [shardSubjects(shard)],
    storage: StorageType.File,
    retention: RetentionPolicy.Limits,
    discard: DiscardPolicy.Old,
    // Retention by age and bytes only: a per-subject limit would break the shard-wide trim watermark.
    max_age: nanos(s.JETGATE_STREAM_MAX_AGE_S * 1000),
    max_bytes: s.JETGATE_STREAM_MAX_BYTES,
    duplicate_window: nanos(s.JETGATE_DUPLICATE_WINDOW_S * 1000),
    num_replicas: s.JETGATE_STREAM_REPLICAS,
    allow_direct: true,
    // the Dispatcher's atomic batches: a user's queued entries appended all or none, in order
    allow_atomic: true,
  };
}

export function ingressStreamConfig(s: StreamSettings): Partial<StreamConfig> & { name: string } {
  return {
    name: INGRESS_STREAM,
    subjects: [INGRESS_SUBJECTS],
    storage: StorageType.File,
    retention: RetentionPolicy.Limits,
    discard: DiscardPolicy.Old,
    max_age: nanos(s.JETGATE_STREAM_MAX_AGE_S * 1000),
    duplicate_window: nanos(s.JETGATE_DUPLICATE_WINDOW_S * 1000),
    num_replicas: s.JETGATE_STREAM_REPLICAS,
  };
}

export function registryStreamConfig(replicas: number): Partial<StreamConfig> & { name: string } {
  return {
    name: REGISTRY_STREAM,
    subjects: [REGISTRY_SUBJECT],
    storage: StorageType.File,
    retention: RetentionPolicy.Limits,
    num_replicas: replicas,
    // The registry is the history of every epoch: nothing may remove records from it.
    deny_delete: true,
    deny_purge: true,
    allow_direct: true,
  };
}

/**
 * The workers' floor records (protocol/layout.ts, FloorRecord): the last one of each shard and
 * epoch, on as many replicas as the shard streams, so that it outlives the NATS node of the R1
 * consumer it stands for. A few hundred bytes a shard and epoch; the oldest go first past a million.
 */
export function floorsStreamConfig(replicas: number): Partial<StreamConfig> & { name: string } {
  return {
    name: FLOORS_STREAM,
    subjects: [FLOORS_SUBJECTS],
    storage: StorageType.File,
    retention: RetentionPolicy.Limits,
    discard: DiscardPolicy.Old,
    max_msgs_per_subject: 1,
    max_msgs: 1_000_000,
    num_replicas: replicas,
    allow_direct: true,
  };
}

/**
 * Options for every long-lived `consume()`. nats.js notices a lost pull (a stream or consumer leader
 * that died with it: a NATS node lost in an R3 cluster) only after two missed idle heartbeats, and
 * by default a heartbeat is half of a 30 s pull: consumption stalled 30 s after each such loss (the
 * NATS R3 fault scenario measured 40 s recoveries). With 1 s heartbeats it resumes within ~2 s, for
 * one small heartbeat message a second per idle consumer.
 */
export const CONSUME_OPTIONS = { expires: 10_000, idle_heartbeat: 1_000 } as const;

export function isNotFound(err: unknown): boolean {
  return err instanceof JetStreamApiError && (err.code === JetStreamApiCodes.StreamNotFound || err.code === JetStreamApiCodes.ConsumerNotFound || err.status === 404);
}

/** Creates the stream unless it exists; an existing stream is left exactly as it is. */
export async function ensureStream(
  jsm: JetStreamManager,
  cfg: Partial<StreamConfig> & { name: string },
): Promise<{ info: StreamInfo; created: boolean }> {
  try {
    return { info: await jsm.streams.info(cfg.name), created: false };
  } catch (err) {
    if (!isNotFound(err)) throw err;
  }
  return { info: await jsm.streams.add(cfg), created: true };
}
