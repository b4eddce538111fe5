/**
 * Draws bench/RESULTS.svg from the JSON lines of `npm run bench -- <scenario> --json` kept in
 * bench/results/*.jsonl: throughput per system in each scenario, and fanout p99 latency at half
 * load, idle RSS per connection, and each process's CPU microseconds per delivered entry in fanout
 * (stacked, the devices left out); from bench/results/scaling.jsonl (`--nodes N` runs), fanout
 * entries/s against N per system. Each bar is the median of each scenario's latest round of runs
 * (those within an hour of that scenario's newest, or since `--since <ISO date>` for the scenarios
 * run since then); each --nodes point
 * the newest run. Fanout and hot show the sustained rate (p99 under 1 s) beside the max. Vega-Lite
 * compiles the spec, Vega renders the SVG headless (no canvas, no browser). Prints the same rows as a
 * Markdown table for RESULTS.md.
 *
 *   npm run bench:chart [-- --since 2026-12-01T22:00:00Z]
 */
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import * as vega from "vega";
import { compile, type TopLevelSpec } from "vega-lite";

const DIR = fileURLToPath(new URL("../", import.meta.url));
interface Row {
  scenario: string;
  devices: number;
  /** scenario (devices): one column per run. */
  case?: string;
  system: string;
  nodes?: number;
  /** The servers it ran on (bench/compare/topology.ts); rows before --cluster have none: one of each. */
  topology?: string;
  entries_per_s: number | null;
  /** fanout and hot: the highest paced rate held with p99 under 1 s (bench/compare/run.ts). */
  sustained_per_s?: number | null;
  p99_ms: number | null;
  rss_per_conn_kib?: number;
  /** CPU microseconds per delivered entry, by process, and `total` (devices excluded). */
  us_per_entry?: Record<string, number>;
  summary?: boolean;
}

/**
 * A file's rows with the date of the run they belong to: each `npm run bench` prints its rows, then
 * one summary row with the date.
 */
function read(f: string): (Row & { date: string })[] {
  const out: (Row & { date: string })[] = [];
  let run: Row[] = [];
  for (const l of readFileSync(`${DIR}results/${f}`, "utf8").split("\n")) {
    if (!l.startsWith("{")) continue;
    const r = JSON.parse(l) as Row & { date?: string };
    if (r.summary !== true) run.push(r);
    else {
      out.push(...run.map((x) => ({ ...x, date: r.date ?? "" })));
      run = [];
    }
  }
  return out;
}
const SCALING = "scaling.jsonl";
// the side-by-side scenarios only (other benchmarks keep their own .jsonl files there)
const COMPARED = ["fanout.jsonl", "hot.jsonl", "idle.jsonl", "storm.jsonl", "catchup.jsonl"];
const all = readdirSync(`${DIR}results`).filter((f) => COMPARED.includes(f)).flatMap(read);
// each scenario's latest round: its runs within an hour of its newest, or since --since for the
// scenarios run since then (the others keep their own latest round)
const sinceArg = process.argv.indexOf("--since");
const newest = new Map<string, string>();
for (const r of all) if (r.date > (newest.get(r.scenario) ?? "")) newest.set(r.scenario, r.date);
const sinceOf = (scenario: string) => {
  const last = newest.get(scenario)!;
  const given = sinceArg > 0 ? process.argv[sinceArg + 1]! : undefined;
  return given !== undefined && last >= given ? given : new Date(Date.parse(last) - 3600_000).toISOString();
};
const since = [...newest.keys()].map((sc) => `${sc} ${sinceOf(sc)}`).join(", ");
/** A row of `--cluster`: a NATS cluster with R3 streams and a Redis Cluster (drawn as cases of their own). */
function onCluster(r: Row): boolean {
  return r.topology !== undefined && /cluster|R3/.test(r.topology);
}
/** Of each scenario and system's runs of its latest round, the median one (by sustained rate where measured, else entries/s, or by RSS per connection for idle). */
function medians(rs: (Row & { date: string })[]): Row[] {
  const groups = new Map<string, (Row & { date: string })[]>();
  for (const r of rs.filter((x) => x.date >= sinceOf(x.scenario) && (x.nodes ?? 1) === 1)) {
    const k = `${r.scenario}/${r.system}/${r.devices}/${onCluster(r)}`;
    groups.set(k, [...(groups.get(k) ?? []), r]);
  }
  return [...groups.values()].map((g) => {
    const key = (r: Row) => r.sustained_per_s ?? r.entries_per_s ?? r.rss_per_conn_kib ?? 0;
    return [...g].sort((a, b) => key(a) - key(b))[Math.floor((g.length - 1) / 2)]!;
  });
}
const rows: Row[] = medians(all).map((r) => ({ ...r, case: `${r.scenario} (${r.devices.toLocaleString("en-US")}${onCluster(r) ? ", clusters" : ""})` }));
// --nodes N: the newest run of each system and N
const scaling = readdirSync(`${DIR}results`).includes(SCALING)
  ? [...new Map(read(SCALING).filter((r) => r.scenario === "fanout").map((r) => [`${r.system}/${r.nodes}`, r])).values()]
  : [];

