/**
 * jetgate side by side with the ceiling of its WebSocket layer (uws-limit), the floor of storing
 * every entry in JetStream (jetstream-limit), Socket.IO and Centrifugo (bench/compare/centrifugo.ts),
 * in one run, on one machine, with one device load generator (bench/compare/devices.ts, its own process).
 *
 *   npm run bench -- <fanout|hot|idle|storm|catchup> [--devices N] [--users U] [--seconds S] [--entries N]
 *                    [--systems jetgate,uws-limit,jetstream-limit,socketio,centrifugo] [--nodes N] [--shards S]
 *                    [--generators G] [--json]
 *
 * fanout:  N devices (1,000), entries to random users: the throughput each system sustains (sent as
 *          fast as it takes them for S seconds, measured at the devices), then p50/p99
 *          dispatch-to-device latency at half of it.
 * hot:     N devices (1,000) of U users (20: 50 devices each), each user's entries dispatched back
 *          to back: as fanout, with every entry going to all of its user's devices (Socket.IO: a
 *          room per user); entries_per_s counts deliveries, dispatched_per_s the entries.
 * idle:    N authenticated idle devices (15,000): server RSS per connection. --steps 10000,50000,100000
 *          reads it at each count (after the same idle time) and reports the slope of RSS against
 *          connections (what one more costs) apart from the fixed part, with jetgate's V8 heap.
 * storm:   N devices (10,000) each miss 10 entries while offline, then reconnect at once (with their
 *          cursors / recovery state): time until every one is SYNCED with its entries; peak RSS.
 * catchup: one device --entries (100,000) behind: entries/s until SYNCED.
 * fanout and hot also report each system's sustained rate (`sustained_per_s`): the highest of
 * --probes (4) paced runs of S seconds whose p99 stays under 1 s with 99% delivered, so that a
 * backlog never counts as throughput; half load is half of it. jetgate's rows name their stages
 * (protocol/stages.ts: p50/p99 per stage at the max and at half load) and the bound at the max.
 * --nodes N: N copies of every process of a system that scales out (bench/compare/systems.ts), S
 * shard streams (default 2N, at least 4), and N device generator processes, each with its share of
 * the devices. --generators G: G device generator processes instead of N (a generator can bound
 * `hot` before the system does). BENCH_GENERATOR_CPUS=<list> pins the generators to those CPUs
 * (`taskset`), so that `taskset -c 0,1 npm run bench ...` gives the system two cores and the
 * devices their own. BENCH_SOURCE=1 runs jetgate from its sources instead of its build (the test suite).
 * --cluster: every system on a 3-node NATS cluster with R3 shard streams and a 3-master Redis
 * Cluster instead of one server of each (bench/compare/topology.ts); rows name it (`topology`).
 * With --json: one object per line per system, then a summary line of throughput ratios.
 */
import { parseFlags, usageError } from "../../protocol/io/index.js";
import { availableParallelism, cpus } from "node:os";
import { readFileSync } from "node:fs";
import { execFileSync } from "node:child_process";
import { LineProcess, PUSH_LATENCY_BOUNDS, SYSTEMS, type System, type SystemName } from "./system-parts.js";
import { startSystem } from "./systems.js";
import type { TopologyKind } from "./topology.js";
import { merge, quantile, type Histogram } from "./entries.js";
import { STAGES, stageQuantileMs, type StageCounts } from "../../protocol/index.js";
import { NATS_BIN } from "../../test/harness/servers.js";
import { fileLimit } from "../../gateway/files.js";
import { GATEWAY_NODE_FLAGS } from "../../gateway/node-flags.js";
import { Redis } from "ioredis";

const USAGE = `usage: npm run bench -- <fanout|hot|idle|storm|catchup> [--devices N] [--users U] [--seconds S] [--entries N]
                   [--idle-seconds S] [--deadline-seconds S] [--connect-seconds S] [--steps N,N,...] [--systems ${SYSTEMS.join(",")}]
                   [--nodes N] [--shards S] [--generators G] [--cluster] [--probes N] [--json]
  jetgate beside the ceiling of its WebSocket layer, the floor of JetStream, Socket.IO and Centrifugo (bench/README.md)`;

