/**
 * The client under test as the kit sees it: a process speaking the line protocol of
 * docs/conformance.md. One `ClientProcess` per life of a device; the events of every life go into
 * one shared log, so a scenario's checks see the device across restarts.
 */
import { spawn, type ChildProcessWithoutNullStreams } from "node:child_process";
import { createInterface } from "node:readline";

/** One event of the client under test, tagged with the life it came from. */
export type ClientEvent = { ev: string; life: number; at: number } & Record<string, unknown>;

export class DeviceLog {
  readonly events: ClientEvent[] = [];
  readonly stderr: string[] = [];
  lives = 0;
  private readonly waiters = new Set<() => void>();

  push(e: ClientEvent): void {
    this.events.push(e);
    for (const w of this.waiters) w();
  }

  of(ev: string): ClientEvent[] {
    return this.events.filter((e) => e.ev === ev);
  }

  /** Resolves when `done()` holds, checked after each event; rejects after `timeoutMs` naming `what`. */
  until(what: string, done: () => boolean, timeoutMs = 20_000): Promise<void> {
    if (done()) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const check = () => {
        if (!done()) return;
        clearTimeout(timer);
        this.waiters.delete(check);
        resolve();
      };
      const timer = setTimeout(() => {
        this.waiters.delete(check);
        reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what}; last events: ${this.events.slice(-5).map((e) => JSON.stringify(e)).join(" ")}`));
      }, timeoutMs);
      this.waiters.add(check);
    });
  }
}

export interface StartOptions {
  urls: string[];
  device: string;
  /** The file the client keeps its cursor in; it outlives the process. */
  store: string;
  lanes?: string[];
  /** Answers each `token` event. */
  token: () => Promise<string>;
  /** Extra environment for the client's process (the kit's own test plants bugs through it). */
  env?: Record<string, string>;
}

export class ClientProcess {
  private readonly proc: ChildProcessWithoutNullStreams;
  private nextReq = 1;
  readonly exited: Promise<number | null>;
  readonly life: number;

  private constructor(
    command: string,
    readonly log: DeviceLog,
    private readonly opts: StartOptions,
  ) {
    this.life = ++log.lives;
    this.proc = spawn("sh", ["-c", `exec ${command}`], { env: { ...process.env, ...opts.env }, stdio: ["pipe", "pipe", "pipe"] });
    this.exited = new Promise((r) => this.proc.on("exit", (code) => r(code)));
    this.proc.stdin.on("error", () => undefined); // a client killed mid-write
    createInterface({ input: this.proc.stderr }).on("line", (l) => log.stderr.push(`[life ${this.life}] ${l}`));
    createInterface({ input: this.proc.stdout }).on("line", (line) => this.onLine(line));
  }

  /** Starts a life of the device: the process, then its `start` command. */
  static async start(command: string, log: DeviceLog, opts: StartOptions): Promise<ClientProcess> {
    const p = new ClientProcess(command, log, opts);
    const life = p.life;
    await log.until(`the client's hello (life ${life})`, () => log.events.some((e) => e.life === life && e.ev === "hello"), 30_000);
    p.write({ cmd: "start", urls: opts.urls, device: opts.device, store: opts.store, ...(opts.lanes ? { lanes: opts.lanes } : {}) });
    return p;
  }

  private onLine(line: string): void {
    if (line.trim() === "") return;
    let parsed: Record<string, unknown>;
    try {
      parsed = JSON.parse(line) as Record<string, unknown>;
    } catch {
      this.log.stderr.push(`[life ${this.life}] not JSON on stdout: ${line.slice(0, 200)}`);
      return;
    }
    if (typeof parsed.ev !== "string") return;
    const e = { ...parsed, ev: parsed.ev, life: this.life, at: Date.now() } as ClientEvent;
    this.log.push(e);
    if (e.ev === "token") void this.opts.token().then((token) => this.write({ cmd: "token", req: e.req, token }));
  }

  write(cmd: Record<string, unknown>): void {
    if (this.proc.exitCode === null && !this.proc.stdin.destroyed) this.proc.stdin.write(`${JSON.stringify(cmd)}\n`);
  }

  /** Sends a body with a client message id; resolves to the `sent` or `send_failed` event. */
  async send(cmid: string, body: Uint8Array): Promise<ClientEvent> {
    const req = this.nextReq++;
    this.write({ cmd: "send", req, cmid, b: Buffer.from(body).toString("base64") });
    let answer: ClientEvent | undefined;
    await this.log.until(`the answer to send ${cmid}`, () => (answer = this.log.events.find((e) => e.life === this.life && (e.ev === "sent" || e.ev === "send_failed") && e.req === req)) !== undefined);
    return answer!;
  }

  failNext(n: number): void {
    this.write({ cmd: "fail_next", n });
  }

  /** Stops the client as an app that exits would; resolves when the process has ended. */
  async stop(timeoutMs = 10_000): Promise<void> {
    this.write({ cmd: "stop" });
    const timer = setTimeout(() => this.proc.kill("SIGKILL"), timeoutMs);
    await this.exited;
    clearTimeout(timer);
  }

  /** A crash (SIGKILL) or a pause (SIGSTOP / SIGCONT). */
  signal(sig: NodeJS.Signals): void {
    this.proc.kill(sig);
  }

  async kill(): Promise<void> {
    if (this.proc.exitCode === null && this.proc.signalCode === null) this.proc.kill("SIGKILL");
    await this.exited;
  }
}
