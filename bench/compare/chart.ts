/**
 * Draws bench/RESULTS.svg from the JSON lines of `npm run bench -- <scenario> --json` kept in
 * bench/results/*.jsonl: throughput per system in each scenario, and fanout p99 latency at half
 * load. Vega-Lite compiles the spec, Vega renders the SVG headless (no canvas, no browser). Prints
 * the same rows as a Markdown table for RESULTS.md.
 *
 *   npm run bench:chart
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
  entries_per_s: number | null;
  p99_ms: number | null;
  rss_per_conn_kib?: number;
  summary?: boolean;
}

const rows: Row[] = readdirSync(`${DIR}results`)
  .filter((f) => f.endsWith(".jsonl"))
  .flatMap((f) => readFileSync(`${DIR}results/${f}`, "utf8").split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l) as Row))
  .filter((r) => r.summary !== true)
  .map((r) => ({ ...r, case: `${r.scenario} (${r.devices.toLocaleString("en-US")})` }));

const color = { field: "system", type: "nominal", scale: { domain: ["jetgate", "uws-limit", "jetstream-limit", "socketio"], range: ["#1f77b4", "#7f7f7f", "#2ca02c", "#ff7f0e"] } } as const;
const bars = (title: string, data: object[], field: string, axis: string, scenarioAxis = true): object => ({
  title,
  data: { values: data },
  mark: "bar",
  encoding: {
    ...(scenarioAxis ? { column: { field: "case", type: "nominal", title: null } } : {}),
    x: { field: "system", type: "nominal", axis: { title: null, labelAngle: -30 }, sort: ["jetgate", "uws-limit", "jetstream-limit", "socketio"] },
    y: { field, type: "quantitative", title: axis },
    color,
  },
  width: 110,
  height: 220,
});

const spec: TopLevelSpec = {
  $schema: "https://vega.github.io/schema/vega-lite/v6.json",
  config: { font: "sans-serif", legend: { orient: "bottom" } },
  vconcat: [
    bars("Throughput (entries/s delivered, higher is better)", rows.filter((r) => r.entries_per_s !== null), "entries_per_s", "entries/s"),
    {
      hconcat: [
        bars("fanout p99 at half load (ms, lower is better)", rows.filter((r) => r.scenario === "fanout"), "p99_ms", "ms", false),
        bars("idle RSS per connection (KiB, lower is better)", rows.filter((r) => r.scenario === "idle"), "rss_per_conn_kib", "KiB", false),
      ],
    },
  ],
} as TopLevelSpec;

// the table for RESULTS.md, from the same rows
const cell = (v: unknown) => (v === null || v === undefined ? "" : String(v));
const cols = ["scenario", "system", "devices", "entries_per_s", "p50_ms", "p99_ms", "server_rss_mb", "server_cpu_pct", "rss_per_conn_kib", "complete_ms", "note"] as const;
console.log(`| ${cols.join(" | ")} |\n|${cols.map(() => "---").join("|")}|`);
for (const r of rows as unknown as Record<string, unknown>[]) console.log(`| ${cols.map((c) => cell(r[c])).join(" | ")} |`);

const view = new vega.View(vega.parse(compile(spec).spec), { renderer: "none" });
writeFileSync(`${DIR}RESULTS.svg`, await view.toSVG());
console.log(`wrote bench/RESULTS.svg from ${rows.length} results`);