const { values, positionals } = parseFlags({
  allowPositionals: true,
  options: {
    devices: { type: "string" },
    users: { type: "string" },
    seconds: { type: "string", default: "8" },
    entries: { type: "string", default: "100000" },
    "idle-seconds": { type: "string", default: "60" },
    "deadline-seconds": { type: "string", default: "120" },
    "connect-seconds": { type: "string" },
    steps: { type: "string" },
    systems: { type: "string", default: SYSTEMS.join(",") },
    nodes: { type: "string", default: "1" },
    shards: { type: "string" },
    generators: { type: "string" },
    cluster: { type: "boolean", default: false },
    probes: { type: "string", default: "4" },
    json: { type: "boolean", default: false },
  },
}, USAGE);
const SCENARIOS = { fanout: 1000, hot: 1000, idle: 15_000, storm: 10_000, catchup: 1 } as const;
type Scenario = keyof typeof SCENARIOS;
const scenario = positionals[0] as Scenario;
if (!(scenario in SCENARIOS)) usageError(scenario === undefined ? "which scenario?" : `unknown scenario ${scenario}`, USAGE);
/** idle: the device counts to read the server's memory at (--steps 10000,50000,100000); the last one is --devices. */
const stepList = values.steps?.split(",").map(Number);
const devices = Number(values.devices ?? stepList?.[stepList.length - 1] ?? SCENARIOS[scenario]);
/** Users the devices belong to (device i to user u(i mod users)): one each but in `hot`. */
const users = Number(values.users ?? (scenario === "hot" ? 20 : devices));
if (!Number.isInteger(users) || users < 1 || users > devices) usageError(`--users must be an integer from 1 to --devices, got ${String(values.users)}`, USAGE);
const seconds = Number(values.seconds);
const entries = Number(values.entries);
const idleSeconds = Number(values["idle-seconds"]);
const deadlineSeconds = Number(values["deadline-seconds"]);
/** How long the devices may take to connect (about 250 a second at worst, at least --deadline-seconds). */
const connectSeconds = Number(values["connect-seconds"] ?? Math.max(deadlineSeconds, Math.ceil(devices / 250)));
const steps = stepList ?? [devices];
if (steps.some((k, i) => !Number.isInteger(k) || k < 1 || (i > 0 && k <= steps[i - 1]!)) || steps[steps.length - 1] !== devices) {
  usageError(`--steps must be increasing device counts ending at --devices (${devices}), got ${String(values.steps)}`, USAGE);
}
const systems = values.systems.split(",") as SystemName[];
for (const s of systems) if (!SYSTEMS.includes(s)) throw new Error(`unknown system ${s}; one of ${SYSTEMS.join(", ")}`);
const nodes = Number(values.nodes);
const shards = Number(values.shards ?? Math.max(4, 2 * nodes));
const generators = Number(values.generators ?? nodes);
/** --cluster: a 3-node NATS cluster with R3 shard streams and a 3-master Redis Cluster (bench/compare/topology.ts). */
const topology: TopologyKind = values.cluster ? "cluster" : "single";
/** CPUs the device generators are pinned to (`taskset` list), apart from the system's. */
const generatorCpus = process.env.BENCH_GENERATOR_CPUS || undefined;
const probeCount = Number(values.probes);
if (!Number.isInteger(probeCount) || probeCount < 1) usageError(`--probes must be a positive integer, got ${values.probes}`, USAGE);
if (!Number.isInteger(generators) || generators < 1) usageError(`--generators must be a positive integer, got ${String(values.generators)}`, USAGE);
for (const [flag, v] of [["--nodes", nodes], ["--shards", shards]] as const) {
  if (!Number.isInteger(v) || v < 1) throw new Error(`${flag} must be a positive integer, got ${String(v)}`);
}
if (shards < nodes) throw new Error(`--shards ${shards} gives some of the ${nodes} workers nothing to do: use at least --nodes`);

/** A file under /proc, undefined when it cannot be read (a process that has exited, a system without /proc). */
function procFile(path: string): string | undefined {
  try {
    return readFileSync(`/proc/${path}`, "utf8");
  } catch {
    return undefined;
  }
}

/** A process that has exited reads as NaN (and shows as such in the row) instead of ending the run. */
const proc = (pid: number, file: string) => procFile(`${pid}/${file}`);

function rssMb(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(proc(pid, "status") ?? "");
  return m ? Number(m[1]) / 1024 : NaN;
}

/** RSS of several processes together (the servers of --nodes N). */
const rssOf = (pids: number[]) => pids.reduce((n, pid) => n + rssMb(pid), 0);

function cpuSeconds(pid: number): number {
  const f = proc(pid, "stat")?.split(") ")[1]?.split(" ");
  return f ? (Number(f[11]) + Number(f[12])) / 100 : NaN;
}

/**
 * CPU of each process of the system (and the device generators) between start and stop: by role
 * (the N processes of a role together), each one's share of a core and its CPU microseconds per
 * delivered entry (`us_per_entry`, with `total`: the system's processes together, devices
 * excluded); with more than one node, each process's share and CPU per entry too (`cpu_procs`,
 * `us_per_process`). `until` (epoch ms, the last delivery) ends the window the shares are of: the
 * wait for the devices to go quiet after it (a second or more of idle) is not the system at work.
 */
function cpuShares(pids: Record<string, number[]>) {
  const t0 = performance.timeOrigin + performance.now();
  const all = Object.entries(pids).flatMap(([role, ps]) => ps.map((pid, k) => ({ name: ps.length > 1 ? `${role}#${k + 1}` : role, role, pid })));
  const c0 = all.map((p) => cpuSeconds(p.pid));
  return (delivered: number, until?: number) => {
    const now = performance.timeOrigin + performance.now();
    const secs = ((until !== undefined && until > t0 && until < now ? until : now) - t0) / 1000;
    const used = all.map((p, i) => ({ ...p, cpu: cpuSeconds(p.pid) - c0[i]! }));
    const byRole = new Map<string, number>();
    for (const u of used) byRole.set(u.role, (byRole.get(u.role) ?? 0) + u.cpu);
    const us = (c: number) => Number(((c / delivered) * 1e6).toFixed(1));
    const usPer = Object.fromEntries([...byRole].map(([k, c]) => [k, us(c)]));
    const total = Object.entries(usPer).filter(([k]) => k !== "devices").reduce((n, [, v]) => n + v, 0);
    const pct = (c: number) => Math.round((c / secs) * 100);
    const several = used.length > byRole.size;
    return {
      secs,
      /** Each process's share of a core (%), and all of them together (devices included). */
      pcts: used.map((u) => ({ name: u.name, role: u.role, pct: pct(u.cpu) })),
      shares: [...byRole].map(([k, c]) => `${k}:${pct(c)}%`).join(","),
      procs: several ? used.map((u) => `${u.name}:${pct(u.cpu)}%`).join(",") : undefined,
      usPerProcess: several ? Object.fromEntries(used.map((u) => [u.name, us(u.cpu)])) : undefined,
      usPerEntry: { ...usPer, total: Number(total.toFixed(1)) },
    };
  };
}

/** The whole machine's busy share (% of all its cores, /proc/stat; undefined elsewhere) between start and stop. */
function machineBusy(): () => number | undefined {
  const read = () => {
    const f = /^cpu\s+(.*)$/m.exec(procFile("stat") ?? "")?.[1]?.split(/\s+/).map(Number);
    // user nice system idle iowait irq softirq steal: busy is all but idle, iowait and steal
    return f === undefined ? undefined : { all: f.slice(0, 8).reduce((a, b) => a + b, 0), idle: f[3]! + f[4]! + f[7]! };
  };
  const a = read();
  return () => {
    const b = read();
    if (a === undefined || b === undefined || b.all === a.all) return undefined;
    return Math.round((1 - (b.idle - a.idle) / (b.all - a.all)) * 100);
  };
}

