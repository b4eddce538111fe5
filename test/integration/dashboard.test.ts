/**
 * The chart's Grafana dashboard (k8s/jetgate/dashboards/jetgate.json): well formed, and every
 * metric its queries name is one a live gateway or worker exposes, so a renamed metric cannot
 * leave a panel silently empty.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { startStack } from "../harness/stack.js";
import { TestDevice, deviceToken } from "../harness/device.js";
import { waitFor } from "../harness/wait.js";

interface Ref {
  type?: string;
  uid?: string;
}
interface Panel {
  id: number;
  type: string;
  title: string;
  gridPos: { x: number; y: number; w: number; h: number };
  datasource?: Ref;
  targets?: { expr?: string; datasource?: Ref; refId?: string }[];
  panels?: Panel[];
}
interface Dashboard {
  schemaVersion: number;
  uid: string;
  panels: Panel[];
  templating: { list: { name: string; type: string; query: unknown; datasource?: Ref }[] };
}

const dash = JSON.parse(readFileSync(new URL("../../k8s/jetgate/dashboards/jetgate.json", import.meta.url), "utf8")) as Dashboard;
/** Every panel, those inside collapsed rows too. */
const panels = dash.panels.flatMap((p) => [p, ...(p.panels ?? [])]);
const queried = panels.filter((p) => p.type !== "row");
const HIST_SUFFIX = /_(bucket|sum|count)$/;

/**
 * The `jetgate_` identifiers of a PromQL expression, in order. Quoted strings go first (a label
 * value may hold anything), then label matchers and range selectors; what is left is functions,
 * keywords, label names of `by (...)`, numbers and metric names, and a metric name is an
 * identifier not preceded by another identifier character.
 */
function metricTokens(expr: string): string[] {
  const bare = expr
    .replace(/"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`/g, '""')
    .replace(/\{[^}]*\}/g, " ")
    .replace(/\[[^\]]*\]/g, " ");
  return [...bare.matchAll(/(?<![A-Za-z0-9_:])jetgate_[A-Za-z0-9_:]*/g)].map((m) => m[0]);
}

/** Metric families named by an expression: a histogram's series suffix is its family. */
function families(expr: string, histograms: ReadonlySet<string>): string[] {
  return metricTokens(expr).map((t) => {
    const base = t.replace(HIST_SUFFIX, "");
    return base !== t && histograms.has(base) ? base : t;
  });
}

