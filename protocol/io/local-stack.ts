/**
 * The stack `npm start` runs on one machine, as the tools find it. `npm start` writes
 * `<stack dir>/stack.json` once everything answers: where NATS, Redis, the gateway, the console and
 * the metrics are, and the tokens it made. `npm run dispatch`, the `jetgate` CLI and the benchmark's
 * local mode read it when the environment does not say where NATS is, so README's commands work
 * as written whatever else runs on the machine (an older nats-server on 4222, say).
 *
 * The stack dir is `$JETGATE_STACK_DIR`, else `.jetgate/` in the checkout.
 */
import { existsSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { z } from "zod";
import { JetgateError } from "../errors.js";

/** `<checkout>/.jetgate`: this file is protocol/io/local-stack.ts (or dist/protocol/io/local-stack.js, where no stack runs). */
const DEFAULT_DIR = fileURLToPath(new URL("../../.jetgate/", import.meta.url));

export function stackDir(env: Record<string, string | undefined> = process.env): string {
  return env.JETGATE_STACK_DIR ?? DEFAULT_DIR;
}

const Url = z.string().min(1).max(500);
export const LocalStackSchema = z.object({
  v: z.literal(1),
  /** The `npm start` process: the stack runs while it does. */
  pid: z.number().int().positive(),
  startedAt: z.string(),
  nats: Url,
  redis: Url,
  devices: Url,
  http: Url,
  demo: Url,
  console: Url,
  metrics: Url,
  /** Settings every tool of this stack needs: NATS, Redis, its prefix, the lanes, the tokens. */
  env: z.record(z.string().regex(/^JETGATE_[A-Z0-9_]+$/), z.string().max(10_000)),
});
export type LocalStack = z.output<typeof LocalStackSchema>;

/** No stack answers where a tool looked: the message names the cause and the fix, in one line. */
export class LocalStackError extends JetgateError {
  constructor(message: string) {
    super("NO_LOCAL_STACK", message);
  }
}

export function stackFile(dir: string): string {
  return join(dir, "stack.json");
}

/** Written whole or not at all (a tool never reads half a file). */
export function writeLocalStack(dir: string, stack: LocalStack): void {
  const file = stackFile(dir);
  writeFileSync(`${file}.tmp`, `${JSON.stringify(stack, null, 2)}\n`, { mode: 0o600 });
  renameSync(`${file}.tmp`, file);
}

/** The stack file in `dir`, whether or not it runs; undefined when there is none or it does not parse. */
export function readLocalStack(dir: string): LocalStack | undefined {
  const file = stackFile(dir);
  if (!existsSync(file)) return undefined;
  try {
    const r = LocalStackSchema.safeParse(JSON.parse(readFileSync(file, "utf8")));
    return r.success ? r.data : undefined;
  } catch {
    return undefined;
  }
}

export function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** The stack recorded in `dir` while its `npm start` still runs; undefined otherwise. */
export function runningStack(dir: string): LocalStack | undefined {
  const s = readLocalStack(dir);
  return s !== undefined && processAlive(s.pid) ? s : undefined;
}

/**
 * The environment a tool runs with: as given when it names NATS (JETGATE_NATS_URL), else the
 * running local stack's settings under what it does set. Throws LocalStackError, in one line, when
 * it names no NATS and no stack runs.
 */
export function withLocalStack(env: Record<string, string | undefined>): Record<string, string | undefined> {
  if (env.JETGATE_NATS_URL !== undefined) return env;
  const dir = stackDir(env);
  const recorded = readLocalStack(dir);
  if (recorded === undefined) {
    throw new LocalStackError(`no jetgate stack is running here (no ${stackFile(dir)}): start one with \`npm start\` in another terminal, or set JETGATE_NATS_URL to a running NATS`);
  }
  if (!processAlive(recorded.pid)) {
    throw new LocalStackError(`the jetgate stack in ${dir} is not running (its npm start, pid ${recorded.pid}, started ${recorded.startedAt}, has stopped): start it again with \`npm start\`, or set JETGATE_NATS_URL to a running NATS`);
  }
  const out: Record<string, string | undefined> = { ...recorded.env };
  for (const [k, v] of Object.entries(env)) if (v !== undefined) out[k] = v;
  return out;
}