/** Samples the RSS (peak) of processes together and their CPU share between start and stop. */
function meter(pids: number[]) {
  const cpu = () => pids.reduce((n, pid) => n + cpuSeconds(pid), 0);
  const cpu0 = cpu();
  const t0 = performance.now();
  let peak = rssOf(pids);
  const timer = setInterval(() => {
    const r = rssOf(pids);
    if (!Number.isNaN(r)) peak = Math.max(peak, r);
  }, 100);
  return {
    stop() {
      clearInterval(timer);
      const r = rssOf(pids);
      if (!Number.isNaN(r)) peak = Math.max(peak, r);
      return { peakMb: Math.round(peak), cpuPct: Math.round(((cpu() - cpu0) / ((performance.now() - t0) / 1000)) * 100) };
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

/** A device report, merged over the generators. */
interface Report {
  received: number;
  first: number;
  last: number;
  hist: Histogram;
  duplicates: number;
  /** The generators' longest event-loop delay (ms): a stall of the generator itself is in every latency it measures. */
  stall_ms: number;
  /** The generators' GC: time (ms, summed), longest pause (ms) and the largest generator's heap (MiB). */
  gc_ms: number;
  gc_max_ms: number;
  heap_mb: number;
  /** How long the generators' main threads waited for a CPU while runnable (ms, all of them together; Linux). */
  cpu_wait_ms: number;
}

/** Reports of several generators, or of one over several periods: counts and latencies add up, the span covers them all. */
function mergeReports(rs: Report[]): Report {
  const got = rs.filter((r) => r.received > 0);
  return {
    received: rs.reduce((n, r) => n + r.received, 0),
    first: got.length > 0 ? Math.min(...got.map((r) => r.first)) : 0,
    last: got.length > 0 ? Math.max(...got.map((r) => r.last)) : 0,
    hist: rs.reduce((h, r) => merge(h, r.hist), {} as Histogram),
    duplicates: rs.reduce((n, r) => n + r.duplicates, 0),
    stall_ms: Math.max(0, ...rs.map((r) => r.stall_ms ?? 0)),
    gc_ms: rs.reduce((n, r) => n + (r.gc_ms ?? 0), 0),
    gc_max_ms: Math.max(0, ...rs.map((r) => r.gc_max_ms ?? 0)),
    heap_mb: Math.max(0, ...rs.map((r) => r.heap_mb ?? 0)),
    cpu_wait_ms: rs.reduce((n, r) => n + (r.cpu_wait_ms ?? 0), 0),
  };
}

/**
 * The device generators (bench/compare/devices.ts): one process per node, device i (user `u<i>`)
 * in generator i mod N, connected where the system places it. Answers are merged.
 */
class Generators {
  readonly procs: LineProcess[];
  constructor(private readonly sys: System, n: number) {
    // BENCH_PROFILE=devices: the generators run under --cpu-prof (a generator can be what bounds a run)
    const prof = process.env.BENCH_PROFILE === "devices" ? ["--cpu-prof", `--cpu-prof-dir=${process.env.BENCH_PROFILE_DIR ?? "bench/profiles"}`] : [];
    // a generator holding 100,000 devices' sockets needs more heap than node's default
    this.procs = Array.from({ length: n }, () => LineProcess.node("bench/compare/devices.ts", [sys.name], {}, ["--max-old-space-size=8192", ...prof]));
    if (generatorCpus) for (const pid of this.pids) execFileSync("taskset", ["-a", "-p", "-c", generatorCpus, String(pid)], { stdio: "ignore" });
  }

  get pids(): number[] {
    return this.procs.map((p) => p.proc.pid!);
  }

  private all(o: object): Promise<Record<string, unknown>[]> {
    return Promise.all(this.procs.map((p) => p.ask(o) as Promise<Record<string, unknown>>));
  }

  /** Devices 0..count-1, device i of user u(i mod userCount); with several devices a user, each its own device id. */
  /**
   * Connects devices `from`..count-1 (those before stay connected), device i of user u(i mod
   * userCount); with several devices a user, each its own device id. Devices that have not
   * connected within --connect-seconds end the run with what held them (never a wait for ever).
   */
  async connect(count: number, userCount = count, from = 0): Promise<{ ms: number }> {
    const n = this.procs.length;
    const answers = await Promise.all(this.procs.map((p, g) => {
      const mine = Array.from({ length: count - from }, (_, j) => from + j).filter((i) => i % n === g);
      const ids = userCount < count ? { devices: mine.map((i) => `d${i}`) } : {};
      return p.ask({ cmd: "connect", users: mine.map((i) => `u${i % userCount}`), urls: mine.map((i) => this.sys.deviceUrl(i)), deadlineMs: connectSeconds * 1000, ...ids });
    }));
    const failed = answers.reduce((k, a) => k + (a.failed ?? 0), 0);
    if (failed > 0) {
      const refused = answers.reduce((k, a) => k + (a.refused ?? 0), 0);
      throw new Error(`${failed} of ${count - from} devices did not connect within ${connectSeconds} s (--connect-seconds)${refused > 0 ? `; ${refused} attempts were answered with an HTTP status (503: the server at capacity: its open files limit or JETGATE_MAX_CONNECTIONS)` : ""}; this process may open ${fileLimit().soft} files (ulimit -n), the servers as many`);
    }
    return { ms: Math.max(...answers.map((a) => a.ms!)) };
  }

  async report(): Promise<Report> {
    return mergeReports((await this.all({ cmd: "report" })) as unknown as Report[]);
  }

  /** Every device has `expect` entries on its current connection, or the deadline passed. */
  async wait(expect: number): Promise<{ timed_out: boolean; short: number }> {
    const rs = await this.all({ cmd: "wait", expect, deadlineMs: deadlineSeconds * 1000 });
    return { timed_out: rs.some((r) => r.timed_out === true), short: rs.reduce((n, r) => n + (r.short as number), 0) };
  }

  async drop(): Promise<void> {
    await this.all({ cmd: "drop" });
  }

  /** Every generator reconnects its devices at once; the slowest one's times. */
  async reconnect(expect: number): Promise<Record<string, number | boolean | null>> {
    const rs = await this.all({ cmd: "reconnect", expect, deadlineMs: deadlineSeconds * 1000 });
    const total = (k: string) => rs.reduce((n, r) => n + (r[k] as number), 0);
    const slowest = (k: string) => (rs.some((r) => r[k] === null) ? null : Math.max(...rs.map((r) => r[k] as number)));
    return {
      synced_ms: slowest("synced_ms"), complete_ms: slowest("complete_ms"), elapsed_ms: slowest("elapsed_ms"),
      synced: total("synced"), completed: total("completed"), received: total("received"), retries: total("retries"),
      timed_out: rs.some((r) => r.timed_out === true),
    };
  }

  async stop(): Promise<void> {
    for (const p of this.procs) {
      p.proc.stdin!.write(JSON.stringify({ cmd: "exit" }) + "\n");
      await p.stop();
    }
  }
}

/** Reports until the devices have received nothing new for a second (the system has drained). */
async function settled(gens: Generators): Promise<Report> {
  const all: Report[] = [];
  for (;;) {
    await sleep(1000);
    const r = await gens.report();
    all.push(r);
    if (r.received === 0 && all.length > 1) break;
  }
  return mergeReports(all);
}

/** Messages nats-server has taken in and sent out so far (its /varz), when the system has one. */
async function natsMessages(sys: System): Promise<number | undefined> {
  if (sys.natsMonitorPorts === undefined) return undefined;
  // on a cluster, every node's: the routes between them (R3 replication, interest) are messages too
  const varz = await Promise.all(sys.natsMonitorPorts.map(async (port) => (await (await fetch(`http://127.0.0.1:${port}/varz`)).json()) as { in_msgs: number; out_msgs: number }));
  return varz.reduce((n, v) => n + v.in_msgs + v.out_msgs, 0);
}

/**
 * Calls of each command Redis has run so far (INFO commandstats; a script's commands count too),
 * and the microseconds it spent in each (`usec:<name>`), when the system has a Redis.
 */
async function redisCommands(sys: System): Promise<Map<string, number> | undefined> {
  if (sys.redisUrls === undefined) return undefined;
  const out = new Map<string, number>();
  // each node of a cluster on its own (INFO is per node), summed
  for (const url of sys.redisUrls) {
    const r = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 1 });
    try {
      await r.connect();
      const text = await r.info("commandstats");
      for (const m of text.matchAll(/^cmdstat_([^:]+):calls=(\d+),usec=(\d+)/gm)) {
        out.set(m[1]!, (out.get(m[1]!) ?? 0) + Number(m[2]));
        out.set(`usec:${m[1]!}`, (out.get(`usec:${m[1]!}`) ?? 0) + Number(m[3]));
      }
    } finally {
      r.disconnect();
    }
  }
  return out;
}

/**
 * Commands per entry between two readings: in all, and the commands above 0.005 per entry by name;
 * and Redis's time per entry in each command above 0.05 us (INFO commandstats; a script's time
 * includes its commands', which are listed too).
 */
function redisPerEntry(before: Map<string, number> | undefined, after: Map<string, number> | undefined, entries: number) {
  if (before === undefined || after === undefined || entries === 0) return {};
  const delta = [...after].map(([k, v]) => [k, (v - (before.get(k) ?? 0)) / entries] as const);
  const calls = delta.filter(([k]) => !k.startsWith("usec:"));
  const byName = calls.filter(([, v]) => v >= 0.005).sort((a, b) => b[1] - a[1]);
  const total = calls.reduce((n, [, v]) => n + v, 0);
  const usecByName = delta.filter(([k, v]) => k.startsWith("usec:") && v >= 0.05).sort((a, b) => b[1] - a[1]);
  return {
    redis_cmds_per_entry: Number(total.toFixed(2)), redis_cmds_by_name: Object.fromEntries(byName.map(([k, v]) => [k, Number(v.toFixed(3))])),
    redis_us_by_name: Object.fromEntries(usecByName.map(([k, v]) => [k.slice(5), Number(v.toFixed(2))])),
  };
}

/** Connections the gateways closed between two readings, by close code (those above 0). */
function closesByCode(before: Record<string, number> | undefined, after: Record<string, number>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [k, v] of Object.entries(after)) if (k.startsWith("close_") && v - (before?.[k] ?? 0) > 0) out[k.slice(6)] = v - (before?.[k] ?? 0);
  return out;
}

