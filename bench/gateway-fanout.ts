/**
 * Entries/s delivered to devices and dispatch-to-device latency through the whole path
 * (dispatch -> JetStream -> worker -> gateway -> device), with N devices connected.
 *
 *   npm run bench:gateway -- [--devices 1000] [--entries 50000] [--seconds 10] [--json]
 *
 * Phases: `max` dispatches --entries as fast as the Dispatcher goes, to random devices, and reports
 * entries/s as the devices received them; `half` dispatches at half that rate for --seconds and
 * reports p50/p99 latency. Servers: the harness's own nats-server and redis-server, one worker, one
 * gateway; devices run in a separate process (bench/device-load.ts).
 */
import { parseArgs } from "node:util";
import { spawn } from "node:child_process";
import { cpus } from "node:os";
import { createInterface } from "node:readline";
import { readFileSync } from "node:fs";
import { connect } from "@nats-io/transport-node";
import { Dispatcher, RegistryClient } from "../protocol/io/index.js";
import { startInfra, initStack, spawnWorker, spawnGateway, type JetgateProcess } from "../test/harness/stack.js";
import { waitFor } from "../test/harness/wait.js";
import { Window } from "./window.js";

const { values } = parseArgs({
  options: {
    devices: { type: "string", default: "1000" },
    entries: { type: "string", default: "50000" },
    seconds: { type: "string", default: "10" },
    json: { type: "boolean", default: false },
  },
});
const devices = Number(values.devices);
const entries = Number(values.entries);
const seconds = Number(values.seconds);

/** CPU seconds a process has used (Linux /proc). */
function cpuSeconds(pid: number): number {
  const f = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
  return (Number(f[11]) + Number(f[12])) / 100;
}

const infra = await startInfra({ JETGATE_SHARDS: "4", JETGATE_LOG_LEVEL: "error", JETGATE_RATE_USER_FRAMES_PER_S: "100000" });
const procs: JetgateProcess[] = [];
try {
  await initStack(infra.env);
  const worker = await spawnWorker(infra.env);
  const gateway = await spawnGateway(infra.env);
  procs.push(worker, gateway);
  await waitFor("the worker owns every shard", async () => (await worker.metric("jetgate_worker_lease_held")) === 4, { timeoutMs: 30_000 });
  const load = spawn(process.execPath, ["--import", "tsx", "bench/device-load.ts", String(gateway.httpPort), String(devices), "u"], { stdio: ["pipe", "pipe", "inherit"] });
  const lines = createInterface({ input: load.stdout! });
  const next = () => new Promise<Record<string, number>>((resolve) => lines.once("line", (l) => resolve(JSON.parse(l) as Record<string, number>)));
  const ready = await next();
  const nc = await connect({ servers: infra.nats.url });
  const registry = await RegistryClient.open(nc);
  const d = new Dispatcher(nc, () => registry.shards, { lanes: ["default"] });
  const body = () => {
    const b = new Uint8Array(64);
    new DataView(b.buffer).setFloat64(0, performance.timeOrigin + performance.now());
    return b;
  };
  let n = 0;
  const one = () => {
    const id = `b${n++}`;
    return d.dispatch({ dispatch_id: id, message_id: id, lane: "default", recipients: [`u${Math.floor(Math.random() * devices)}`], body: body() });
  };
  const report = async () => {
    load.stdin!.write("report\n");
    return next();
  };
  const out = (o: Record<string, unknown>) => console.log(values.json ? JSON.stringify({ bench: "gateway-fanout", devices, ...o }) : Object.entries({ devices, ...o }).map(([k, v]) => `${k}=${v}`).join("  "));
  console.error(`machine: ${cpus().length} cores, ${cpus()[0]?.model}; node ${process.version}; ${ready.ready} devices synced`);

  const pids = { nats: infra.nats.pid!, redis: infra.redis.pid!, worker: worker.pid, gateway: gateway.pid, devices: load.pid! };
  const cpuNow = () => Object.fromEntries(Object.entries(pids).map(([k, pid]) => [k, cpuSeconds(pid)])) as Record<keyof typeof pids, number>;
  const cpuShare = (a: Record<string, number>, b: Record<string, number>, secs: number) =>
    Object.entries(b).map(([k, v]) => `${k}:${Math.round(((v - a[k]!) / secs) * 100)}%`).join(",");

  // max: as fast as possible, bounded in flight
  const cpu0 = cpuNow();
  const t0 = performance.now();
  const inFlight = new Window(5000);
  for (let i = 0; i < entries; i++) await inFlight.add(one());
  await inFlight.drained();
  await waitFor("all delivered", async () => (await gateway.metric("jetgate_gateway_frames_out_total", { type: "MSGS" })) >= entries, { timeoutMs: 300_000, intervalMs: 200 });
  const max = await report();
  const rate = Math.round((max.received! / (max.last! - max.first!)) * 1000);
  out({ phase: "max", delivered: max.received, entries_per_s: rate, p50_ms: max.p50, p99_ms: max.p99, cpu: cpuShare(cpu0, cpuNow(), (performance.now() - t0) / 1000) });

  // half: a steady half of that rate
  const half = Math.max(1, Math.floor(rate / 2));
  const tickMs = 10;
  const perTick = Math.max(1, Math.round((half * tickMs) / 1000));
  const cpu1 = cpuNow();
  const started = performance.now();
  const until = started + seconds * 1000;
  const sent: Promise<unknown>[] = [];
  const msgsBefore = await gateway.metric("jetgate_gateway_frames_out_total", { type: "MSGS" });
  while (performance.now() < until) {
    const t = performance.now();
    for (let i = 0; i < perTick; i++) sent.push(one());
    const wait = tickMs - (performance.now() - t);
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
  }
  const actualRate = Math.round(sent.length / ((performance.now() - started) / 1000));
  await Promise.all(sent);
  await waitFor("every half-phase entry delivered", async () => (await gateway.metric("jetgate_gateway_frames_out_total", { type: "MSGS" })) >= msgsBefore + sent.length, { timeoutMs: 60_000, intervalMs: 100 });
  const h = await report();
  out({ phase: "half", dispatched: sent.length, dispatched_per_s: actualRate, delivered: h.received, p50_ms: h.p50, p99_ms: h.p99, max_ms: h.max, cpu: cpuShare(cpu1, cpuNow(), (performance.now() - started) / 1000) });
  out({
    phase: "checks",
    gateway_regressions: await gateway.metric("jetgate_mailbox_seq_regression_total"),
    worker_regressions: await worker.metric("jetgate_mailbox_seq_regression_total"),
    gap_fills: await gateway.metric("jetgate_gateway_gap_fills_total"),
  });
  load.stdin!.write("exit\n");
  d.close();
  await registry.close();
  await nc.close();
} finally {
  for (const p of procs) await p.kill();
  await infra.dispose();
}
