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
import { redisCluster } from "../harness/clusters.js";
import { NatsServer } from "../harness/servers.js";
import { sleep } from "../harness/wait.js";

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
