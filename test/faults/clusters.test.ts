/**
 * Clustered infrastructure under load: a 3-master Redis Cluster (ioredis Cluster mode) carrying the
 * whole path, one master SIGKILLed and restarted empty. The harness's 5 s tail check runs: with it
 * off, routing alone lost a device's later entries in 3 of 68 runs after the third race fix of
 * issue 27 (docs/registry-and-worker.md, "Routing"), a race not found yet. (The 3-node NATS cluster is in nats-r3.test.ts.)
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { RedisKeys } from "../../protocol/index.js";
import { loadConfig, RegistryClient, connectNats, connectRedis } from "../../protocol/io/index.js";
import { MailboxReader } from "../../gateway/mailbox/reader.js";
import { runScenario } from "../harness/faults.js";
import { NatsServer, RedisServer, freePort, startAll } from "../harness/servers.js";
import { redisClient } from "../harness/stack.js";
import { sleep, waitFor } from "../harness/wait.js";


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
    // the tail check's read on a Cluster: users in many slots, one command each (an explicit
    // pipeline across slots is refused there, and the check used to read nothing)
    const env = { JETGATE_NATS_URL: nats.url, JETGATE_REDIS_URL: nodes.map((n) => n.url).join(","), JETGATE_REDIS_CLUSTER: "true" };
    const config = loadConfig(env);
    const nc = await connectNats(config, "clusters-test");
    const redis = connectRedis(config, "clusters-test");
    const registry = await RegistryClient.open(nc);
    try {
      const reader = new MailboxReader(nc, redis, new RedisKeys(config.JETGATE_REDIS_PREFIX), registry, config.JETGATE_LANES);
      const users = Array.from({ length: 40 }, (_, i) => `fu${i}`);
      const heads = await reader.cachedHeads(users);
      assert.equal(heads.length, users.length);
      assert.ok(heads.filter((h) => h?.head !== undefined).length >= users.length / 2, "heads read across the cluster's slots");
    } finally {
      await registry.close();
      redis.disconnect();
      await nc.close();
    }
  } finally {
    await Promise.all([nats.dispose(), ...nodes.map((n) => n.dispose())]);
  }
});
