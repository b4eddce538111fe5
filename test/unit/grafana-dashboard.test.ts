import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { parse } from "yaml";

const chart = new URL("../../k8s/jetgate/", import.meta.url);
const read = (rel: string) => readFileSync(new URL(rel, chart), "utf8");

test("chart - the Grafana dashboard ConfigMap ships dashboards/jetgate.json, labelled for the sidecar, off by default", () => {
  const t = read("templates/grafana-dashboard.yaml");
  const lines = t.trim().split("\n");
  // the whole template sits inside the switch
  assert.equal(lines[0], "{{- if .Values.grafanaDashboard.enabled }}");
  assert.equal(lines.at(-1), "{{- end }}");
  assert.match(t, /^kind: ConfigMap$/m);
  const get = /\.Files\.Get "([^"]+)"/.exec(t);
  assert.equal(get?.[1], "dashboards/jetgate.json");
  assert.ok(existsSync(new URL(get[1], chart)), "the file the template reads is in the chart");
  JSON.parse(read(get[1]));
  // the label's name and value both come from values
  assert.match(t, /^ {4}\{\{ \.Values\.grafanaDashboard\.label \}\}: \{\{ \.Values\.grafanaDashboard\.labelValue \| quote \}\}$/m);

  const values = parse(read("values.yaml")) as { grafanaDashboard: Record<string, unknown> };
  assert.deepEqual(values.grafanaDashboard, { enabled: false, label: "grafana_dashboard", labelValue: "1", namespace: "", annotations: {} });
  const schema = JSON.parse(read("values.schema.json")) as { properties: Record<string, { properties: Record<string, { type: string }> }> };
  assert.equal(schema.properties.grafanaDashboard?.properties.enabled?.type, "boolean");
});
