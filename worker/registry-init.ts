/**
 * `jetgate registry init`: creates the registry stream, writes the initial shard layout, and creates
 * every shard stream and INGRESS. The registry write comes first and every step is idempotent, so a
 * crash halfway is mended by running it again; a second run changes nothing. Workers refuse a
 * shard until its stream exists, and producers retry until it takes appends.
 *
 * Every shard starts at epoch 0, unclaimed (`owner: null`, see initialShards): the first worker to
 * take a shard claims epoch 0 instead of bumping to 1. A layout written by an older version has no
 * owner field and counts as claimed: its first worker bumps, as before.
 */
import type { NatsConnection } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { registryRecord, initialShards } from "../protocol/index.js";
import {
  RegistryClient,
  ensureStream,
  floorsStreamConfig,
  ingressStreamConfig,
  logOfStream,
  newLogId,
  registryStreamConfig,
  shardStreamConfig,
  type StreamSettings,
} from "../protocol/io/index.js";

export interface InitReport {
  registryCreated: boolean;
  /** True when this run wrote the initial layout; false when the registry already had one. */
  layoutWritten: boolean;
  shards: number;
  streamsCreated: string[];
  streamsExisting: string[];
  /** Shard streams whose log id differs from the registry's (someone recreated them by hand). */
  mismatched: string[];
  /** Existing shard streams this run allowed atomic batches on (made by an older jetgate). */
  atomicEnabled: string[];
}

export async function initRegistry(
  nc: NatsConnection,
  settings: StreamSettings & { shards: number; by: string },
): Promise<InitReport> {
  const jsm = await jetstreamManager(nc);
  const reg = await ensureStream(jsm, registryStreamConfig(settings.JETGATE_STREAM_REPLICAS));
  const registry = await RegistryClient.open(nc);
  try {
    const written = await registry.update((state) =>
      state.shards.size > 0
        ? null
        : registryRecord("init", settings.by, initialShards(settings.shards, Array.from({ length: settings.shards }, newLogId))),
    );
    const report: InitReport = {
      registryCreated: reg.created,
      layoutWritten: written !== null,
      shards: registry.state.shards.size,
      streamsCreated: [],
      streamsExisting: [],
      mismatched: [],
      atomicEnabled: [],
    };
    for (const shard of registry.state.shards.values()) {
      if (shard.status !== "active") continue;
      const cfg = shardStreamConfig(shard.shard, shard.log, settings);
      const { info, created } = await ensureStream(jsm, cfg);
      (created ? report.streamsCreated : report.streamsExisting).push(cfg.name);
      if (logOfStream(info) !== shard.log) report.mismatched.push(cfg.name);
      // A stream made before atomic batches were used: turn them on (nothing else of it changes).
      else if (info.config.allow_atomic !== true) {
        await jsm.streams.update(cfg.name, { ...info.config, allow_atomic: true });
        report.atomicEnabled.push(cfg.name);
      }
    }
    for (const cfg of [ingressStreamConfig(settings), floorsStreamConfig(settings.JETGATE_STREAM_REPLICAS)]) {
      const made = await ensureStream(jsm, cfg);
      (made.created ? report.streamsCreated : report.streamsExisting).push(made.info.config.name);
    }
    return report;
  } finally {
    await registry.close();
  }
}
