/**
 * `npm run conformance -- --client "<command>" [--scenario a,b] [--json]`: runs each scenario on a
 * fresh stack against the client under test and prints a table; exits 1 when one fails
 * (docs/conformance.md).
 */
import { parseArgs } from "node:util";
import { checkLog } from "./checks.js";
import { Kit } from "./kit.js";
import { SCENARIOS, soak, type Scenario } from "./scenarios.js";

export interface Outcome {
  scenario: string;
  ok: boolean;
  ms: number;
  /** What failed: the scenario's expectation, or a named check. */
  failures: string[];
  /** The client's stderr and last events, when it failed. */
  evidence?: string[];
  /** What the scenario reported (the soak's counts). */
  notes?: string[];
}

const SCENARIO_TIMEOUT_MS = 120_000;

export async function runScenario(s: Scenario, client: string, clientEnv: Record<string, string> = {}): Promise<Outcome> {
  const started = Date.now();
  const k = await Kit.start({ client, clientEnv, ...s.kit }, s.user ?? ((v) => userFor(v)));
  const failures: string[] = [];
  try {
    let timer: NodeJS.Timeout | undefined;
    const limit = s.timeoutMs ?? SCENARIO_TIMEOUT_MS;
    await Promise.race([
      s.run(k),
      new Promise((_, reject) => (timer = setTimeout(() => reject(new Error(`the scenario did not end within ${limit} ms`)), limit))),
    ]).finally(() => clearTimeout(timer));
  } catch (err) {
    failures.push((err as Error).message);
  }
  for (const v of checkLog(k.log.events, k.dispatched, { gone: k.gone, ...(s.repeatsAcrossLives ? { repeatsAcrossLives: true } : {}) })) failures.push(`${v.check}: ${v.detail}`);
  const evidence = failures.length > 0 ? [...k.log.stderr.slice(-20), ...k.log.events.slice(-15).map((e) => JSON.stringify(e))] : undefined;
  await k.dispose();
  return { scenario: s.name, ok: failures.length === 0, ms: Date.now() - started, failures, ...(evidence ? { evidence } : {}), ...(k.notes.length > 0 ? { notes: k.notes } : {}) };
}

function userFor(v: { shardOf: (u: string) => number }): string {
  return `u${[0, 1, 2, 3].find((i) => v.shardOf(`u${i}`) === 1) ?? 0}`;
}

export function table(outcomes: readonly Outcome[]): string {
  const rows = outcomes.map((o) => `| ${o.scenario} | ${o.ok ? "pass" : "FAIL"} | ${(o.ms / 1000).toFixed(1)} s | ${[...o.failures, ...(o.notes ?? [])].join("; ").replace(/\|/g, "/").slice(0, 400)} |`);
  return ["| scenario | result | time | what failed, or what it saw |", "|---|---|---|---|", ...rows].join("\n");
}

async function main(): Promise<void> {
  const { values } = parseArgs({ options: { client: { type: "string" }, scenario: { type: "string" }, "soak-seconds": { type: "string" }, json: { type: "boolean", default: false }, list: { type: "boolean", default: false } } });
  if (values.list) {
    for (const s of SCENARIOS) console.log(`${s.name.padEnd(24)} ${s.what}`);
    return;
  }
  if (values.client === undefined) {
    console.error('usage: npm run conformance -- --client "<command>" [--scenario name,name] [--soak-seconds S] [--json] [--list]');
    process.exit(2);
  }
  const soakSeconds = values["soak-seconds"] === undefined ? undefined : Number(values["soak-seconds"]);
  if (soakSeconds !== undefined && !(Number.isInteger(soakSeconds) && soakSeconds > 0)) {
    console.error(`--soak-seconds must be a whole number of seconds above 0, not ${values["soak-seconds"]}`);
    process.exit(2);
  }
  const scenarios = SCENARIOS.map((s) => (s.name === "soak" && soakSeconds !== undefined ? soak(soakSeconds) : s));
  const wanted = values.scenario?.split(",").filter((n) => n !== "");
  const unknown = wanted?.filter((n) => !SCENARIOS.some((s) => s.name === n)) ?? [];
  if (unknown.length > 0) {
    console.error(`unknown scenario ${unknown.join(", ")}: see --list`);
    process.exit(2);
  }
  const outcomes: Outcome[] = [];
  for (const s of scenarios.filter((s) => wanted === undefined || wanted.includes(s.name))) {
    const o = await runScenario(s, values.client);
    outcomes.push(o);
    if (values.json) console.log(JSON.stringify(o));
    else console.error(`${o.ok ? "pass" : "FAIL"} ${s.name} (${(o.ms / 1000).toFixed(1)} s)${o.ok ? "" : `\n  ${o.failures.join("\n  ")}\n  evidence:\n    ${(o.evidence ?? []).join("\n    ")}`}`);
  }
  if (!values.json) console.log(table(outcomes));
  process.exit(outcomes.every((o) => o.ok) ? 0 : 1);
}

if (import.meta.url === `file://${process.argv[1]}`) await main();
