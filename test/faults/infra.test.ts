/**
 * Infrastructure failures under load: nats-server SIGKILL and restart, Redis FLUSHALL, Redis SIGKILL
 * and restart (empty: watermarks are rebuilt from the stream), and a gateway SIGKILL with its devices
 * moving to the other gateway.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { scenarioOnInfra } from "../harness/faults.js";
import { redisClient } from "../harness/stack.js";
import { sleep } from "../harness/wait.js";

test("fault - nats-server SIGKILLed and restarted on its data dir", async () => {
  await scenarioOnInfra((infra) => ({
    name: "nats-server SIGKILL",
    env: infra.env,
    duplicates: "allowed",
    fault: async () => {
      await infra.nats.kill();
      await sleep(1000);
      await infra.nats.start();
    },
  }));
});

test("fault - Redis FLUSHALL: caches, watermarks, dedup and leases gone at once", async () => {
  await scenarioOnInfra((infra) => ({
    name: "Redis FLUSHALL",
    env: infra.env,
    duplicates: "none",
    fault: async () => {
      const r = await redisClient(infra.redis.url);
      assert.equal(await r.flushall(), "OK");
      r.disconnect();
    },
  }));
});

test("fault - Redis SIGKILLed and restarted empty", async () => {
  await scenarioOnInfra((infra) => ({
    name: "Redis SIGKILL",
    env: infra.env,
    duplicates: "none",
    fault: async () => {
      await infra.redis.kill();
      await sleep(1000);
      await infra.redis.start();
    },
  }));
});

test("fault - a gateway SIGKILLed: its devices reconnect to the other gateway with their cursors", async () => {
  await scenarioOnInfra((infra) => ({
    name: "gateway SIGKILL",
    env: infra.env,
    duplicates: "none",
    fault: async (run) => {
      const sessions = await run.gateways[0]!.metric("jetgate_gateway_connections");
      assert.ok(sessions > 0, "the victim had sessions");
      await run.gateways[0]!.kill("SIGKILL");
    },
  }));
});