/** a / b to two decimals; undefined when either is unknown or b is 0. */
const per = (a: number | undefined, b: number | undefined) => (a === undefined || b === undefined || b === 0 ? undefined : Number((a / b).toFixed(2)));

/** Per stage, p50 and p99 (ms, the upper bound of the bucket) and the entries counted, between two readings. */
function stageSummary(before: Record<string, StageCounts> | undefined, after: Record<string, StageCounts> | undefined) {
  if (before === undefined || after === undefined) return undefined;
  const out: Record<string, { p50_ms: number | undefined; p99_ms: number | undefined; n: number }> = {};
  for (const stage of STAGES) {
    const a = after[stage];
    if (a === undefined) continue;
    const b = before[stage];
    const d = a.map((n, i) => n - (b?.[i] ?? 0));
    const n = d.reduce((x, y) => x + y, 0);
    if (n > 0) out[stage] = { p50_ms: stageQuantileMs(d, 0.5), p99_ms: stageQuantileMs(d, 0.99), n };
  }
  return out;
}

/**
 * What bounds a system at its max rate: the machine (every process, the device generators too, at
 * >= 90% of the cores; with the generators pinned apart, BENCH_GENERATOR_CPUS, the system's
 * processes at >= 90% of the cores left to them), else a saturated process (>= 85% of a core), else
 * the stage holding the most time at p50 (jetgate; a system without stages: "waiting").
 */
