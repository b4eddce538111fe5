/**
 * ADR-0004 E1-E3 under load: worker SIGKILL, shard split and stream rebuild by the operator CLI,
 * each while entries are dispatched and devices keep reconnecting.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { scenarioOnInfra } from "../harness/faults.js";
import { runCli } from "../harness/cli.js";

test("fault E1 - a worker SIGKILLed under load: its shards are taken over at a new epoch, exactly one each", async () => {
  const victimShards: number[] = [];
  const result = await scenarioOnInfra((infra) => ({
    name: "E1 worker SIGKILL",
    env: infra.env,
    duplicates: "allowed",
    fault: async (run) => {
      const victim = run.workers[0]!;
      for (let s = 0; s < run.shardCount; s++) if ((await victim.metric("jetgate_worker_lease_held", { shard: String(s) })) === 1) victimShards.push(s);
      await victim.kill("SIGKILL");
    },
    // a user of a shard the victim owned, so recovery includes the takeover
    probeUser: (run) => run.users.find((u) => run.registry.shards.shardOf(u) === victimShards[0])!,
  }));
  assert.ok(victimShards.length > 0, "the victim held a shard");
  // a crash is the fence's case: one new epoch per shard it held, none for the survivor's
  assert.equal(result.epochChanges, victimShards.length, `epochs spent: ${result.epochChanges} for ${victimShards.length} shards`);
});

test("fault E2 - `jetgate shard split` under load, with moved users online, offline and mid-catch-up", async () => {
  await scenarioOnInfra((infra) => ({
    name: "E2 shard split",
    env: infra.env,
    duplicates: "allowed",
    fault: async (run) => {
      // some devices are offline across the split, some reconnect right at it (mid-catch-up)
      const offline = run.devices.filter((_, i) => i % 5 === 0);
      for (const d of offline) await run.closeApp(d);
      const before = run.registry.state.shards.get(1)!.epoch;
      const out = await runCli(run.env, ["shard", "split", "1"]);
      assert.equal(out.code, 0, out.text);
      assert.match(out.text, /split recorded/);
      for (const d of run.devices.filter((_, i) => i % 5 === 1)) d.client.disconnect();
      await run.registry.sync();
      assert.equal(run.registry.state.shards.get(2)?.status, "active", "the child shard exists");
      assert.ok(run.registry.state.shards.get(1)!.epoch > before, "the parent's epoch rose");
      for (const d of offline) await run.reopen(d);
    },
    probeUser: (run) => run.users.find((u) => run.registry.shards.shardOf(u) === 2)!,
  }));
});

test("fault E3 - `jetgate shard rebuild` under load: a new log, the old entries re-appended", async () => {
  await scenarioOnInfra((infra) => ({
    name: "E3 shard rebuild",
    env: infra.env,
    duplicates: "allowed",
    fault: async (run) => {
      const before = run.registry.state.shards.get(0)!;
      const out = await runCli(run.env, ["shard", "rebuild", "0"]);
      assert.equal(out.code, 0, out.text);
      await run.registry.sync();
      const after = run.registry.state.shards.get(0)!;
      assert.notEqual(after.log, before.log, "a new log");
      assert.ok(after.epoch > before.epoch);
    },
    probeUser: (run) => run.users.find((u) => run.registry.shards.shardOf(u) === 0)!,
  }));
});
