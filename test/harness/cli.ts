/** Runs the `jetgate` operator CLI as a real process, as an operator would. */
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";

// the TypeScript sources, never a dist/ a benchmark may have built from older sources; with
// HARNESS_DIST=1 (npm test, which builds dist/ first) the build, as for the gateway and the worker:
// a CLI run then starts in half the time
const CLI = process.env.HARNESS_DIST === "1" ? [fileURLToPath(new URL("../../dist/worker/cli.js", import.meta.url))] : ["--import", "tsx", fileURLToPath(new URL("../../worker/cli.ts", import.meta.url))];

export async function runCli(env: Record<string, string>, args: string[], timeoutMs = 120_000): Promise<{ code: number | null; text: string }> {
  const proc = spawn(process.execPath, [...CLI, ...args], { env: { PATH: process.env.PATH ?? "", ...env }, stdio: ["ignore", "pipe", "pipe"] });
  let text = "";
  proc.stdout.on("data", (d: Buffer) => (text += d.toString()));
  proc.stderr.on("data", (d: Buffer) => (text += d.toString()));
  const timer = setTimeout(() => proc.kill("SIGKILL"), timeoutMs);
  const code = await new Promise<number | null>((r) => proc.on("exit", (c) => r(c)));
  clearTimeout(timer);
  return { code, text };
}
