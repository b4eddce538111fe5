/**
 * The soak script end to end, briefly: `npm run soak -- --minutes 3` as a child process (its faults
 * are real SIGKILLs, server restarts and a Redis out of memory). Seed 17 draws Redis evicting at a
 * tight maxmemory, Redis refusing writes (OOM) and a Redis restart; the long run
 * (docs/operations.md#soak) draws every kind.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));

test("soak --minutes 3: three faults, nothing missing, no regression", { timeout: 480_000 }, async () => {
  const child = spawn(process.execPath, ["--import", "tsx", "test/soak/soak.ts", "--minutes", "3", "--seed", "17"], { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  child.stdout.on("data", (d: Buffer) => (out += d.toString()));
  child.stderr.on("data", (d: Buffer) => (out += d.toString()));
  // SIGTERM: the script stops its servers and processes on the way out
  const timer = setTimeout(() => child.kill("SIGTERM"), 460_000);
  const code = await new Promise<number | null>((resolve) => child.on("exit", (c) => resolve(c)));
  clearTimeout(timer);
  assert.equal(code, 0, out);
  const last = out.trim().split("\n").at(-1) ?? "";
  assert.match(last, /^soak: 3 min, 3 faults, dispatched [1-9]\d* delivered [1-9]\d* missing 0 duplicates \d+ regressions 0; RSS growth after warm-up: /, out);
  for (const [i, kind] of ["redis-evict", "redis-oom", "redis-restart"].entries()) assert.match(out, new RegExp(`\\| ${i} \\| ${kind} \\|`), "the table has a row per fault");
  for (const slot of ["gateway-1", "gateway-2", "worker-1", "worker-2"]) assert.match(last, new RegExp(`${slot} [+-n]`), `${slot} in the final line`);
});
