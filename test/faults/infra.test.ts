/**
 * Infrastructure failures under load: nats-server SIGKILL and restart, Redis FLUSHALL, Redis SIGKILL
 * and restart (empty: watermarks are rebuilt from the stream), and a gateway SIGKILL with its devices
 * moving to the other gateway.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { runScenario } from "../harness/faults.js";
import { redisClient, startInfra } from "../harness/stack.js";
import { sleep } from "../harness/wait.js";

test("fault - nats-server SIGKILLed and restarted on its data dir", async () => {
  const infra = await startInfra();
  try {
    await runScenario({
      name: "nats-server SIGKILL",
      env: infra.env,
      duplicates: "allowed",
      fault: async () => {
        await infra.nats.kill();
        await sleep(1000);
        await infra.nats.start();
      },
    });
  } finally {
    await infra.dispose();
  }
});

test("fault - Redis FLUSHALL: caches, watermarks, dedup and leases gone at once", async () => {
  const infra = await startInfra();
  try {
    await runScenario({
      name: "Redis FLUSHALL",
      env: infra.env,
      duplicates: "none",
      fault: async () => {
        const r = await redisClient(infra.redis.url);
        assert.equal(await r.flushall(), "OK");
        r.disconnect();
      },
    });
  } finally {
    await infra.dispose();
  }
});

test("fault - Redis SIGKILLed and restarted empty", async () => {
  const infra = await startInfra();
  try {
    await runScenario({
      name: "Redis SIGKILL",
      env: infra.env,
      duplicates: "none",
      fault: async () => {
        await infra.redis.kill();
        await sleep(1000);
        await infra.redis.start();
      },
    });
  } finally {
    await infra.dispose();
  }
});

test("fault - a gateway SIGKILLed: its devices reconnect to the other gateway with their cursors", async () => {
  const infra = await startInfra();
  try {
    await runScenario({
      name: "gateway SIGKILL",
      env: infra.env,
      duplicates: "none",
      fault: async (run) => {
        const sessions = await run.gateways[0]!.metric("jetgate_gateway_connections");
        assert.ok(sessions > 0, "the victim had sessions");
        await run.gateways[0]!.kill("SIGKILL");
      },
    });
  } finally {
    await infra.dispose();
  }
});
