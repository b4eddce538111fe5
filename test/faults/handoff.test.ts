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
