/**
 * The conformance kit (docs/conformance.md) against the Go SDK (sdk/go) through its driver,
 * built here with the machine's Go as nats-server is.
 */
import { before, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { runScenario } from "../../conformance/run.js";
import { SCENARIOS } from "../../conformance/scenarios.js";

const SDK = fileURLToPath(new URL("../../sdk/go/", import.meta.url));
const GO_DRIVER = `${SDK}bin/jetgate-conformance`;

before(() => {
  execFileSync("go", ["build", "-o", "bin/jetgate-conformance", "./cmd/jetgate-conformance"], { cwd: SDK, stdio: "inherit", timeout: 300_000 });
});

for (const s of SCENARIOS) {
  test(`conformance (Go SDK) - ${s.name}: ${s.what}`, async () => {
    const o = await runScenario(s, GO_DRIVER);
    assert.ok(o.ok, `${o.failures.join("\n")}\n${(o.evidence ?? []).join("\n")}`);
  });
}