/** The systems, in the order their bars stand. */
const SYSTEM_ORDER = ["jetgate", "uws-limit", "jetstream-limit", "socketio", "centrifugo"];
const color = { field: "system", type: "nominal", scale: { domain: SYSTEM_ORDER, range: ["#1f77b4", "#7f7f7f", "#2ca02c", "#ff7f0e", "#9467bd"] } } as const;
const bars = (title: string, data: object[], field: string, axis: string, scenarioAxis = true): object => ({
  title,
  data: { values: data },
  mark: "bar",
  encoding: {
    ...(scenarioAxis ? { column: { field: "case", type: "nominal", title: null } } : {}),
    x: { field: "system", type: "nominal", axis: { title: null, labelAngle: -30 }, sort: SYSTEM_ORDER },
    y: { field, type: "quantitative", title: axis },
    color,
  },
  // hot counts deliveries (tens of times fanout's entries): each scenario its own scale
  ...(scenarioAxis ? { resolve: { scale: { y: "independent" } } } : {}),
  width: 110,
  height: 220,
});

/** One bar segment per process of each system's fanout row: where its CPU per entry goes (one server of each, or the clusters). */
const costsOf = (cluster: boolean) => rows
  .filter((r) => r.scenario === "fanout" && onCluster(r) === cluster && r.us_per_entry !== undefined)
  .flatMap((r) => Object.entries(r.us_per_entry!).filter(([p]) => p !== "total" && p !== "devices").map(([process, us]) => ({ system: r.system, process, us })));
const costChart = (title: string, values: object[]) => ({
  title,
  data: { values },
  mark: "bar",
  encoding: {
    x: { field: "system", type: "nominal", axis: { title: null, labelAngle: -30 }, sort: SYSTEM_ORDER },
    y: { field: "us", type: "quantitative", title: "us per entry", stack: "zero" },
    color: { field: "process", type: "nominal", title: "process" },
  },
  width: 160,
  height: 220,
});
const clusterCosts = costsOf(true);

const spec: TopLevelSpec = {
  $schema: "https://vega.github.io/schema/vega-lite/v6.json",
  config: { font: "sans-serif", legend: { orient: "bottom", columns: 2 } },
  // systems and processes are different colour scales
  resolve: { scale: { color: "independent" }, legend: { color: "independent" } },
  vconcat: [
    bars("Throughput (entries/s delivered, higher is better)", rows.filter((r) => r.entries_per_s !== null), "entries_per_s", "entries/s"),
    bars(
      "Sustained rate (p99 under 1 s for 8 s; hot in deliveries/s; higher is better)",
      rows.filter((r) => r.sustained_per_s !== undefined && r.sustained_per_s !== null),
      "sustained_per_s",
      "per s",
    ),
    {
      resolve: { scale: { color: "independent" }, legend: { color: "independent" } },
      hconcat: [
        bars("fanout p99 at half load (ms, lower is better)", rows.filter((r) => r.scenario === "fanout" && !onCluster(r)), "p99_ms", "ms", false),
        bars("idle RSS per connection (KiB, lower is better)", rows.filter((r) => r.scenario === "idle"), "rss_per_conn_kib", "KiB", false),
      ],
    },
    {
      resolve: { scale: { color: "independent" }, legend: { color: "independent" } },
      hconcat: [
        ...(scaling.length > 0
          ? [{
              title: "fanout entries/s against --nodes N (higher is better)",
              data: { values: scaling },
              mark: { type: "line", point: true },
              encoding: {
                x: { field: "nodes", type: "quantitative", title: "nodes", axis: { tickMinStep: 1 } },
                y: { field: "entries_per_s", type: "quantitative", title: "entries/s" },
                color,
              },
              width: 220,
              height: 220,
            }]
          : []),
        costChart("fanout CPU per delivered entry (us, by process, lower is better)", costsOf(false)),
        ...(clusterCosts.length > 0 ? [costChart("the same on clusters (NATS R3, Redis Cluster)", clusterCosts)] : []),
      ],
    },
  ],
} as TopLevelSpec;

// the table for RESULTS.md, from the same rows
const cell = (v: unknown) => (v === null || v === undefined ? "" : String(v));
const cols = ["scenario", "system", "topology", "devices", "entries_per_s", "sustained_per_s", "p50_ms", "p99_ms", "server_rss_mb", "server_cpu_pct", "rss_per_conn_kib", "complete_ms", "us_per_entry", "note"] as const;
/** `total (process us, ...)`, devices last: they are the benchmark's, not the system's. */
const us = (u: Record<string, number> | undefined) =>
  u === undefined ? "" : `${u.total} (${Object.entries(u).filter(([p]) => p !== "total").map(([p, v]) => `${p} ${v}`).join(", ")})`;
console.log(`| ${cols.join(" | ")} |\n|${cols.map(() => "---").join("|")}|`);
for (const r of rows) {
  const rec = r as unknown as Record<string, unknown>;
  console.log(`| ${cols.map((c) => (c === "us_per_entry" ? us(r.us_per_entry) : cell(rec[c]))).join(" | ")} |`);
}

const view = new vega.View(vega.parse(compile(spec).spec), { renderer: "none" });
writeFileSync(`${DIR}RESULTS.svg`, await view.toSVG());
if (scaling.length > 0) {
  console.log(`\n| system | ${[...new Set(scaling.map((r) => r.nodes))].map((n) => `nodes ${n}`).join(" | ")} |`);
  const ns = [...new Set(scaling.map((r) => r.nodes))];
  console.log(`|---|${ns.map(() => "---").join("|")}|`);
  for (const sys of [...new Set(scaling.map((r) => r.system))]) {
    console.log(`| ${sys} | ${ns.map((n) => cell(scaling.find((r) => r.system === sys && r.nodes === n)?.entries_per_s)).join(" | ")} |`);
  }
}
console.log(`wrote bench/RESULTS.svg from ${rows.length + scaling.length} results (medians of the runs since ${since})`);
