/**
 * Slow, not dead: Redis answering nothing for seconds (CLIENT PAUSE, DEBUG SLEEP) and nats-server
 * stopped with SIGSTOP, under load. Nothing is lost or regresses, no process exits, memory stays
 * bounded while requests wait (printed), and every gateway and worker reports not ready while the
 * dependency cannot answer and ready again after. What each process does meanwhile is in
 * docs/operations.md ("Slow dependencies").
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { scenarioOnInfra, type FaultRun } from "../harness/faults.js";
import { redisClient, type JetgateProcess } from "../harness/stack.js";
import { sleep, waitFor } from "../harness/wait.js";

/** Resident memory of a process, from /proc. */
function rssBytes(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m === null ? 0 : Number(m[1]) * 1024;
}

/** Most a process may grow while a dependency does not answer (the load is about 250 entries a second). */
const MAX_GROWTH = 64 * 1024 * 1024;

/**
 * Runs `stall` (resolves when the dependency answers again) while watching every gateway and
 * worker: its readiness every 100 ms and its RSS. Asserts each was not ready (naming `dep`) during
 * the stall and is ready again after, and that none exited or grew more than MAX_GROWTH.
 */
async function whileStalled(run: FaultRun, dep: "redis" | "nats", label: string, stall: () => Promise<void>): Promise<void> {
  const procs: JetgateProcess[] = [...run.gateways, ...run.workers];
  const base = procs.map((p) => rssBytes(p.pid));
  const peak = [...base];
  const sawNotReady = procs.map(() => false);
  let watching = true;
  const watch = (async () => {
    while (watching) {
      await Promise.all(procs.map(async (p, i) => {
        peak[i] = Math.max(peak[i]!, rssBytes(p.pid));
        const r = await p.http("/readyz").catch(() => undefined);
        if (r !== undefined && r.status === 503 && (JSON.parse(r.text) as { problems: string[] }).problems.includes(dep)) sawNotReady[i] = true;
      }));
      await sleep(100);
    }
  })();
  const t0 = Date.now();
  try {
    await stall();
  } finally {
    watching = false;
    await watch;
  }
  const stalledMs = Date.now() - t0;
  await waitFor("every gateway and worker ready again", async () => (await Promise.all(procs.map(async (p) => (await p.http("/readyz")).status === 200))).every(Boolean), { timeoutMs: 15_000, intervalMs: 100 });
  const readyMs = Date.now() - t0 - stalledMs;
  const growth = procs.map((p, i) => `${p.name.split(" ")[0]} +${((peak[i]! - base[i]!) / 1048576).toFixed(1)} MiB`);
  console.log(`  ${label}: ${stalledMs} ms without answers; not ready during it: ${sawNotReady.filter(Boolean).length}/${procs.length}; all ready ${readyMs} ms after; RSS growth while waiting: ${growth.join(", ")}`);
  procs.forEach((p, i) => {
    assert.equal(p.proc.exitCode ?? p.proc.signalCode, null, `${p.name} exited`);
    assert.ok(sawNotReady[i], `${p.name} reported not ready (${dep}) while it could not answer`);
    assert.ok(peak[i]! - base[i]! < MAX_GROWTH, `${p.name} grew ${peak[i]! - base[i]!} bytes while waiting`);
  });
}

/** A scenario; duplicates, where allowed, only with an epoch change. */
async function slow(...args: Parameters<typeof scenarioOnInfra>): Promise<void> {
  const r = await scenarioOnInfra(...args);
  assert.ok(r.duplicates === 0 || r.epochChanges > 0, `${r.duplicates} duplicates without an epoch change`);
}

// 1 s: the stalls below are 3-5 s, so readiness has time to go false and come back
const env = { JETGATE_DEPENDENCY_TIMEOUT_MS: "1000", JETGATE_LOG_LEVEL: "warn" };

test("slow - Redis CLIENT PAUSE 4 s (every client) under load", async () => {
  await slow((infra) => ({
    name: "Redis CLIENT PAUSE 4 s",
    env: { ...infra.env, ...env },
    duplicates: "allowed", // as with DEBUG SLEEP below: the stall outlasts the 1 s leases
    fault: (run) => whileStalled(run, "redis", "Redis CLIENT PAUSE 4 s", async () => {
      const r = await redisClient(infra.redis.url);
      try {
        assert.equal(await r.call("CLIENT", "PAUSE", "4000", "ALL"), "OK");
        await sleep(4000);
        // answered as soon as the pause ends
        await r.ping();
      } finally {
        r.disconnect();
      }
    }),
  }));
});

test("slow - Redis DEBUG SLEEP 3 (the server blocked) under load", async () => {
  await slow((infra) => ({
    name: "Redis DEBUG SLEEP 3",
    env: { ...infra.env, ...env },
    // longer than the 1 s lease: leases expire in the stall (a key's expiry is a point in time), and
    // when Redis answers again a shard can change owner: an epoch bump, which replays what was
    // pushed and not yet acknowledged. With production's 5 s lease a 3-4 s stall moves nothing.
    duplicates: "allowed",
    fault: (run) => whileStalled(run, "redis", "Redis DEBUG SLEEP 3", async () => {
      const r = await redisClient(infra.redis.url);
      try {
        // returns when the server wakes up
        assert.equal(await r.call("DEBUG", "SLEEP", "3"), "OK");
      } finally {
        r.disconnect();
      }
    }),
  }), { redisArgs: ["--enable-debug-command", "yes"] });
});

test("slow - nats-server SIGSTOP for 5 s, then SIGCONT, under load", async () => {
  await slow((infra) => ({
    name: "nats-server SIGSTOP 5 s",
    env: { ...infra.env, ...env },
    duplicates: "allowed", // a worker whose consumer ends while NATS is stopped is taken again with an epoch bump
    fault: (run) => whileStalled(run, "nats", "nats-server SIGSTOP 5 s", async () => {
      infra.nats.pause();
      await sleep(5000);
      infra.nats.resume();
    }),
  }));
});
