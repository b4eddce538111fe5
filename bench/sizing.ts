/**
 * docs/operations.md's sizing table, made from the benchmark's own rows (bench/results/*.jsonl):
 * for one server of NATS and Redis (R1) and for the clusters (`--cluster`: 3 NATS nodes with R3
 * streams, a 3-master Redis Cluster), each part's CPU per delivered entry in `fanout` (the median of
 * the latest round's jetgate rows) and so what one core of it carries; the gateway's memory per idle
 * connection (`idle`) and its CPU per reconnect with 10 missed entries (`storm`).
 *
 *   npm run bench:sizing [-- --since <ISO date>]     prints the Markdown table and the rows it used
 */
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { parseFlags } from "../protocol/io/index.js";

const DIR = fileURLToPath(new URL("./results/", import.meta.url));
const USAGE = "usage: npm run bench:sizing [-- --since <ISO date>]";
const { values } = parseFlags({ options: { since: { type: "string" } } }, USAGE);

interface Row {
  scenario: string;
  system: string;
  topology?: string;
  devices: number;
  nodes?: number;
  sustained_per_s?: number | null;
  entries_per_s: number | null;
  us_per_entry?: Record<string, number>;
  nats_msgs_per_entry?: number;
  redis_cmds_per_entry?: number;
  rss_per_conn_kib?: number;
  entries_behind?: number;
  date: string;
}

/** jetgate's rows of a scenario, each with the date of its run (the summary line that follows a run's rows). */
function rows(scenario: string): Row[] {
  const out: Row[] = [];
  let run: Omit<Row, "date">[] = [];
  for (const line of readFileSync(`${DIR}${scenario}.jsonl`, "utf8").split("\n")) {
    if (!line.startsWith("{")) continue;
    const r = JSON.parse(line) as Omit<Row, "date"> & { summary?: boolean; date?: string };
    if (r.summary !== true) run.push(r);
    else {
      out.push(...run.filter((x) => x.system === "jetgate" && (x.nodes ?? 1) === 1).map((x) => ({ ...x, date: r.date ?? "" })));
      run = [];
    }
  }
  return out;
}

const onCluster = (r: Row) => r.topology !== undefined && /cluster|R3/.test(r.topology);

/** The median (by `key`) of the rows of the latest round (within an hour of the newest, or since --since) of one topology. */
function median(rs: Row[], cluster: boolean, key: (r: Row) => number): Row | undefined {
  const mine = rs.filter((r) => onCluster(r) === cluster);
  if (mine.length === 0) return undefined;
  const newest = mine.reduce((d, r) => (r.date > d ? r.date : d), "");
  const since = values.since ?? new Date(Date.parse(newest) - 3600_000).toISOString();
  const round = mine.filter((r) => r.date >= since).sort((a, b) => key(a) - key(b));
  return round[Math.floor((round.length - 1) / 2)];
}

const fanout = rows("fanout");
const idle = rows("idle");
const storm = rows("storm");
const shapes = [false, true].map((cluster) => ({
  cluster,
  fanout: median(fanout, cluster, (r) => r.sustained_per_s ?? r.entries_per_s ?? 0),
  idle: median(idle, cluster, (r) => r.rss_per_conn_kib ?? 0),
  storm: median(storm, cluster, (r) => r.entries_per_s ?? 0),
}));

const perCore = (us: number | undefined) => (us === undefined || us <= 0 ? "" : `~${Math.round(1e6 / us / 100) * 100} entries/s`);
const part = (r: Row | undefined, p: string) => r?.us_per_entry?.[p];
const cell = (r: Row | undefined, p: string) => (part(r, p) === undefined ? "not measured" : `${part(r, p)} us, ${perCore(part(r, p))} a core`);

const PARTS: [string, string, string][] = [
  ["gateway", "gateway", "one send per device and entry is about half of it"],
  ["worker", "worker", "numbering, the Redis step, the pushes"],
  ["Dispatcher (your backend)", "producer", "1-recipient dispatches"],
  ["nats-server (every node)", "nats", ""],
  ["Redis (every master)", "redis", "the batch script"],
];
const [r1, r3] = shapes;
console.log("| part | one nats-server (R1), one Redis | 3-node NATS cluster (R3), 3-master Redis Cluster | |");
console.log("|---|---|---|---|");
for (const [name, key, note] of PARTS) console.log(`| ${name} | ${cell(r1!.fanout, key)} | ${cell(r3!.fanout, key)} | ${note} |`);
console.log(`| all of jetgate | ${part(r1!.fanout, "total") ?? ""} us per entry | ${part(r3!.fanout, "total") ?? ""} us per entry | the device generator excluded |`);
console.log(`| nats-server messages per entry | ${r1!.fanout?.nats_msgs_per_entry ?? ""} | ${r3!.fanout?.nats_msgs_per_entry ?? ""} | in and out, every node (R3 replication included) |`);
console.log(`| Redis commands per entry | ${r1!.fanout?.redis_cmds_per_entry ?? ""} | ${r3!.fanout?.redis_cmds_per_entry ?? ""} | those the script runs included |`);
const kib = (s: (typeof shapes)[number]) => s.idle?.rss_per_conn_kib;
const conns = (s: (typeof shapes)[number]) => (kib(s) === undefined ? "not measured" : `${kib(s)} KiB, ~${Math.round((1024 * 1024) / kib(s)! / 1000)}k connections per GiB`);
console.log(`| gateway memory per idle connection | ${conns(r1!)} | ${r3!.idle === undefined ? "as R1 (the topology does not change it)" : conns(r3!)} | \`idle\`, ${r1!.idle?.devices ?? ""} devices |`);
const reconnect = (s: (typeof shapes)[number]) => {
  const us = part(s.storm, "gateway");
  const behind = s.storm?.entries_behind ?? 10;
  return us === undefined ? "not measured" : `${Math.round(us * behind)} us of gateway CPU, ~${Math.round(1e6 / (us * behind) / 10) * 10} reconnects/s a core`;
};
console.log(`| a reconnect with ${r1!.storm?.entries_behind ?? 10} missed entries | ${reconnect(r1!)} | ${reconnect(r3!)} | \`storm\`, ${r1!.storm?.devices ?? ""} devices at once |`);
console.log("\nrows used (scenario, topology, date, sustained or entries/s):");
for (const s of shapes) {
  for (const r of [s.fanout, s.idle, s.storm]) if (r !== undefined) console.log(`  ${r.scenario} ${r.topology ?? "nats 1 node R1, redis 1"} ${r.date} ${r.sustained_per_s ?? r.entries_per_s ?? r.rss_per_conn_kib}`);
}
