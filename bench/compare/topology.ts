/**
 * The servers a system of `npm run bench` runs on, in one of two shapes:
 * - single: one nats-server (R1 streams) and one redis-server, what every earlier row ran on;
 * - cluster (`--cluster`): a 3-node NATS cluster with R3 shard streams and a Redis Cluster of 3
 *   masters, the shape a fleet runs (docs/operations.md), on the same machine.
 * Rows name the shape (`topology`), and CPU shares add up the nodes of each (`nats`, `redis`).
 */
import { natsCluster, redisCluster } from "../../test/harness/clusters.js";
import { NatsServer, RedisServer } from "../../test/harness/servers.js";

export type TopologyKind = "single" | "cluster";

/** The nodes of the cluster shape: NATS nodes (and stream replicas), Redis masters. */
export const CLUSTER_NODES = 3;

export interface Topology {
  kind: TopologyKind;
  /** What a row says of it, e.g. `nats 3 nodes R3, redis cluster 3 masters`. */
  label: string;
  natsUrls: string[];
  natsMonitorPorts: number[];
  natsPids: number[];
  /** Stream replicas for the shard streams (1, or 3 on the cluster). */
  replicas: number;
  redisUrls: string[];
  redisPids: number[];
  redisCluster: boolean;
  /** jetgate's settings for these servers (the URLs, JETGATE_REDIS_CLUSTER, JETGATE_STREAM_REPLICAS). */
  env: Record<string, string>;
  dispose(): Promise<void>;
}

/** Starts the servers a system needs, in `kind`'s shape. */
export async function startTopology(kind: TopologyKind, need: { nats: boolean; redis: boolean }): Promise<Topology> {
  const cluster = kind === "cluster";
  const nats: NatsServer[] = need.nats ? (cluster ? await natsCluster(CLUSTER_NODES) : [await NatsServer.start()]) : [];
  let redis: RedisServer[] = [];
  try {
    redis = need.redis ? (cluster ? await redisCluster(CLUSTER_NODES) : [await RedisServer.start()]) : [];
  } catch (err) {
    await Promise.all(nats.map((n) => n.dispose()));
    throw err;
  }
  const replicas = cluster ? CLUSTER_NODES : 1;
  const parts = [
    ...(nats.length > 0 ? [cluster ? `nats ${nats.length} nodes R${replicas}` : "nats 1 node R1"] : []),
    ...(redis.length > 0 ? [cluster ? `redis cluster ${redis.length} masters` : "redis 1"] : []),
  ];
  return {
    kind,
    label: parts.join(", "),
    natsUrls: nats.map((n) => n.url),
    natsMonitorPorts: nats.map((n) => n.monitorPort),
    natsPids: nats.map((n) => n.pid!),
    replicas,
    redisUrls: redis.map((r) => r.url),
    redisPids: redis.map((r) => r.pid!),
    redisCluster: cluster && redis.length > 0,
    env: {
      ...(nats.length > 0 ? { JETGATE_NATS_URL: nats.map((n) => n.url).join(","), JETGATE_STREAM_REPLICAS: String(replicas) } : {}),
      ...(redis.length > 0 ? { JETGATE_REDIS_URL: redis.map((r) => r.url).join(","), JETGATE_REDIS_CLUSTER: String(cluster) } : {}),
    },
    async dispose() {
      await Promise.all([...nats, ...redis].map((s) => s.dispose()));
    },
  };
}