function boundOf(pcts: { name: string; pct: number }[], cores: number, stages: ReturnType<typeof stageSummary>): string {
  const apart = generatorCpus ? (p: { name: string }) => !p.name.startsWith("devices") : () => true;
  const total = pcts.filter(apart).reduce((n, p) => n + p.pct, 0);
  if (total >= 90 * cores) return `machine (${total}% of ${cores} cores)`;
  const busiest = [...pcts].sort((a, b) => b.pct - a.pct)[0];
  if (busiest !== undefined && busiest.pct >= 85) return `process ${busiest.name} (${busiest.pct}% of a core)`;
  const slowest = Object.entries(stages ?? {}).sort((a, b) => (b[1].p50_ms ?? 0) - (a[1].p50_ms ?? 0))[0];
  return slowest === undefined ? `waiting (${total}% of ${cores} cores)` : `stage ${slowest[0]} (p50 <= ${slowest[1].p50_ms} ms; ${total}% of ${cores} cores)`;
}

/**
 * From jetgate's push latency histograms between two readings of the counters: dispatch to the
 * gateway's receipt of the push ("push") or to the worker publishing it ("wpush"), as the bucket
 * bound the quantile falls under (ms).
 */
function pushQuantileOf(before: Record<string, number> | undefined, after: Record<string, number> | undefined, q: number, prefix: "push" | "wpush"): string | undefined {
  if (before === undefined || after === undefined) return undefined;
  const inBucket = (le: string) => after[`${prefix}_le_${le}`]! - before[`${prefix}_le_${le}`]!;
  const total = inBucket("+Inf");
  const le = PUSH_LATENCY_BOUNDS.find((b) => total > 0 && inBucket(b) >= q * total);
  return le === undefined ? undefined : le === "+Inf" ? "> 10000" : `<= ${Number(le) * 1000}`;
}

interface Probe {
  rate: number;
  sent: number;
  delivered: number;
  p99_ms: number;
  ok: boolean;
  /** The device generators' longest event-loop delay over the probe. */
  devices_stall_ms: number;
  /** The device generators' GC over the probe (ms, all of them; the longest pause) and the largest one's heap after it (MiB). */
  devices_gc_ms: number;
  devices_gc_max_ms: number;
  devices_heap_mb: number;
  /**
   * The generators' wait for a CPU while runnable over the probe (ms, together), the whole machine's busy share
   * while the producers sent (% of all cores) and each role's share of a core up to the last
   * delivery: a probe missed with the machine full and the generator waiting for it was bound by the
   * machine, not by a stage.
   */
  devices_cpu_wait_ms: number;
  machine_busy_pct: number | undefined;
  cpu: string;
  /** jetgate's stage times over the probe: where a missed probe's time went; then dispatch to the worker's push and to the gateway's receipt of it, p99. */
  stages?: ReturnType<typeof stageSummary>;
  worker_push_p99_ms?: string | undefined;
  push_p99_ms?: string | undefined;
  /** jetgate's gateways' and workers' longest event-loop delay over the probe (ms). */
  gateway_stall_ms?: number | undefined;
  worker_stall_ms?: number | undefined;
  /** Sessions that read their mailbox for a gap in their pushes, or behind their user's head (the tail check). */
  gap_fills?: number;
  tail_fills?: number;
  /** Entries per MSGS frame the gateways wrote over the probe: what each frame costs a device is paid once per frame. */
  entries_per_msgs_frame?: number | undefined;
}

const fills = (before: Record<string, number> | undefined, after: Record<string, number> | undefined) => {
  if (before === undefined || after === undefined) return {};
  const frames = after.msgsFrames! - before.msgsFrames!;
  return {
    gap_fills: after.gapFills! - before.gapFills!, tail_fills: after.tailFills! - before.tailFills!,
    entries_per_msgs_frame: frames > 0 ? Number(((after.entriesSent! - before.entriesSent!) / frames).toFixed(2)) : undefined,
  };
};

/**
 * The highest rate (deliveries/s) the system sustains: paced runs of `seconds`, the first at 90%
 * of `max`, lower by 40% after a miss, then halfway between the best held and the lowest missed.
 * Held: the producers kept the pace (95%), 99% of the deliveries arrived, and their p99 < 1 s.
 */
