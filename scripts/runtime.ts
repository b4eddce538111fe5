/**
 * Which node runs jetgate on this machine: the host's when it is Node 22 or later and loads
 * uWebSockets.js's native binary; else the provisioned runtime (scripts/runtime-provision.ts: Node
 * on Debian 13's glibc in the cache folder), built on first use.
 *
 *   node --import tsx scripts/runtime.ts [--node 22]             prints that node's path (`npm run runtime`)
 *   node --import tsx scripts/runtime.ts [--node 22] -- ARGS...   runs it with ARGS (npm start, npm test,
 *                                                                 the benchmarks, the fault suite)
 *
 * `--node 22` asks for Node 22 (the host's only when it is 22). Either way one line on stderr says
 * which node and why. A provisioned node is first on the PATH of what it runs, so a `node` or `npm`
 * started below it runs on it too.
 */
import { spawn, spawnSync } from "node:child_process";
import { constants } from "node:os";
import { delimiter, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { UWS_MIN_GLIBC, glibcVersion, versionBelow } from "../gateway/uws.js";
import { NODE_BUILDS, ProvisionError, ensureRuntime, type NodeLine } from "./runtime-provision.js";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const say = (msg: string) => console.error(`[runtime] ${msg}`);

export interface ChosenNode {
  node: string;
  provisioned: boolean;
}

/** Why the host's node will not do for `line`; undefined when it does. */
export function hostProblem(line: NodeLine): string | undefined {
  const major = Number(process.versions.node.split(".")[0]);
  const glibc = glibcVersion();
  const problems: string[] = [];
  if (line === "24" && major < 22) problems.push(`this host's node ${process.version} is older than 22`);
  if (line === "22" && major !== 22) problems.push(`this host's node is ${process.version}, not 22`);
  if (glibc !== undefined && versionBelow(glibc, UWS_MIN_GLIBC)) problems.push(`its glibc ${glibc} is older than the ${UWS_MIN_GLIBC} uWebSockets.js's binaries need`);
  if (problems.length > 0) return problems.join("; ");
  const probe = spawnSync(process.execPath, ["-e", "require('uWebSockets.js')"], { cwd: ROOT, encoding: "utf8" });
  if (probe.status === 0) return undefined;
  return `uWebSockets.js does not load on this host's node ${process.version}: ${probe.stderr.trim().split("\n").filter((l) => /Error/.test(l)).at(-1) ?? probe.stderr.trim()}`;
}

/** The node for `line` here, provisioned first when the host's will not do; says which in one line. */
export async function chooseNode(line: NodeLine): Promise<ChosenNode> {
  const problem = hostProblem(line);
  if (problem === undefined) {
    say(`node ${process.version} (this host's: it loads uWebSockets.js natively)`);
    return { node: process.execPath, provisioned: false };
  }
  const node = await ensureRuntime(line, problem, say);
  say(`node v${NODE_BUILDS[line].version} on Debian 13's glibc, provisioned (${problem}): ${node}`);
  return { node, provisioned: true };
}

/** Runs `node args`, passing signals on; exits as it exits. */
function runOn({ node, provisioned }: ChosenNode, args: string[]): void {
  const env = { ...process.env };
  if (provisioned) env.PATH = `${dirname(node)}${delimiter}${env.PATH ?? ""}`;
  const child = spawn(node, args, { stdio: "inherit", env });
  for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"] as const) process.on(sig, () => child.kill(sig));
  child.on("error", (err) => {
    say(`${node}: ${err.message}`);
    process.exit(1);
  });
  child.on("exit", (code, signal) => process.exit(signal ? 128 + constants.signals[signal] : (code ?? 1)));
}

const USAGE = "usage: node --import tsx scripts/runtime.ts [--node 22|24] [-- NODE_ARGS...]";

async function main(argv: string[]): Promise<void> {
  const dash = argv.indexOf("--");
  const [opts, args] = dash === -1 ? [argv, undefined] : [argv.slice(0, dash), argv.slice(dash + 1)];
  let line: NodeLine = "24";
  if (opts[0] === "--node" && (opts[1] === "22" || opts[1] === "24") && opts.length === 2) line = opts[1];
  else if (opts.length > 0) {
    console.error(USAGE);
    process.exit(2);
  }
  const chosen = await chooseNode(line);
  if (args === undefined) console.log(chosen.node);
  else runOn(chosen, args);
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  main(process.argv.slice(2)).catch((err: unknown) => {
    say(err instanceof ProvisionError ? err.message : String((err as Error)?.stack ?? err));
    process.exit(1);
  });
}
