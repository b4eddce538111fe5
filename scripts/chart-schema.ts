/**
 * Generates k8s/jetgate/values.schema.json: `config` comes from the project's zod config schema
 * (every setting, described by docs/config.md), the rest from the shapes in values.yaml (objects
 * closed against typos, except the Kubernetes-native ones). `npm run chart:schema`; a test fails
 * when the file is out of date, so chart values and runtime config cannot drift.
 */
import { readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { z } from "zod";
import { parse } from "yaml";
import { envSchema } from "../protocol/config.js";

const CHART = fileURLToPath(new URL("../k8s/jetgate/", import.meta.url));
export const SCHEMA_FILE = `${CHART}values.schema.json`;

/** Objects whose keys are Kubernetes' or the user's, not the chart's. */
const OPEN = new Set(["resources", "podSecurityContext", "securityContext", "affinity", "nodeSelector", "annotations", "podAnnotations", "labels", "requests", "limits"]);

type Json = Record<string, unknown>;

function infer(key: string, v: unknown): Json {
  if (Array.isArray(v)) return { type: "array" };
  if (v !== null && typeof v === "object") {
    if (OPEN.has(key)) return { type: "object" };
    const properties = Object.fromEntries(Object.entries(v).map(([k, x]) => [k, infer(k, x)]));
    return { type: "object", additionalProperties: false, properties };
  }
  if (typeof v === "boolean") return { type: "boolean" };
  if (typeof v === "number") return { type: Number.isInteger(v) ? "integer" : "number" };
  return { type: "string" };
}

function configDescriptions(): Map<string, string> {
  const doc = readFileSync(fileURLToPath(new URL("../docs/config.md", import.meta.url)), "utf8");
  const out = new Map<string, string>();
  for (const m of doc.matchAll(/^\| `(JETGATE_[A-Z0-9_]+)` \| ([^|]*) \| (.*) \|$/gm)) out.set(m[1]!, m[3]!.replace(/`/g, "").trim());
  return out;
}

export function chartSchema(): Json {
  const values = parse(readFileSync(`${CHART}values.yaml`, "utf8")) as Json;
  const root = infer("", values) as { properties: Json };
  const fromZod = z.toJSONSchema(envSchema, { io: "input", unrepresentable: "any" }) as { properties: Record<string, Json> };
  const described = configDescriptions();
  root.properties.config = {
    type: "object",
    description: "Settings of docs/config.md, as strings",
    additionalProperties: false,
    properties: Object.fromEntries(
      Object.entries(fromZod.properties).map(([k, s]) => [k, { ...s, ...(described.has(k) ? { description: described.get(k) } : {}) }]),
    ),
  };
  return { $schema: "http://json-schema.org/draft-07/schema#", title: "jetgate chart values", ...root };
}

export function renderSchema(): string {
  return `${JSON.stringify(chartSchema(), null, 2)}\n`;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  writeFileSync(SCHEMA_FILE, renderSchema());
  console.log(`wrote ${SCHEMA_FILE}`);
}