async function sustained(sys: System, gens: Generators, max: number): Promise<{ rate: number | null; probes: Probe[] }> {
  const fan = devices / users;
  const probes: Probe[] = [];
  let held: number | undefined;
  let missed = max;
  let r = Math.max(1, Math.floor(max * 0.9));
  for (let k = 0; k < probeCount; k++) {
    await gens.report();
    step(`probe at ${r} deliveries/s`);
    const perS = Math.max(1, Math.floor(r / fan));
    const stagesBefore = await sys.stages?.();
    const countersBefore = await sys.counters?.();
    const shares = cpuShares({ ...sys.pids, devices: gens.pids });
    const busy = machineBusy();
    const sent = await sys.sendFor(seconds, users, perS);
    const busyPct = busy();
    const got = await settled(gens);
    const cpu = shares(got.received, got.last);
    // the counters first: they carry the event-loop delays, which every scrape restarts
    const countersAfter = await sys.counters?.();
    const stages = stageSummary(stagesBefore, await sys.stages?.());
    const pushP99 = pushQuantileOf(countersBefore, countersAfter, 0.99, "push");
    const workerPushP99 = pushQuantileOf(countersBefore, countersAfter, 0.99, "wpush");
    const p99 = quantile(got.hist, 0.99);
    const ok = sent >= 0.95 * perS * seconds && got.received >= 0.99 * sent * fan && p99 < 1000;
    probes.push({ rate: r, sent, delivered: got.received, p99_ms: p99, ok, devices_stall_ms: got.stall_ms, devices_gc_ms: got.gc_ms, devices_gc_max_ms: got.gc_max_ms, devices_heap_mb: got.heap_mb, devices_cpu_wait_ms: got.cpu_wait_ms, machine_busy_pct: busyPct, cpu: cpu.shares, ...(stages !== undefined ? { stages, worker_push_p99_ms: workerPushP99, push_p99_ms: pushP99, gateway_stall_ms: countersAfter?.gatewayLoopMaxMs, worker_stall_ms: countersAfter?.workerLoopMaxMs, ...fills(countersBefore, countersAfter) } : {}) });
    if (ok) held = r;
    else missed = r;
    if (held !== undefined && missed - held <= 0.05 * missed) break;
    r = held === undefined ? Math.max(1, Math.floor(r * 0.6)) : Math.floor((held + missed) / 2);
  }
  return { rate: held ?? null, probes };
}

/** fanout and hot: entries to random users of `users` (one device each in fanout, devices / users in hot). */
async function fanout(sys: System, gens: Generators): Promise<Row> {
  // the servers' memory before any device, to read what a live, receiving connection costs
  const rssAlone = rssOf(sys.serverPids);
  await gens.connect(devices, users);
  // one entry to every user first, unmeasured: a user's first entry is a one-off (its routes and
  // watermarks are made; jetgate's devices fill it as a gap), not the steady state measured here
  step("warm-up: one entry each");
  await sys.sendEach(users, 1);
  await settled(gens);
  const stages0 = await sys.stages?.();
  const natsBefore = await natsMessages(sys);
  const redisBefore = await redisCommands(sys);
  const countersBefore = await sys.counters?.();
  const m = meter(sys.serverPids);
  const shares = cpuShares({ ...sys.pids, devices: gens.pids });
  const sent = await sys.sendFor(seconds, users);
  const max = await settled(gens);
  const cpu = m.stop();
  const cpuMax = shares(max.received, max.last);
  const natsAfter = await natsMessages(sys);
  // every message in and out (publishes, acks, deliveries, pull requests, consumer acks)
  const natsPerEntry = natsBefore !== undefined && natsAfter !== undefined ? Number(((natsAfter - natsBefore) / max.received).toFixed(2)) : undefined;
  // the measuring itself adds a few commands (INFO, the client's own): noise at thousands of entries
  const redis = redisPerEntry(redisBefore, await redisCommands(sys), max.received);
  const countersAfter = await sys.counters?.();
  const d = (k: string) => (countersBefore === undefined || countersAfter === undefined ? undefined : countersAfter[k]! - countersBefore[k]!);
  const rate = Math.round((max.received / (max.last - max.first)) * 1000);
  const stagesMax = stageSummary(stages0, await sys.stages?.());
  const fair = await sustained(sys, gens, rate);
  const halfRate = Math.floor((fair.rate ?? fair.probes[fair.probes.length - 1]!.rate) / 2);
  // half load: latency over this phase only, until the devices have had everything
  await gens.report();
  const stages1 = await sys.stages?.();
  const countersBeforeHalf = await sys.counters?.();
  // the rate is deliveries; the senders' rate is entries (each goes to devices / users devices)
  const halfMeter = meter(sys.serverPids);
  const sentHalf = await sys.sendFor(seconds, users, Math.max(1, Math.floor(halfRate / (devices / users))));
  const half = await settled(gens);
  // what each connection costs while every device is live and receiving (half load), over the servers with no device
  const busyKib = Number((((halfMeter.stop().peakMb - rssAlone) * 1024) / devices).toFixed(2));
  const countersHalf = await sys.counters?.();
  const stagesHalf = stageSummary(stages1, await sys.stages?.());
  // dispatch -> worker's push and dispatch -> gateway (the processes' push latency histograms, their bucket bounds) at half load
  const pushQuantile = (q: number, prefix: "push" | "wpush" = "push") => pushQuantileOf(countersBeforeHalf, countersHalf, q, prefix);
  return {
    scenario, system: sys.name, nodes, ...(generators !== nodes ? { generators } : {}), devices, ...(users < devices ? { users, dispatched_per_s: Math.round(rate / (devices / users)) } : {}),
    entries_per_s: rate, sustained_per_s: fair.rate, probes: fair.probes, p50_ms: quantile(half.hist, 0.5), p99_ms: quantile(half.hist, 0.99),
    bound: boundOf(cpuMax.pcts, generatorCpus ? availableParallelism() : cpus().length, stagesMax), stages_max: stagesMax, stages_half: stagesHalf,
    gap_fills_half: countersBeforeHalf !== undefined && countersHalf !== undefined ? countersHalf.gapFills! - countersBeforeHalf.gapFills! : undefined,
    server_rss_mb: cpu.peakMb, server_cpu_pct: cpu.cpuPct, busy_rss_per_conn_kib: busyKib, cpu_max: cpuMax.shares, cpu_procs: cpuMax.procs, us_per_entry: cpuMax.usPerEntry, us_per_process: cpuMax.usPerProcess,
    nats_msgs_per_entry: natsPerEntry, ...redis,
    ...(countersAfter !== undefined ? {
      entries_per_batch: per(d("processed"), d("batches")), entries_per_push_msg: per(d("pushed"), d("pushMessages")), entries_per_msgs_frame: per(d("entriesSent"), d("msgsFrames")),
      // pushes the gateways received per entry pushed: 1 when each gets only its own sessions' users' entries (--nodes N)
      gateway_received_per_pushed: per(d("gatewayPushes"), d("pushed")),
      gateway_closes: d("closes"), gateway_closes_by_code: closesByCode(countersBefore, countersAfter), slow_consumer_closes: d("slowConsumerCloses"), gap_fills: d("gapFills"), tail_fills: d("tailFills"),
      worker_push_p50_ms: pushQuantile(0.5, "wpush"), worker_push_p99_ms: pushQuantile(0.99, "wpush"), push_p50_ms: pushQuantile(0.5), push_p99_ms: pushQuantile(0.99),
    } : {}),
    // the flags jetgate's gateways ran with: the shipped ones (gateway/node-flags.ts), then BENCH_GATEWAY_NODE_ARGS
    ...(sys.name === "jetgate" ? { gateway_node_args: [...GATEWAY_NODE_FLAGS, process.env.BENCH_GATEWAY_NODE_ARGS ?? ""].join(" ").trim() } : {}),
    ...(sys.name === "jetgate" && process.env.BENCH_GATEWAY_ENV ? { gateway_env: process.env.BENCH_GATEWAY_ENV } : {}),
    // BENCH_MAX_BATCH: jetgate's producers ran with that maxBatch (1: no atomic batches)
    ...(sys.name === "jetgate" && process.env.BENCH_MAX_BATCH !== undefined ? { max_batch: Number(process.env.BENCH_MAX_BATCH) } : {}),
    ...(sys.name === "jetgate" && process.env.BENCH_MIN_BATCH !== undefined ? { min_batch: Number(process.env.BENCH_MIN_BATCH) } : {}),
    sent_max: sent, delivered_max: max.received, sent_half: sentHalf, delivered_half: half.received,
    duplicates: max.duplicates + half.duplicates, half_rate: halfRate, ...(sys.natsMonitorPorts !== undefined ? { shards } : {}),
  };
}