/** `# TYPE <name> <type>` lines of an exposition. */
function types(text: string): Map<string, string> {
  return new Map([...text.matchAll(/^# TYPE (\S+) (\S+)$/gm)].map((m) => [m[1]!, m[2]!]));
}

test("dashboard - the tokenizer finds metric names and only them", () => {
  assert.deepEqual(
    metricTokens('histogram_quantile(0.99, sum by (le) (rate(jetgate_x_bucket{job=~"jetgate_not_a_metric", a="}"}[5m]))) / 2^48'),
    ["jetgate_x_bucket"],
  );
  assert.deepEqual(metricTokens("sum(rate(jetgate_a_total[1m])) - (sum(rate(jetgate_b_total[1m])) or vector(0)) + my_jetgate_c"), ["jetgate_a_total", "jetgate_b_total"]);
  assert.deepEqual(families("rate(jetgate_h_sum[1m]) / rate(jetgate_h_count[1m]) + jetgate_n_count", new Set(["jetgate_h"])), ["jetgate_h", "jetgate_h", "jetgate_n_count"]);
});

test("dashboard - valid JSON model: datasource variable, unique ids, grid positions, every query on the variable", () => {
  assert.ok(Number.isInteger(dash.schemaVersion) && dash.schemaVersion >= 39, `schemaVersion ${dash.schemaVersion}`);
  assert.equal(dash.uid, "jetgate");
  const vars = new Map(dash.templating.list.map((v) => [v.name, v]));
  assert.equal(vars.get("datasource")?.type, "datasource");
  assert.equal(vars.get("datasource")?.query, "prometheus");
  for (const v of dash.templating.list.filter((x) => x.type === "query")) assert.deepEqual(v.datasource, { type: "prometheus", uid: "${datasource}" }, v.name);

  const ids = panels.map((p) => p.id);
  assert.equal(new Set(ids).size, ids.length, `duplicate panel ids: ${ids.join(",")}`);
  for (const p of panels) {
    assert.ok(Number.isInteger(p.id) && p.id > 0, `${p.title}: id`);
    const g = p.gridPos;
    for (const k of ["x", "y", "w", "h"] as const) assert.ok(Number.isInteger(g?.[k]) && g[k] >= 0, `${p.title}: gridPos.${k}`);
    assert.ok(g.w >= 1 && g.h >= 1 && g.x + g.w <= 24, `${p.title}: gridPos ${JSON.stringify(g)} outside the 24-column grid`);
  }
  // no two panels on the same cells
  for (const [i, a] of panels.entries()) {
    for (const b of panels.slice(i + 1)) {
      const overlap = a.gridPos.x < b.gridPos.x + b.gridPos.w && b.gridPos.x < a.gridPos.x + a.gridPos.w && a.gridPos.y < b.gridPos.y + b.gridPos.h && b.gridPos.y < a.gridPos.y + a.gridPos.h;
      assert.ok(!overlap, `${a.title} overlaps ${b.title}`);
    }
  }
  assert.ok(queried.length >= 15, `${queried.length} panels with queries`);
  for (const p of queried) {
    assert.deepEqual(p.datasource, { type: "prometheus", uid: "${datasource}" }, `${p.title}: datasource`);
    assert.ok((p.targets ?? []).length > 0, `${p.title}: no query`);
    const refIds = p.targets!.map((t) => t.refId);
    assert.equal(new Set(refIds).size, refIds.length, `${p.title}: duplicate refIds`);
    for (const t of p.targets!) {
      assert.deepEqual(t.datasource, { type: "prometheus", uid: "${datasource}" }, `${p.title} ${t.refId}: datasource`);
      assert.ok(typeof t.expr === "string" && metricTokens(t.expr).length > 0, `${p.title} ${t.refId}: no jetgate metric in ${t.expr}`);
    }
  }
});

test("dashboard - every metric a panel or variable queries is exposed by a live gateway or worker", async () => {
  const stack = await startStack({ gateway: {} });
  try {
    const gateway = stack.gateway!;
    const worker = stack.worker!;
    const user = "dashboard";
    const send = (id: string) => stack.dispatcher.dispatch({ dispatch_id: id, message_id: id, lane: "default", recipients: [user], body: new Uint8Array(4) });
    // entries before the device connects are caught up, after it live: both kinds of series exist
    for (const id of ["c0", "c1", "c2"]) await send(id);
    const dev = await TestDevice.connect(gateway.httpPort);
    dev.send({ t: "AUTH", v: 1, token: await deviceToken(user), device: "d1" });
    await dev.next("SYNCED", 30_000);
    for (const id of ["l0", "l1", "l2"]) await send(id);
    await waitFor("every entry delivered", () => dev.entries().length >= 6, { timeoutMs: 20_000 });
    await waitFor("three pushes observed", async () => (await gateway.metric("jetgate_gateway_push_latency_seconds_count")) >= 3, { timeoutMs: 10_000 });
    const [gw, wk] = await Promise.all([gateway.http("/metrics"), worker.http("/metrics")]);
    dev.close();

    const exposed = { gateway: types(gw.text), worker: types(wk.text) };
    const histograms = new Set([...exposed.gateway, ...exposed.worker].filter(([, t]) => t === "histogram").map(([n]) => n));
    assert.ok(histograms.has("jetgate_gateway_push_latency_seconds"));
    const exprs = [
      ...queried.flatMap((p) => p.targets!.map((t) => ({ where: p.title, expr: t.expr! }))),
      ...dash.templating.list.filter((v) => v.type === "query").map((v) => ({ where: `variable ${v.name}`, expr: (v.query as { query: string }).query })),
    ];
    const used = new Set<string>();
    for (const { where, expr } of exprs) {
      for (const name of families(expr, histograms)) {
        used.add(name);
        // the regression counter is both processes'; the rest are one's by prefix
        const owners = name === "jetgate_mailbox_seq_regression_total" ? (["gateway", "worker"] as const) : name.startsWith("jetgate_gateway_") ? (["gateway"] as const) : (["worker"] as const);
        for (const o of owners) assert.ok(exposed[o].has(name), `${where}: ${name} is not in the ${o}'s /metrics`);
      }
    }
    for (const name of ["jetgate_gateway_push_latency_seconds", "jetgate_shard_epoch", "jetgate_shard_log_offset", "jetgate_gateway_dependency_up", "jetgate_worker_dependency_up"]) {
      assert.ok(used.has(name), `the dashboard does not graph ${name}`);
    }
    // the latency histogram has series (once per entry and gateway), the gauges per shard too
    assert.match(gw.text, /^jetgate_gateway_push_latency_seconds_bucket\{le="\+Inf"\} [1-9]/m);
    assert.match(wk.text, /^jetgate_shard_epoch\{shard="\d+"\} \d+/m);
    assert.match(gw.text, /^jetgate_gateway_catchup_entries_total\{source="\w+"\} [1-9]/m);
  } finally {
    await stack.dispose();
  }
});
