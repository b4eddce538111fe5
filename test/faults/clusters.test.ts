/**
 * Clustered infrastructure under load: a 3-node NATS cluster with R3 streams losing a stream
 * leader, and a 3-master Redis Cluster (ioredis Cluster mode) carrying the whole path, one master
 * SIGKILLed and restarted empty.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { shardStream } from "../../protocol/index.js";
import { runScenario } from "../harness/faults.js";
import { NatsServer, RedisServer, freePort } from "../harness/servers.js";
import { redisClient } from "../harness/stack.js";
import { sleep, waitFor } from "../harness/wait.js";

async function natsCluster(): Promise<NatsServer[]> {
  const routes = await Promise.all([freePort(), freePort(), freePort()]);
  const ports = await Promise.all([freePort(), freePort(), freePort()]);
  const conf = (i: number) =>
    `server_name: n${i}\ncluster {\n  name: jg\n  listen: "127.0.0.1:${routes[i]}"\n  routes: [${routes.map((p) => `"nats-route://127.0.0.1:${p}"`).join(", ")}]\n}\n`;
  return startAll([0, 1, 2].map((i) => () => NatsServer.start({ config: conf(i), port: ports[i]! })));
}

/** Starts servers together; if one fails, the others are disposed before the error goes on. */
async function startAll<T extends { dispose(): Promise<void> }>(starts: (() => Promise<T>)[]): Promise<T[]> {
  const settled = await Promise.allSettled(starts.map((s) => s()));
  const failed = settled.find((r) => r.status === "rejected");
  if (failed === undefined) return settled.map((r) => (r as PromiseFulfilledResult<T>).value);
  await Promise.all(settled.flatMap((r) => (r.status === "fulfilled" ? [r.value.dispose()] : [])));
  throw (failed as PromiseRejectedResult).reason;
}

test("fault - 3-node NATS cluster, R3 streams: the stream leader is SIGKILLed", async () => {
  const nodes = await natsCluster();
  const redis = await RedisServer.start();
  const url = nodes.map((n) => n.url).join(",");
  try {
    await runScenario({
      name: "NATS R3 leader SIGKILL",
      env: { JETGATE_NATS_URL: url, JETGATE_REDIS_URL: redis.url, JETGATE_LOG_LEVEL: "warn", JETGATE_STREAM_REPLICAS: "3" },
      duplicates: "allowed",
      fault: async () => {
        const nc = await connect({ servers: url.split(",") });
        const jsm = await jetstreamManager(nc);
        const info = await jsm.streams.info(shardStream(0));
        assert.equal(info.config.num_replicas, 3);
        const leader = info.cluster?.leader;
        assert.ok(leader !== undefined, "the stream has a leader");
        await nc.close();
        const victim = nodes[Number(leader.slice(1))]!;
        await victim.kill();
        await sleep(3000);
        await victim.start(30_000);
      },
      probeUser: (run) => run.users.find((u) => run.registry.shards.shardOf(u) === 0)!,
    });
  } finally {
    await Promise.all([...nodes.map((n) => n.dispose()), redis.dispose()]);
  }
});

async function redisCluster(): Promise<RedisServer[]> {
  const args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "no"];
  // the bus port on a free port of its own (by default it is port + 10000, which may be taken)
  const busPorts = await Promise.all([freePort(), freePort(), freePort()]);
  const nodes = await startAll(busPorts.map((bus) => () => RedisServer.start({ args: [...args, "--cluster-port", String(bus)] })));
  const clients = await Promise.all(nodes.map((n) => redisClient(n.url)));
  try {
    const ranges = [[0, 5460], [5461, 10922], [10923, 16383]] as const;
    await Promise.all(clients.map((c, i) => c.call("CLUSTER", "ADDSLOTSRANGE", String(ranges[i]![0]), String(ranges[i]![1]))));
    for (let i = 1; i < nodes.length; i++) await clients[0]!.call("CLUSTER", "MEET", "127.0.0.1", String(nodes[i]!.port), String(busPorts[i]));
    await waitFor("the Redis cluster is ok", async () => {
      const infos = await Promise.all(clients.map((c) => c.call("CLUSTER", "INFO") as Promise<string>));
      return infos.every((i) => i.includes("cluster_state:ok") && i.includes("cluster_known_nodes:3"));
    }, { timeoutMs: 20_000 });
  } catch (err) {
    await Promise.all(nodes.map((n) => n.dispose()));
    throw err;
  } finally {
    for (const c of clients) c.disconnect();
  }
  return nodes;
}

test("fault - 3-master Redis Cluster: one master SIGKILLed and restarted empty", async () => {
  const nats = await NatsServer.start();
  const nodes = await redisCluster();
  try {
    await runScenario({
      name: "Redis Cluster master SIGKILL",
      env: { JETGATE_NATS_URL: nats.url, JETGATE_REDIS_URL: nodes.map((n) => n.url).join(","), JETGATE_REDIS_CLUSTER: "true", JETGATE_LOG_LEVEL: "warn" },
      duplicates: "allowed",
      fault: async () => {
        await nodes[1]!.kill();
        await sleep(3000);
        await nodes[1]!.start();
      },
    });
  } finally {
    await Promise.all([nats.dispose(), ...nodes.map((n) => n.dispose())]);
  }
});
