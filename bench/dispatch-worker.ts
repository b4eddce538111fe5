/**
 * Dispatch throughput and worker entries/s, on this machine, against its own nats-server and
 * redis-server (started in a temp dir, like the tests).
 *
 *   npm run bench:dispatch -- [--entries 200000] [--users 20000] [--recipients 100] [--shards 4] [--json]
 *
 * Phases:
 *   dispatch  entries appended per second by one Dispatcher (no worker running)
 *   drain     one worker process working off that backlog: entries/s until its lag is 0
 *   live      dispatch and worker at once: dispatch rate, and the worker's lag when dispatch ends
 */
import { parseArgs } from "node:util";
import { cpus } from "node:os";
import { readFileSync } from "node:fs";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { Dispatcher, RegistryClient } from "../protocol/io/index.js";
import { startInfra, initStack, spawnWorker, type JetgateProcess } from "../test/harness/stack.js";
import { waitFor } from "../test/harness/wait.js";
import { Window } from "./window.js";

const { values } = parseArgs({
  options: {
    entries: { type: "string", default: "200000" },
    users: { type: "string", default: "20000" },
    recipients: { type: "string", default: "100" },
    shards: { type: "string", default: "4" },
    json: { type: "boolean", default: false },
  },
});
const entries = Number(values.entries);
const users = Array.from({ length: Number(values.users) }, (_, i) => `user${i}`);
const perCall = Number(values.recipients);
const body = new Uint8Array(100);

/** CPU seconds a process has used (Linux /proc). */
function cpuSeconds(pid: number): number {
  const f = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
  return (Number(f[11]) + Number(f[12])) / 100;
}
const us = (cpuS: number, n: number) => Number(((cpuS / n) * 1e6).toFixed(1));

function report(phase: string, data: Record<string, number | string>): void {
  if (values.json) console.log(JSON.stringify({ bench: "dispatch-worker", phase, ...data }));
  else console.log(`${phase.padEnd(9)} ${Object.entries(data).map(([k, v]) => `${k}=${v}`).join("  ")}`);
}

async function dispatchAll(d: Dispatcher, prefix: string, total: number): Promise<number> {
  const started = performance.now();
  const inFlight = new Window(200);
  let sent = 0;
  let u = 0;
  while (sent < total) {
    const n = Math.min(perCall, total - sent);
    const recipients = Array.from({ length: n }, () => users[u++ % users.length]!);
    const id = `${prefix}${sent}`;
    const p = d.dispatch({ dispatch_id: id, message_id: id, lane: "default", recipients, body }).then((r) => {
      for (const x of r) if ("error" in x) throw new Error(x.error.message);
    });
    sent += n;
    // Bounded dispatch calls in flight; the Dispatcher bounds publishes itself.
    await inFlight.add(p);
  }
  await inFlight.drained();
  return (performance.now() - started) / 1000;
}

async function totalPending(nc: Awaited<ReturnType<typeof connect>>, shards: number): Promise<number> {
  const jsm = await jetstreamManager(nc);
  let pending = 0;
  for (let s = 0; s < shards; s++) {
    for await (const c of jsm.consumers.list(`MBX_${s}`)) pending += c.num_pending + c.num_ack_pending;
  }
  return pending;
}

