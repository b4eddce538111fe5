/** Runs the `jetgate` operator CLI as a real process, as an operator would. */
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";

// the TypeScript sources, never a dist/ a benchmark may have built from older sources
const CLI = fileURLToPath(new URL("../../worker/cli.ts", import.meta.url));

export async function runCli(env: Record<string, string>, args: string[], timeoutMs = 120_000): Promise<{ code: number | null; text: string }> {
  const proc = spawn(process.execPath, ["--import", "tsx", CLI, ...args], { env: { PATH: process.env.PATH ?? "", ...env }, stdio: ["ignore", "pipe", "pipe"] });
  let text = "";
  proc.stdout.on("data", (d: Buffer) => (text += d.toString()));
  proc.stderr.on("data", (d: Buffer) => (text += d.toString()));
  const timer = setTimeout(() => proc.kill("SIGKILL"), timeoutMs);
  const code = await new Promise<number | null>((r) => proc.on("exit", (c) => r(c)));
  clearTimeout(timer);
  return { code, text };
}
