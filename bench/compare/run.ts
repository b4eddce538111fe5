/**
 * jetgate side by side with the ceiling of its WebSocket layer (uws-limit), the floor of storing
 * every entry in JetStream (jetstream-limit) and Socket.IO, in one run, on one machine, with one
 * device load generator (bench/compare/devices.ts, its own process).
 *
 *   npm run bench -- <fanout|idle|storm|catchup> [--devices N] [--seconds S] [--entries N]
 *                    [--systems jetgate,uws-limit,jetstream-limit,socketio] [--json]
 *
 * fanout:  N devices (1,000), entries to random users: the throughput each system sustains (sent as
 *          fast as it takes them for S seconds, measured at the devices), then p50/p99
 *          dispatch-to-device latency at half of it.
 * idle:    N authenticated idle devices (15,000): server RSS per connection.
 * storm:   N devices (10,000) each miss 10 entries while offline, then reconnect at once (with their
 *          cursors / recovery state): time until every one is SYNCED with its entries; peak RSS.
 * catchup: one device --entries (100,000) behind: entries/s until SYNCED.
 * With --json: one object per line per system, then a summary line of throughput ratios.
 */
import { parseArgs } from "node:util";
import { cpus } from "node:os";
import { readFileSync } from "node:fs";
import { execFileSync } from "node:child_process";
import { LineProcess, SYSTEMS, startSystem, type System, type SystemName } from "./systems.js";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    devices: { type: "string" },
    seconds: { type: "string", default: "8" },
    entries: { type: "string", default: "100000" },
    "idle-seconds": { type: "string", default: "60" },
    "deadline-seconds": { type: "string", default: "120" },
    systems: { type: "string", default: SYSTEMS.join(",") },
    json: { type: "boolean", default: false },
  },
});
const SCENARIOS = { fanout: 1000, idle: 15_000, storm: 10_000, catchup: 1 } as const;
type Scenario = keyof typeof SCENARIOS;
const scenario = positionals[0] as Scenario;
if (!(scenario in SCENARIOS)) {
  console.error(`usage: npm run bench -- <${Object.keys(SCENARIOS).join("|")}> [--devices N] [--seconds S] [--entries N] [--systems a,b] [--json]`);
  process.exit(64);
}
const devices = Number(values.devices ?? SCENARIOS[scenario]);
const seconds = Number(values.seconds);
const entries = Number(values.entries);
const idleSeconds = Number(values["idle-seconds"]);
const deadlineSeconds = Number(values["deadline-seconds"]);
const systems = values.systems.split(",") as SystemName[];
for (const s of systems) if (!SYSTEMS.includes(s)) throw new Error(`unknown system ${s}; one of ${SYSTEMS.join(", ")}`);

/** A process that has exited reads as NaN (and shows as such in the row) instead of ending the run. */
function proc(pid: number, file: string): string | undefined {
  try {
    return readFileSync(`/proc/${pid}/${file}`, "utf8");
  } catch {
    return undefined;
  }
}

function rssMb(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(proc(pid, "status") ?? "");
  return m ? Number(m[1]) / 1024 : NaN;
}

function cpuSeconds(pid: number): number {
  const f = proc(pid, "stat")?.split(") ")[1]?.split(" ");
  return f ? (Number(f[11]) + Number(f[12])) / 100 : NaN;
}

/**
 * CPU of each process of the system (and the device generator) between start and stop: each one's
 * share of a core, and its CPU microseconds per delivered entry (`us_per_entry`, with `total`: the
 * system's processes together, devices excluded).
 */
function cpuShares(pids: Record<string, number>) {
  const t0 = performance.now();
  const c0 = Object.fromEntries(Object.entries(pids).map(([k, pid]) => [k, cpuSeconds(pid)]));
  return (delivered: number) => {
    const secs = (performance.now() - t0) / 1000;
    const used = Object.fromEntries(Object.entries(pids).map(([k, pid]) => [k, cpuSeconds(pid) - c0[k]!]));
    const usPer = Object.fromEntries(Object.entries(used).map(([k, c]) => [k, Number(((c / delivered) * 1e6).toFixed(1))]));
    const total = Object.entries(usPer).filter(([k]) => k !== "devices").reduce((n, [, v]) => n + v, 0);
    return {
      shares: Object.entries(used).map(([k, c]) => `${k}:${Math.round((c / secs) * 100)}%`).join(","),
      usPerEntry: { ...usPer, total: Number(total.toFixed(1)) },
    };
  };
}

