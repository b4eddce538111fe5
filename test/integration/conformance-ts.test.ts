/**
 * The conformance kit (docs/conformance.md) against the TypeScript SDK's driver: every scenario
 * passes; a planted client bug makes the scenario that owns it fail, by name. The Go SDK's run is
 * conformance-go.test.ts (a file of its own, so the two run side by side).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { runScenario } from "../../conformance/run.js";
import { SCENARIOS } from "../../conformance/scenarios.js";

const TS_DRIVER = `${process.execPath} --import tsx conformance/drivers/ts.ts`;
const scenario = (name: string) => SCENARIOS.find((s) => s.name === name)!;

for (const s of SCENARIOS) {
  test(`conformance (TypeScript SDK) - ${s.name}: ${s.what}`, async () => {
    const o = await runScenario(s, TS_DRIVER);
    assert.ok(o.ok, `${o.failures.join("\n")}\n${(o.evidence ?? []).join("\n")}`);
  });
}

test("conformance - a planted bug, the cursor stored before the entry is applied: 'normal' fails with an entry lost", async () => {
  const o = await runScenario(scenario("normal"), TS_DRIVER, { CONFORMANCE_PLANT: "store_before_apply" });
  assert.equal(o.ok, false);
  assert.ok(o.failures.some((f) => /^lost: 1 of 30 entries never applied/.test(f)), o.failures.join("\n"));
});

test("conformance - a planted bug, an entry applied twice after a rebase: 'rebased_same_log' fails 'once'", async () => {
  const o = await runScenario(scenario("rebased_same_log"), TS_DRIVER, { CONFORMANCE_PLANT: "apply_twice_after_rebase" });
  assert.equal(o.ok, false);
  assert.ok(o.failures.some((f) => /^once: entry m\d+ applied twice .* in one life$/.test(f)), o.failures.join("\n"));
});