/**
 * RSS per idle connection in steady state: what the server holds once the garbage of the connect
 * burst is collected. V8 collects it by itself when allocation stops (its memory reducer, here
 * 30-45 s after a burst), so the server idles --idle-seconds (60) before the baseline reading, and
 * the connections idle as long before the second; the peak after connecting is reported too.
 */
async function idle(sys: System, gens: Generators): Promise<Row> {
  // the baseline in steady state too: the start-up's garbage is collected the same way
  await sleep(idleSeconds * 1000);
  const before = rssOf(sys.serverPids);
  const round1 = (x: number) => Math.round(x * 10) / 10;
  const reading = async (n: number) => ({ devices: n, rss_mb: round1(rssOf(sys.serverPids)), ...(await sys.serverHeap?.()) });
  const points = [await reading(0)];
  const m = meter(sys.serverPids);
  let connectMs = 0;
  // each step's devices added to those connected, then the same idle time before its reading
  for (const [i, n] of steps.entries()) {
    step(`idle: ${n} devices`);
    connectMs += (await gens.connect(n, n, i === 0 ? 0 : steps[i - 1]!)).ms;
    await sleep(idleSeconds * 1000);
    points.push(await reading(n));
  }
  const after = rssOf(sys.serverPids);
  const cpu = m.stop();
  const perConn = (mb: number) => Number((((mb - before) * 1024) / devices).toFixed(2));
  // what one more connection costs (the slope of RSS against connections, over the steps) apart
  // from what the process holds whatever its connections (the fixed part, the line at 0): a fleet
  // sizes gateways on the first. The reading before any device is left out of the line: the first
  // connections bring costs of their own that more do not add to (a heap grown for the burst)
  const fit = linearFit(points.slice(1).map((p) => [p.devices, p.rss_mb]));
  return {
    scenario, system: sys.name, nodes, devices, entries_per_s: null, p50_ms: null, p99_ms: null, server_rss_mb: Math.round(after), server_cpu_pct: cpu.cpuPct,
    rss_before_mb: Math.round(before), rss_per_conn_kib: perConn(after), peak_rss_mb: cpu.peakMb, peak_per_conn_kib: perConn(cpu.peakMb), idle_s: idleSeconds, connect_ms: connectMs,
    // the flags jetgate's gateways ran with: the shipped ones (gateway/node-flags.ts), then BENCH_GATEWAY_NODE_ARGS
    ...(sys.name === "jetgate" ? { gateway_node_args: [...GATEWAY_NODE_FLAGS, process.env.BENCH_GATEWAY_NODE_ARGS ?? ""].join(" ").trim() } : {}),
    ...(sys.name === "jetgate" && process.env.BENCH_GATEWAY_ENV ? { gateway_env: process.env.BENCH_GATEWAY_ENV } : {}),
    ...(steps.length > 1 ? { slope_kib_per_conn: Number((fit.slope * 1024).toFixed(2)), fixed_mb: Math.round(fit.intercept), steps: points } : {}),
  };
}

/** The least-squares line through points (x, y). */
function linearFit(points: [number, number][]): { slope: number; intercept: number } {
  const n = points.length;
  const mx = points.reduce((a, [x]) => a + x, 0) / n;
  const my = points.reduce((a, [, y]) => a + y, 0) / n;
  const sxx = points.reduce((a, [x]) => a + (x - mx) ** 2, 0);
  const slope = sxx === 0 ? 0 : points.reduce((a, [x, y]) => a + (x - mx) * (y - my), 0) / sxx;
  return { slope, intercept: my - slope * mx };
}

