import { test } from "node:test";
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { parse } from "yaml";
import { ENV_VARS } from "../../protocol/index.js";
import { SCHEMA_FILE, renderSchema } from "../../scripts/chart-schema.js";
import { GATEWAY_NODE_FLAGS } from "../../gateway/node-flags.js";

const chart = new URL("../../k8s/jetgate/", import.meta.url);
const read = (rel: string) => readFileSync(new URL(rel, chart), "utf8");
const templates = readdirSync(new URL("templates/", chart)).map((f) => ({ name: f, text: read(`templates/${f}`) }));
const values = parse(read("values.yaml")) as Record<string, unknown>;

test("chart - every non-template YAML file parses, and the chart names itself", () => {
  const meta = parse(read("Chart.yaml")) as { apiVersion: string; name: string; version: string };
  assert.deepEqual([meta.apiVersion, meta.name], ["v2", "jetgate"]);
  assert.ok(/^\d+\.\d+\.\d+$/.test(meta.version));
  assert.equal(typeof values, "object");
  JSON.parse(readFileSync(SCHEMA_FILE, "utf8"));
});

test("chart - values.schema.json is what the config schema generates (npm run chart:schema)", () => {
  assert.equal(readFileSync(SCHEMA_FILE, "utf8"), renderSchema(), "values.schema.json is out of date: run npm run chart:schema");
  const schema = JSON.parse(renderSchema()) as { properties: { config: { properties: Record<string, unknown> } } };
  assert.deepEqual(Object.keys(schema.properties.config.properties).sort(), [...ENV_VARS].sort());
});

test("chart - every env var the templates set is a setting the config schema knows", () => {
  const known = new Set<string>(ENV_VARS);
  const used = new Set<string>();
  for (const t of templates) for (const m of t.text.matchAll(/\bJETGATE_[A-Z0-9_]*[A-Z0-9]\b/g)) used.add(m[0]);
  assert.ok(used.size >= 10, [...used].join(" "));
  for (const name of used) assert.ok(known.has(name), `${name} is set by a template but unknown to protocol/config.ts`);
});

test("chart - every value a template reads exists in values.yaml", () => {
  const has = (path: string[]): boolean => {
    let cur: unknown = values;
    for (const k of path) {
      if (cur === null || typeof cur !== "object" || !(k in (cur as object))) return false;
      cur = (cur as Record<string, unknown>)[k];
    }
    return true;
  };
  let refs = 0;
  for (const t of templates) {
    for (const m of t.text.matchAll(/\.Values\.([A-Za-z0-9_.]+)/g)) {
      refs++;
      assert.ok(has(m[1]!.split(".")), `${t.name}: .Values.${m[1]} is not in values.yaml`);
    }
  }
  assert.ok(refs > 50, `${refs} value references`);
});

test("chart - the gateway's node flags are gateway/node-flags.ts's, in the image's command and the chart's values", () => {
  const d = readFileSync(new URL("../../Dockerfile", import.meta.url), "utf8");
  const cmd = JSON.parse(/^CMD (\[.*\])$/m.exec(d)![1]!) as string[];
  assert.deepEqual(cmd, [...GATEWAY_NODE_FLAGS, "dist/gateway/main.js"]);
  assert.deepEqual((values.gateway as { nodeArgs: string[] }).nodeArgs, [...GATEWAY_NODE_FLAGS]);
});

test("chart - the Dockerfile builds in two stages and runs without root, with production dependencies only", () => {
  const d = readFileSync(new URL("../../Dockerfile", import.meta.url), "utf8");
  assert.equal(d.match(/^FROM /gm)?.length, 2);
  assert.match(d, /npm ci --omit=dev/);
  assert.match(d, /^USER node$/m);
  assert.match(d, /npm run build/);
  const gw = templates.find((t) => t.name === "gateway-deployment.yaml")!.text;
  for (const needle of ["readOnlyRootFilesystem", "runAsNonRoot", "allowPrivilegeEscalation", "/readyz", "/healthz", "preStop", "terminationGracePeriodSeconds", "topologySpreadConstraints"]) {
    assert.ok(gw.includes(needle) || read("values.yaml").includes(needle), `gateway hygiene: ${needle}`);
  }
});
