/**
 * The functional check of `npm run bench -- <scenario> --nodes N` (issue: horizontal scaling,
 * measured): with two of every process that scales out, each system delivers every entry it was
 * sent exactly once, at full rate and at half of it. Few devices, few seconds: this asserts what is
 * delivered, not how fast (the benchmark reports that). Four systems one after another took 4-5
 * minutes on the 2-core machine (249 s in one run, over 280 s in another on the same day); the five
 * of 2026-12-05, Centrifugo (the pinned build, scripts/test-deps.sh) among them, took 85 s: the
 * limit is well above that, since it only stops a hung run.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const run = promisify(execFile);

interface FanoutRow {
  system: string;
  nodes: number;
  sent_max: number;
  delivered_max: number;
  sent_half: number;
  delivered_half: number;
  duplicates: number;
  us_per_entry: Record<string, number>;
  us_per_process?: Record<string, number>;
  cpu_procs?: string;
  sustained_per_s: number | null;
  probes: { rate: number; ok: boolean }[];
  bound: string;
  stages_max?: Record<string, { p50_ms: number; p99_ms: number; n: number }>;
  stages_half?: Record<string, { p50_ms: number; p99_ms: number; n: number }>;
  gap_fills?: number;
  redis_cmds_per_entry?: number;
  server_version?: string;
}

test("bench --nodes 2: every system delivers every entry once, at full and at half rate", { timeout: 480_000 }, async () => {
  const { stdout } = await run(
    process.execPath,
    ["--import", "tsx", "bench/compare/run.ts", "fanout", "--nodes", "2", "--devices", "24", "--seconds", "2", "--probes", "1", "--json"],
    { cwd: ROOT, env: { ...process.env, BENCH_SOURCE: "1" }, maxBuffer: 16 * 1024 * 1024, timeout: 450_000 },
  );
  const rows = stdout.split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l) as FanoutRow & { summary?: boolean });
  const bySystem = new Map(rows.filter((r) => r.summary !== true).map((r) => [r.system, r]));
  assert.deepEqual([...bySystem.keys()].sort(), ["centrifugo", "jetgate", "jetstream-limit", "socketio", "uws-limit"]);
  for (const [system, r] of bySystem) {
    assert.equal(r.nodes, 2, system);
    assert.ok(r.sent_max > 0 && r.sent_half > 0, `${system}: nothing sent`);
    assert.equal(r.delivered_max, r.sent_max, `${system}: delivered at full rate`);
    assert.equal(r.delivered_half, r.sent_half, `${system}: delivered at half rate`);
    assert.equal(r.duplicates, 0, `${system}: entries delivered twice`);
    // one probe of the sustained rate, and what bound the max
    assert.equal(r.probes.length, 1, `${system}: probes`);
    assert.ok(r.sustained_per_s === null || r.sustained_per_s === r.probes[0]!.rate, `${system}: sustained rate is the probe's that held`);
    assert.match(r.bound, /^(machine|process|stage|waiting) /, `${system}: bound`);
    if (system === "jetgate") {
      // every stage of the path timed at the max and at half load, once per entry or more
      for (const stages of [r.stages_max, r.stages_half]) {
        for (const stage of ["dispatch_queue", "dispatch_ack", "worker_fetch_wait", "worker_redis", "worker_confirm", "worker_push", "gateway_chain"]) {
          assert.ok((stages?.[stage]?.n ?? 0) > 0, `jetgate: stage ${stage} timed`);
        }
      }
      // after the warm-up entry each, no device fills a gap on the live path
      assert.equal(r.gap_fills, 0, "jetgate: gap fills after the warm-up");
    }
    if (system === "socketio" || system === "centrifugo") assert.ok((r.redis_cmds_per_entry ?? 0) > 0, `${system}: Redis commands per entry`);
    // the pinned release, by its own word
    if (system === "centrifugo") assert.match(r.server_version ?? "", /^Centrifugo v6\.9\.1 /);
    // two processes of each role that scales out, each reported
    assert.match(r.cpu_procs ?? "", system === "jetgate" ? /gateway#2:.*worker#2:.*producer#2:.*devices#2:/ : /server#2:.*devices#2:/, system);
    const roles = system === "jetgate" ? ["gateway", "worker", "producer"] : system === "centrifugo" ? ["server", "producer"] : ["server"];
    for (const role of roles) {
      const each = [1, 2].map((k) => r.us_per_process?.[`${role}#${k}`]);
      assert.ok(each.every((us) => us !== undefined && us > 0), `${system}: CPU per entry of each ${role}`);
      // the role's figure is its processes' together (each rounded to 0.1 us)
      assert.ok(Math.abs(each[0]! + each[1]! - r.us_per_entry[role]!) <= 0.2, `${system}: ${role} sums its processes`);
    }
  }
});
