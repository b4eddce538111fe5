/**
 * What `npm start` shows a person: its own lines, the children's warnings as text (pino writes
 * JSON lines; nats-server and redis-server their own formats), and the greeting. Every child's
 * whole output goes to `<stack dir>/logs/<name>.log`.
 */
import { createWriteStream, mkdirSync, type WriteStream } from "node:fs";
import { join } from "node:path";

export const say = (msg: string): void => console.log(`[start] ${msg}`);

const PINO_LEVELS: Record<number, string> = { 10: "trace", 20: "debug", 30: "info", 40: "warn", 50: "error", 60: "fatal" };
/** Fields of a pino line that the text form leaves out: the rest follows the message as k=v. */
const PINO_BASE = new Set(["level", "time", "pid", "hostname", "msg", "component", "gateway", "worker"]);

/**
 * One line of a child's output as a person reads it, or undefined to show none (it is in the log
 * file): pino lines as `level: msg (k=v ...)` from warn up; nats-server's and redis-server's only
 * when they warn or fail.
 */
export function humanLine(name: string, line: string): string | undefined {
  if (line.startsWith("{")) {
    let rec: Record<string, unknown>;
    try {
      rec = JSON.parse(line) as Record<string, unknown>;
    } catch {
      return line;
    }
    const level = typeof rec.level === "number" ? rec.level : 30;
    if (level < 40) return undefined;
    const extra = Object.entries(rec)
      .filter(([k]) => !PINO_BASE.has(k))
      .map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`);
    return `${PINO_LEVELS[level] ?? level}: ${String(rec.msg ?? "")}${extra.length > 0 ? ` (${extra.join(" ")})` : ""}`;
  }
  if (name === "nats") return /\[(ERR|FTL|WRN)\]/.test(line) ? line.replace(/^\[\d+\] \S+ \S+ /, "") : undefined;
  // (the overcommit warning is about the machine's settings, not the stack's, and only matters for RDB saves it does not make)
  if (name === "redis") return /# (WARNING|Warning)|FATAL|Can't/.test(line) && !/overcommit/i.test(line) ? line.replace(/^\d+:\w \d+ \w+ \d+ [\d:.]+ /, "") : undefined;
  return line;
}

/** Where a child's lines go: all to its log file, the ones a person should see to the terminal. */
export class ChildOutput {
  private readonly file: WriteStream;
  private rest = "";

  constructor(
    readonly name: string,
    logDir: string,
    private readonly quiet: () => boolean,
  ) {
    mkdirSync(logDir, { recursive: true });
    this.file = createWriteStream(join(logDir, `${name}.log`), { flags: "a" });
  }

  write(chunk: Buffer): void {
    this.file.write(chunk);
    const lines = (this.rest + chunk.toString()).split("\n");
    this.rest = lines.pop() ?? "";
    for (const line of lines) {
      if (line.trim() === "" || this.quiet()) continue;
      const shown = humanLine(this.name, line);
      if (shown !== undefined) console.log(`[${this.name}] ${shown}`);
    }
  }

  close(): void {
    this.file.end();
  }
}

export interface Greeting {
  dir: string;
  devices: string;
  demo: string;
  console: string;
  adminToken: string;
  metrics: string;
  http: string;
  serviceToken: string;
  user: string;
  resumed: boolean;
}

export function greeting(g: Greeting): string {
  const rows = [
    ["devices", g.devices],
    ["demo page", g.demo],
    ["console", `${g.console}   token: ${g.adminToken}`],
    ["metrics", g.metrics],
    ["dispatch", `npm run dispatch -- --to ${g.user} --text "hello"`],
    ["HTTP API", `curl -H "Authorization: Bearer ${g.serviceToken}" ${g.http}/v1/users/${g.user}/mailbox`],
  ];
  const kept = g.resumed ? "the mailboxes of the last run, resumed" : "a new stack";
  return [
    `jetgate is running: ${kept}, kept in ${g.dir} (npm start -- --fresh starts clean)`,
    ...rows.map(([k, v]) => `  ${k!.padEnd(10)} ${v}`),
    "  Ctrl-C stops everything.",
  ].join("\n");
}