async function storm(sys: System, gens: Generators, perUser: number): Promise<Row> {
  step("connect");
  await gens.connect(devices);
  // in sync first (each device has its user's latest entry), then offline while entries arrive
  step("one entry each");
  await sys.sendEach(devices, 1);
  const first = await gens.wait(1);
  if (first.timed_out) throw new Error(`${first.short} devices never got their first entry within ${deadlineSeconds} s:\n${sys.logs().join("\n")}`);
  step("drop");
  await gens.drop();
  await sleep(1000);
  step(`${perUser} entries each, offline`);
  await sys.sendEach(devices, perUser);
  await gens.report();
  step("reconnect");
  const m = meter(sys.serverPids);
  const shares = cpuShares({ ...sys.pids, devices: gens.pids });
  const r = await gens.reconnect(perUser);
  const cpu = m.stop();
  const received = r.received as number;
  const cpuAll = shares(Math.max(1, received));
  const dup = (await gens.report()).duplicates;
  const total = devices * perUser;
  return {
    scenario, system: sys.name, nodes, devices, entries_per_s: Math.round((received / (r.elapsed_ms as number)) * 1000), p50_ms: null, p99_ms: null,
    server_rss_mb: cpu.peakMb, server_cpu_pct: cpu.cpuPct, cpu: cpuAll.shares, cpu_procs: cpuAll.procs, us_per_entry: received > 0 ? cpuAll.usPerEntry : undefined,
    us_per_process: received > 0 ? cpuAll.usPerProcess : undefined, retries: r.retries,
    synced_ms: r.synced_ms, complete_ms: r.complete_ms, synced: r.synced, completed: r.completed, received, duplicates: dup, entries_behind: perUser,
    note: r.timed_out === true ? `not done after ${deadlineSeconds} s: ${String(r.completed)} of ${devices} devices complete, ${received} of ${total} entries` : undefined,
  };
}

/**
 * Every process of a run may hold every device's socket (one generator, one server): the hard open
 * files limit, which each child raises its soft limit to, must allow that. Raised here where this
 * process may (as root); else the run stops before it starts, naming the limit.
 */
function ensureFileLimit(needed: number): void {
  const { hard } = fileLimit();
  if (hard >= needed) return;
  try {
    execFileSync("prlimit", ["--pid", String(process.pid), `--nofile=${needed}:${needed}`], { stdio: "ignore" });
  } catch {
    usageError(`${devices} devices need ${needed} open files per process; this one may open ${hard} (ulimit -Hn) and cannot raise it (as root with CAP_SYS_RESOURCE: ulimit -n ${needed}): raise it, or use fewer --devices`, USAGE);
  }
  if (!values.json) console.log(`open files limit raised to ${needed} (ulimit -n) for ${devices} devices`);
}
// a server holds every device's socket and a few hundred files of its own
ensureFileLimit(devices + 1024);

// jetgate runs compiled, as in its container image (npm run build; see test/harness/stack.ts),
// unless BENCH_SOURCE=1 (the test suite's functional check: no build step)
if (systems.includes("jetgate") && process.env.BENCH_SOURCE !== "1") {
  execFileSync("npm", ["run", "--silent", "build"], { stdio: ["ignore", "ignore", "inherit"] });
  process.env.HARNESS_DIST = "1";
}

const rows: Row[] = [];
const natsVersion = execFileSync(NATS_BIN, ["--version"], { encoding: "utf8" }).trim().replace(/^nats-server: /, "");
// availableParallelism follows the CPU affinity (`taskset`): the cores the system's processes may use
const usable = availableParallelism() < cpus().length ? `, ${availableParallelism()} of them for the system` : "";
const machine = `${cpus().length} cores (${cpus()[0]?.model.trim()})${usable}, node ${process.version}, nats-server ${natsVersion}`;
if (!values.json) console.log(`bench ${scenario}: ${devices} devices, ${nodes} node(s)${topology === "cluster" ? ", on clusters" : ""}; ${machine}; ${new Date().toISOString()}`);
for (const name of systems) {
  const sys = await startSystem(name, { nodes, shards, topology });
  const gens = new Generators(sys, generators);
  try {
    const measured = scenario === "fanout" || scenario === "hot" ? await fanout(sys, gens)
      : scenario === "idle" ? await idle(sys, gens)
      : scenario === "storm" ? await storm(sys, gens, 10)
      : { ...(await storm(sys, gens, entries)), scenario };
    // every row names the servers it ran on
    const { scenario: sc, system: sy, ...rest } = measured;
    // a third-party server names its version (centrifugo: `centrifugo version`)
    const row: Row = { scenario: sc, system: sy, topology: sys.topology, ...(sys.version !== undefined ? { server_version: sys.version } : {}), ...rest };
    rows.push(row);
    if (values.json) console.log(JSON.stringify(row));
    else console.log(Object.entries(row).filter(([, v]) => v !== undefined).map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join("  "));
  } finally {
    await gens.stop();
    await sys.stop();
  }
}
const rate = (s: SystemName) => rows.find((r) => r.system === s)?.entries_per_s ?? null;
const sustainedRate = (s: SystemName) => (rows.find((r) => r.system === s)?.sustained_per_s as number | null | undefined) ?? null;
const ratio = (a: number | null, b: number | null) => (a !== null && b !== null && b > 0 ? Number((a / b).toFixed(3)) : null);
const summary = {
  scenario, summary: true, ratio_vs_limit: ratio(rate("jetgate"), rate("uws-limit")), ratio_vs_jetstream_limit: ratio(rate("jetgate"), rate("jetstream-limit")),
  ratio_vs_socketio: ratio(rate("jetgate"), rate("socketio")), ratio_vs_centrifugo: ratio(rate("jetgate"), rate("centrifugo")),
  // the same on the sustained rates (fanout and hot)
  sustained_vs_jetstream_limit: ratio(sustainedRate("jetgate"), sustainedRate("jetstream-limit")), sustained_vs_socketio: ratio(sustainedRate("jetgate"), sustainedRate("socketio")),
  sustained_vs_centrifugo: ratio(sustainedRate("jetgate"), sustainedRate("centrifugo")), nodes, topology, machine, date: new Date().toISOString(),
};
console.log(values.json ? JSON.stringify(summary) : Object.entries(summary).map(([k, v]) => `${k}=${v}`).join("  "));
process.exit(0);