/** Samples a process's RSS (peak) and CPU share between start and stop. */
function meter(pid: number) {
  const cpu0 = cpuSeconds(pid);
  const t0 = performance.now();
  let peak = rssMb(pid);
  const timer = setInterval(() => {
    const r = rssMb(pid);
    if (!Number.isNaN(r)) peak = Math.max(peak, r);
  }, 100);
  return {
    stop() {
      clearInterval(timer);
      const r = rssMb(pid);
      if (!Number.isNaN(r)) peak = Math.max(peak, r);
      return { peakMb: Math.round(peak), cpuPct: Math.round(((cpuSeconds(pid) - cpu0) / ((performance.now() - t0) / 1000)) * 100) };
    },
  };
}

interface Row {
  scenario: Scenario;
  system: SystemName;
  devices: number;
  entries_per_s: number | null;
  p50_ms: number | null;
  p99_ms: number | null;
  server_rss_mb: number;
  server_cpu_pct: number;
  [extra: string]: unknown;
}

/** BENCH_DEBUG=1: each step of a scenario on stderr, with the time. */
const step = (what: string) => {
  if (process.env.BENCH_DEBUG) console.error(`${new Date().toISOString()} ${what}`);
};

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Reports until the devices have received nothing new for a second (the system has drained). */
async function settled(gen: LineProcess): Promise<Record<string, number>> {
  const all: Record<string, number>[] = [];
  for (;;) {
    await sleep(1000);
    const r = await gen.ask({ cmd: "report" });
    all.push(r);
    if (r.received === 0 && all.length > 1) break;
  }
  // latencies are per report; throughput spans them all
  const got = all.filter((r) => r.received! > 0);
  return {
    received: got.reduce((n, r) => n + r.received!, 0),
    first: Math.min(...got.map((r) => r.first!)),
    last: Math.max(...got.map((r) => r.last!)),
    p50: Math.max(...got.map((r) => r.p50!)),
    p99: Math.max(...got.map((r) => r.p99!)),
    max: Math.max(...got.map((r) => r.max!)),
  };
}

/** Messages nats-server has taken in and sent out so far (its /varz), when the system has one. */
async function natsMessages(sys: System): Promise<number | undefined> {
  if (sys.natsMonitorPort === undefined) return undefined;
  const v = (await (await fetch(`http://127.0.0.1:${sys.natsMonitorPort}/varz`)).json()) as { in_msgs: number; out_msgs: number };
  return v.in_msgs + v.out_msgs;
}

async function fanout(sys: System, gen: LineProcess): Promise<Row> {
  await gen.ask({ cmd: "connect", count: devices, prefix: "u" });
  const natsBefore = await natsMessages(sys);
  const m = meter(sys.serverPid);
  const shares = cpuShares({ ...sys.pids, devices: gen.proc.pid! });
  const sent = await sys.sendFor(seconds, devices);
  const max = await settled(gen);
  const cpu = m.stop();
  const cpuMax = shares(max.received!);
  const natsAfter = await natsMessages(sys);
  // every message in and out (publishes, acks, deliveries, pull requests, consumer acks)
  const natsPerEntry = natsBefore !== undefined && natsAfter !== undefined ? Number(((natsAfter - natsBefore) / max.received!).toFixed(2)) : undefined;
  const rate = Math.round((max.received! / (max.last! - max.first!)) * 1000);
  // half load: latency is measured from a report that covers only this phase
  await gen.ask({ cmd: "report" });
  const sentHalf = await sys.sendFor(seconds, devices, Math.max(1, Math.floor(rate / 2)));
  await sleep(1500);
  const half = await gen.ask({ cmd: "report" });
  return {
    scenario, system: sys.name, devices, entries_per_s: rate, p50_ms: half.p50!, p99_ms: half.p99!, server_rss_mb: cpu.peakMb, server_cpu_pct: cpu.cpuPct,
    cpu_max: cpuMax.shares, us_per_entry: cpuMax.usPerEntry, nats_msgs_per_entry: natsPerEntry, sent_max: sent, delivered_max: max.received, sent_half: sentHalf, delivered_half: half.received, half_rate: Math.floor(rate / 2),
  };
}

/**
 * RSS per idle connection in steady state: what the server holds once the garbage of the connect
 * burst is collected. V8 collects it by itself when allocation stops (its memory reducer, here
 * 30-45 s after a burst), so the server idles --idle-seconds (60) before the baseline reading, and
 * the connections idle as long before the second; the peak after connecting is reported too.
 */
