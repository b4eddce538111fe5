/**
 * E1-E3 (docs/design.md, "Epochs and logs") under load: worker SIGKILL, shard split and stream rebuild by the operator CLI,
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

test("fault E3 - rebuild under load with gateways whose registry view lags 5 s: pushes of the new log held until it arrives; no CURSOR_INVALID, no replay from the start", async () => {
  const invalid = { before: 0, after: 0 };
  const rebases = { before: 0, after: 0 };
  const reasons: string[] = [];
  await scenarioOnInfra((infra) => ({
    name: "E3 rebuild, lagging gateways",
    env: { ...infra.env, JETGATE_FAULT_REGISTRY_LAG_MS: "5000" },
    duplicates: "allowed",
    fault: async (run) => {
      for (const g of run.gateways) invalid.before += await g.metric("jetgate_gateway_auth_outcomes_total", { case: "invalid" });
      rebases.before = run.devices.reduce((n, d) => n + d.client.stats.rebases, 0);
      for (const d of run.devices) d.client.on((e) => void (e.type === "cursor_invalid" && reasons.push(e.reason)));
      const out = await runCli(run.env, ["shard", "rebuild", "0"]);
      assert.equal(out.code, 0, out.text);
    },
    probeUser: (run) => run.users.find((u) => run.registry.shards.shardOf(u) === 0)!,
    check: async (run) => {
      let held = 0;
      for (const g of run.live(run.gateways)) {
        held += await g.metric("jetgate_gateway_held_pushes_total");
        invalid.after += await g.metric("jetgate_gateway_auth_outcomes_total", { case: "invalid" });
      }
      rebases.after = run.devices.reduce((n, d) => n + d.client.stats.rebases, 0);
      const cursorInvalid = run.devices.filter((d) => d.client.stats.cursorInvalid > 0).length;
      console.log(`  lagging gateways: ${held} pushes held; AUTH invalid ${invalid.before} -> ${invalid.after}; rebases ${rebases.before} -> ${rebases.after}; devices told CURSOR_INVALID ${cursorInvalid}`);
      assert.ok(held > 0, "pushes of the new log reached the gateways before their registry did (the case under test)");
      assert.equal(invalid.after, invalid.before, `no AUTH answered CURSOR_INVALID: ${[...new Set(reasons)].join("; ")}`);
      assert.equal(cursorInvalid, 0, "no device replayed its mailbox from the start");
      assert.ok(rebases.after > rebases.before, "devices were rebased onto the new log");
    },
  }));
});