const infra = await startInfra({ JETGATE_SHARDS: values.shards, JETGATE_LOG_LEVEL: "error", JETGATE_HOT_CACHE_MAXLEN: "64" });
let worker: JetgateProcess | undefined;
try {
  await initStack(infra.env);
  const nc = await connect({ servers: infra.nats.url });
  const registry = await RegistryClient.open(nc);
  // BENCH_MAX_BATCH=1: without atomic batches (one entry per user in flight), to compare
  const maxBatch = process.env.BENCH_MAX_BATCH !== undefined ? Number(process.env.BENCH_MAX_BATCH) : undefined;
  const d = new Dispatcher(nc, () => registry.shards, { lanes: ["default"], ackTimeoutMs: 5000, ...(maxBatch !== undefined ? { maxBatch } : {}) });
  console.error(`machine: ${cpus().length} cores, ${cpus()[0]?.model}; node ${process.version}; entries ${entries}, users ${users.length}, recipients per call ${perCall}, shards ${values.shards}`);

  const natsPid = infra.nats.pid!;
  const redisPid = infra.redis.pid!;
  const self0 = process.cpuUsage();
  const nats0 = cpuSeconds(natsPid);
  const secs = await dispatchAll(d, "a", entries);
  const self = process.cpuUsage(self0);
  report("dispatch", {
    entries, seconds: secs.toFixed(2), entries_per_s: Math.round(entries / secs), retries: d.stats.retries,
    batches: d.stats.batches, entries_per_batch: d.stats.batches > 0 ? Number((d.stats.batchedEntries / d.stats.batches).toFixed(1)) : 0, batch_fallbacks: d.stats.batchFallbacks,
    dispatcher_cpu_us_per_entry: us((self.user + self.system) / 1e6, entries), nats_cpu_us_per_entry: us(cpuSeconds(natsPid) - nats0, entries),
  });

  // Drain: one worker takes all shards and works off the backlog.
  const drainStart = performance.now();
  // BENCH_PROFILE=worker: the worker runs under --cpu-prof (profile written on SIGTERM)
  const prof = process.env.BENCH_PROFILE === "worker" ? ["--cpu-prof", `--cpu-prof-dir=${process.env.BENCH_PROFILE_DIR ?? "bench/profiles"}`] : [];
  worker = await spawnWorker(infra.env, { JETGATE_WORKER_ID: "bench" }, prof);
  await waitFor("worker owns every shard", async () => (await worker!.metric("jetgate_worker_lease_held")) === Number(values.shards), { timeoutMs: 30_000 });
  const w0 = cpuSeconds(worker.pid);
  const r0 = cpuSeconds(redisPid);
  const n0 = cpuSeconds(natsPid);
  const p0 = await worker.metric("jetgate_worker_entries_processed_total");
  await waitFor("backlog drained", async () => (await worker!.metric("jetgate_worker_entries_processed_total")) >= entries, { timeoutMs: 600_000, intervalMs: 200 });
  const drainSecs = (performance.now() - drainStart) / 1000;
  const drained = entries - p0;
  report("drain", {
    entries, seconds: drainSecs.toFixed(2), entries_per_s: Math.round(entries / drainSecs),
    worker_cpu_us_per_entry: us(cpuSeconds(worker.pid) - w0, drained), redis_cpu_us_per_entry: us(cpuSeconds(redisPid) - r0, drained),
    nats_cpu_us_per_entry: us(cpuSeconds(natsPid) - n0, drained),
  });

  // Live: dispatch while the worker runs.
  const before = await worker.metric("jetgate_worker_entries_processed_total");
  const liveSecs = await dispatchAll(d, "b", entries);
  const lagAtEnd = await totalPending(nc, Number(values.shards));
  const caughtUpStart = performance.now();
  await waitFor("worker caught up", async () => (await worker!.metric("jetgate_worker_entries_processed_total")) >= before + entries, { timeoutMs: 600_000, intervalMs: 100 });
  const extra = (performance.now() - caughtUpStart) / 1000;
  report("live", {
    entries,
    dispatch_entries_per_s: Math.round(entries / liveSecs),
    worker_entries_per_s: Math.round(entries / (liveSecs + extra)),
    lag_when_dispatch_ended: lagAtEnd,
    catch_up_after_s: extra.toFixed(2),
  });
  report("checks", {
    regressions: await worker.metric("jetgate_mailbox_seq_regression_total"),
    duplicates: await worker.metric("jetgate_worker_duplicates_total"),
    pushed: await worker.metric("jetgate_worker_entries_pushed_total"),
  });
  d.close();
  await registry.close();
  await nc.close();
} finally {
  await worker?.kill(process.env.BENCH_PROFILE ? "SIGTERM" : "SIGKILL");
  await infra.dispose();
}
