/**
 * Planned handoffs under load (issue 28): workers restarted the way a deployment rolls them
 * (SIGTERM, start again) release their shards' epochs and the next owner resumes them, so a
 * routine restart spends no epoch, renumbers nothing and sends nothing twice.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { scenarioOnInfra } from "../harness/faults.js";

const ROLLS = 20;

test(`fault - ${ROLLS} rolling restarts of two workers under load (SIGTERM, start again): no epoch spent, nothing lost, nothing sent twice`, async () => {
  let restarts = 0;
  const result = await scenarioOnInfra((infra) => ({
    name: `${ROLLS} rolling worker restarts`,
    // 2 s leases: a lease that lapses on a loaded machine is rightly a fence, not the handoff under test
    env: { ...infra.env, JETGATE_LEASE_MS: "2000" },
    duplicates: "none",
    fault: async (run) => {
      for (let roll = 0; roll < ROLLS; roll++) {
        // the older of the two first, as a deployment rolls its pods
        for (let i = 0; i < 2; i++) {
          const victim = run.live(run.workers)[0]!;
          assert.equal(await victim.metric("jetgate_mailbox_seq_regression_total"), 0, "no regression in the worker stopping");
          assert.equal(await victim.kill("SIGTERM"), 0, `roll ${roll}: the worker exits 0 after releasing:\n${victim.output.slice(-10).join("\n")}`);
          await run.spawnWorker();
          await run.spread();
          restarts++;
        }
      }
    },
  }));
  assert.equal(restarts, 2 * ROLLS);
  assert.equal(result.epochChanges, 0, "no shard's epoch changed across the restarts");
});

test("fault - a worker holding four shards stopped (SIGTERM) during a NATS stall: every shard released in one record, the next worker resumes them all, no epoch spent", async () => {
  const result = await scenarioOnInfra((infra) => ({
    name: "four shards released at once after a NATS stall",
    env: { ...infra.env, JETGATE_SHARDS: "4", JETGATE_LEASE_MS: "3000" },
    workers: 1,
    duplicates: "none",
    fault: async (run) => {
      const victim = run.live(run.workers)[0]!;
      assert.equal(await victim.metric("jetgate_worker_lease_held"), 4);
      // stopped during the stall: its releases wait for NATS, and are written together once it answers
      infra.nats.pause();
      await new Promise((r) => setTimeout(r, 3000));
      const exited = victim.kill("SIGTERM");
      await new Promise((r) => setTimeout(r, 1500));
      infra.nats.resume();
      assert.equal(await exited, 0, `the worker exits 0 after releasing:\n${victim.output.slice(-10).join("\n")}`);
      const state = await run.registry.sync();
      const shards = [...state.shards.values()].filter((s) => s.status === "active");
      assert.deepEqual(shards.map((s) => [s.shard, s.owner]), [[0, null], [1, null], [2, null], [3, null]], `every shard released (the registry, record ${state.seq})`);
      assert.ok(shards.every((s) => s.released_offset !== undefined));
      await run.spawnWorker();
      await run.spread();
    },
  }));
  assert.equal(result.epochChanges, 0, "no shard's epoch changed");
});