async function idle(sys: System, gen: LineProcess): Promise<Row> {
  // the baseline in steady state too: the start-up's garbage is collected the same way
  await sleep(idleSeconds * 1000);
  const before = rssMb(sys.serverPid);
  const m = meter(sys.serverPid);
  const conn = await gen.ask({ cmd: "connect", count: devices, prefix: "u" });
  await sleep(idleSeconds * 1000);
  const after = rssMb(sys.serverPid);
  const cpu = m.stop();
  const perConn = (mb: number) => Number((((mb - before) * 1024) / devices).toFixed(2));
  return {
    scenario, system: sys.name, devices, entries_per_s: null, p50_ms: null, p99_ms: null, server_rss_mb: Math.round(after), server_cpu_pct: cpu.cpuPct,
    rss_before_mb: Math.round(before), rss_per_conn_kib: perConn(after), peak_rss_mb: cpu.peakMb, peak_per_conn_kib: perConn(cpu.peakMb), idle_s: idleSeconds, connect_ms: conn.ms,
  };
}

async function storm(sys: System, gen: LineProcess, perUser: number): Promise<Row> {
  step("connect");
  await gen.ask({ cmd: "connect", count: devices, prefix: "u" });
  // in sync first (each device has its user's latest entry), then offline while entries arrive
  step("one entry each");
  await sys.sendEach(devices, 1);
  const first = await gen.ask({ cmd: "wait", expect: 1, deadlineMs: deadlineSeconds * 1000 });
  if ((first.timed_out as unknown) === true) throw new Error(`${first.short} devices never got their first entry within ${deadlineSeconds} s:\n${sys.logs().join("\n")}`);
  step("drop");
  await gen.ask({ cmd: "drop" });
  await sleep(1000);
  step(`${perUser} entries each, offline`);
  await sys.sendEach(devices, perUser);
  await gen.ask({ cmd: "report" });
  step("reconnect");
  const m = meter(sys.serverPid);
  const shares = cpuShares({ ...sys.pids, devices: gen.proc.pid! });
  const r = await gen.ask({ cmd: "reconnect", expect: perUser, deadlineMs: deadlineSeconds * 1000 });
  const cpu = m.stop();
  const cpuAll = shares(Math.max(1, r.received!));
  await gen.ask({ cmd: "report" });
  const total = devices * perUser;
  const timedOut = (r.timed_out as unknown) === true;
  return {
    scenario, system: sys.name, devices, entries_per_s: Math.round((r.received! / r.elapsed_ms!) * 1000), p50_ms: null, p99_ms: null,
    server_rss_mb: cpu.peakMb, server_cpu_pct: cpu.cpuPct, cpu: cpuAll.shares, us_per_entry: cpuAll.usPerEntry, retries: r.retries, synced_ms: r.synced_ms, complete_ms: r.complete_ms,
    synced: r.synced, completed: r.completed, received: r.received, entries_behind: perUser,
    note: timedOut ? `not done after ${deadlineSeconds} s: ${r.completed} of ${devices} devices complete, ${r.received} of ${total} entries` : undefined,
  };
}

// jetgate runs compiled, as in its container image (npm run build; see test/harness/stack.ts)
if (systems.includes("jetgate")) {
  execFileSync("npm", ["run", "--silent", "build"], { stdio: ["ignore", "ignore", "inherit"] });
  process.env.JETGATE_HARNESS_DIST = "1";
}

const rows: Row[] = [];
const machine = `${cpus().length} cores (${cpus()[0]?.model.trim()}), node ${process.version}`;
if (!values.json) console.log(`bench ${scenario}: ${devices} devices; ${machine}; ${new Date().toISOString()}`);
for (const name of systems) {
  const sys = await startSystem(name);
  const gen = LineProcess.node("bench/compare/devices.ts", [name, sys.url]);
  try {
    const row = scenario === "fanout" ? await fanout(sys, gen)
      : scenario === "idle" ? await idle(sys, gen)
      : scenario === "storm" ? await storm(sys, gen, 10)
      : { ...(await storm(sys, gen, entries)), scenario };
    rows.push(row);
    if (values.json) console.log(JSON.stringify(row));
    else console.log(Object.entries(row).filter(([, v]) => v !== undefined).map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join("  "));
  } finally {
    gen.proc.stdin!.write(JSON.stringify({ cmd: "exit" }) + "\n");
    await gen.stop();
    await sys.stop();
  }
}
const rate = (s: SystemName) => rows.find((r) => r.system === s)?.entries_per_s ?? null;
const ratio = (a: number | null, b: number | null) => (a !== null && b !== null && b > 0 ? Number((a / b).toFixed(3)) : null);
const summary = {
  scenario, summary: true, ratio_vs_limit: ratio(rate("jetgate"), rate("uws-limit")), ratio_vs_jetstream_limit: ratio(rate("jetgate"), rate("jetstream-limit")),
  ratio_vs_socketio: ratio(rate("jetgate"), rate("socketio")), machine, date: new Date().toISOString(),
};
console.log(values.json ? JSON.stringify(summary) : Object.entries(summary).map(([k, v]) => `${k}=${v}`).join("  "));
process.exit(0);
