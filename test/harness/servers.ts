/**
 * Starts real nats-server and redis-server processes on free loopback ports, each in its own temp
 * dir, so tests can stop, SIGKILL and restart them. Every process started here is killed when the
 * test process exits, even after a failure.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, readFileSync, writeFileSync } from "node:fs";
import { createServer, createConnection } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { waitFor } from "./wait.js";

import { pinnedNatsServerPath } from "../../scripts/pinned.js";

/** The pinned nats-server (scripts/pinned.ts; `npm test` builds it first), or NATS_SERVER_BIN. */
export const NATS_BIN = process.env.NATS_SERVER_BIN ?? pinnedNatsServerPath();
/** Debian's nats-server (2.9.10 on bookworm): only for the test that jetgate refuses a server too old. */
export const OLD_NATS_BIN = "/usr/sbin/nats-server";
const REDIS_BIN = process.env.REDIS_SERVER_BIN ?? "redis-server";

const live = new Set<ChildProcess>();
process.on("exit", () => {
  for (const p of live) p.kill("SIGKILL");
});

/**
 * Ports handed out to this process, reserved against every other test process until it exits.
 * Test files run in parallel processes, and a test that restarts a server on its port leaves that
 * port free for a moment: another process asking the OS for a free port could get it, start its
 * own Redis there, and the first test would then restart onto (and FLUSHALL) the other one's Redis.
 * Seen as devices of the e2e test missing entries after "Redis lost the worker set".
 */
const PORT_DIR = join(tmpdir(), "jetgate-test-ports");
const reserved = new Set<number>();
process.on("exit", () => {
  for (const port of reserved) rmSync(join(PORT_DIR, String(port)), { force: true });
});

/** Reserves `port` for this process: one file per port, created by one process only; a dead owner's is taken over. */
function reserve(port: number): boolean {
  mkdirSync(PORT_DIR, { recursive: true });
  const file = join(PORT_DIR, String(port));
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      writeFileSync(file, String(process.pid), { flag: "wx" });
      reserved.add(port);
      return true;
    } catch {
      let owner: number;
      try {
        owner = Number(readFileSync(file, "utf8"));
      } catch {
        continue; // released meanwhile: try again
      }
      if (alive(owner)) return false;
      rmSync(file, { force: true });
    }
  }
  return false;
}

function alive(pid: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** A port that was free a moment ago (the OS picks it) and that no other test process holds. */
export async function freePort(): Promise<number> {
  for (let i = 0; i < 200; i++) {
    const port = await osFreePort();
    if (reserve(port)) return port;
  }
  throw new Error("no free port that another test process does not hold, after 200 tries");
}

function osFreePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.unref();
    srv.on("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address();
      srv.close(() => (typeof addr === "object" && addr !== null ? resolve(addr.port) : reject(new Error("no port"))));
    });
  });
}

function tail(file: string, lines = 20): string {
  try {
    return readFileSync(file, "utf8").trim().split("\n").slice(-lines).join("\n");
  } catch {
    return "(no log)";
  }
}

/** One server process that can be stopped, killed and started again on the same port and data dir. */
export abstract class ServerProcess {
  readonly dir: string;
  readonly port: number;
  protected proc: ChildProcess | undefined;
  private exited: Promise<void> = Promise.resolve();

  protected constructor(prefix: string, port: number) {
    this.dir = mkdtempSync(join(tmpdir(), `jetgate-${prefix}-`));
    this.port = port;
  }

  abstract get url(): string;
  protected abstract command(): { bin: string; args: string[]; log: string };
  protected abstract ready(): Promise<boolean>;

  get pid(): number | undefined {
    return this.proc?.pid;
  }

  get running(): boolean {
    return this.proc !== undefined;
  }

  async start(timeoutMs = 15_000): Promise<this> {
    if (this.proc) return this;
    const { bin, args, log } = this.command();
    const proc = spawn(bin, args, { stdio: "ignore", detached: false });
    this.proc = proc;
    live.add(proc);
    let spawnError: Error | undefined;
    proc.on("error", (e) => (spawnError = e));
    this.exited = new Promise((resolve) => {
      proc.on("exit", () => {
        live.delete(proc);
        if (this.proc === proc) this.proc = undefined;
        resolve();
      });
    });
    try {
      await waitFor(`${bin} on port ${this.port} to be ready`, async () => {
        if (spawnError) throw new Error(`cannot run ${bin}: ${spawnError.message}${bin === NATS_BIN ? " (npm test builds it first; alone: node --import tsx scripts/pinned.ts install)" : ""}`);
        if (!this.proc) throw new Error(`${bin} exited during start; log:\n${tail(log)}`);
        return this.ready();
      }, { timeoutMs, intervalMs: 25 });
    } catch (err) {
      proc.kill("SIGKILL");
      throw err;
    }
    return this;
  }

  /** Sends a signal and waits for the process to exit. */
  async signal(sig: NodeJS.Signals, timeoutMs = 10_000): Promise<void> {
    const proc = this.proc;
    if (!proc) return;
    proc.kill(sig);
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<"timeout">((resolve) => (timer = setTimeout(() => resolve("timeout"), timeoutMs)));
    const outcome = await Promise.race([this.exited.then(() => "exited" as const), timedOut]);
    clearTimeout(timer);
    if (outcome === "timeout") {
      proc.kill("SIGKILL");
      await this.exited;
    }
  }

  /** Graceful stop (SIGTERM). */
  stop(): Promise<void> {
    return this.signal("SIGTERM");
  }

  /** Hard kill (SIGKILL): no chance to flush or say goodbye. */
  kill(): Promise<void> {
    return this.signal("SIGKILL");
  }

  /** SIGSTOP / SIGCONT: the process keeps its sockets but stops answering (a partition look-alike). */
  pause(): void {
    this.proc?.kill("SIGSTOP");
  }

  resume(): void {
    this.proc?.kill("SIGCONT");
  }

  async restart(): Promise<this> {
    await this.stop();
    return this.start();
  }

  /** Stops the process and removes its data dir. */
  async dispose(): Promise<void> {
    this.resume();
    await this.kill();
    rmSync(this.dir, { recursive: true, force: true });
  }
}

export interface NatsOptions {
  jetstream?: boolean;
  /** Extra nats-server arguments (auth, TLS, cluster routes). */
  args?: string[];
  /** A config file's text (JetStream domain, leafnodes, cluster); flags still set ports and store. */
  config?: string;
  /** Fixed client port (a cluster's routes name each other's ports up front). */
  port?: number;
  /** Listen address; 0.0.0.0 for partition tests, whose hosts reach it over their own links. */
  host?: string;
  /** Another nats-server binary than the pinned one (OLD_NATS_BIN). */
  bin?: string;
}

export class NatsServer extends ServerProcess {
  readonly monitorPort: number;
  private readonly opts: NatsOptions;

  private constructor(port: number, monitorPort: number, opts: NatsOptions) {
    super("nats", port);
    this.monitorPort = monitorPort;
    this.opts = opts;
  }

  static async start(opts: NatsOptions = {}): Promise<NatsServer> {
    const srv = new NatsServer(opts.port ?? (await freePort()), await freePort(), opts);
    return srv.start();
  }

  get url(): string {
    return `nats://127.0.0.1:${this.port}`;
  }

  protected command() {
    const log = join(this.dir, "nats.log");
    const args = ["-a", this.opts.host ?? "127.0.0.1", "-p", String(this.port), "-m", String(this.monitorPort), "-l", log];
    if (this.opts.config !== undefined) {
      const file = join(this.dir, "nats.conf");
      writeFileSync(file, this.opts.config);
      args.unshift("-c", file);
    }
    if (this.opts.jetstream !== false) args.push("-js", "-sd", join(this.dir, "store"));
    args.push(...(this.opts.args ?? []));
    return { bin: this.opts.bin ?? NATS_BIN, args, log };
  }

  protected async ready(): Promise<boolean> {
    // /healthz answers ok only once JetStream (when enabled) is up.
    const res = await fetch(`http://127.0.0.1:${this.monitorPort}/healthz`);
    return res.ok;
  }
}

export interface RedisOptions {
  args?: string[];
  /** Listen address; 0.0.0.0 for partition tests (protected mode off: they reach it from other hosts). */
  host?: string;
}

export class RedisServer extends ServerProcess {
  private readonly opts: RedisOptions;

  private constructor(port: number, opts: RedisOptions) {
    super("redis", port);
    this.opts = opts;
  }

  static async start(opts: RedisOptions = {}): Promise<RedisServer> {
    const srv = new RedisServer(await freePort(), opts);
    return srv.start();
  }

  get url(): string {
    return `redis://127.0.0.1:${this.port}`;
  }

  protected command() {
    const log = join(this.dir, "redis.log");
    const args = [
      "--port", String(this.port), "--bind", this.opts.host ?? "127.0.0.1", ...(this.opts.host !== undefined ? ["--protected-mode", "no"] : []), "--dir", this.dir, "--logfile", log,
      "--save", "", "--appendonly", "no", "--daemonize", "no", ...(this.opts.args ?? []),
    ];
    return { bin: REDIS_BIN, args, log };
  }

  protected ready(): Promise<boolean> {
    return new Promise((resolve, reject) => {
      const sock = createConnection({ host: "127.0.0.1", port: this.port });
      sock.setTimeout(1000);
      sock.on("connect", () => sock.write("PING\r\n"));
      sock.on("data", (d) => {
        sock.destroy();
        // with ACLs on, the default user may be refused: the server still answered
        resolve(/^(\+PONG|-NOAUTH)/.test(d.toString()));
      });
      sock.on("timeout", () => {
        sock.destroy();
        resolve(false);
      });
      sock.on("error", (e) => {
        sock.destroy();
        reject(e);
      });
    });
  }
}

/** Starts servers together; if one fails, the others are disposed before the error goes on. */
export async function startAll<T extends { dispose(): Promise<void> }>(starts: (() => Promise<T>)[]): Promise<T[]> {
  const settled = await Promise.allSettled(starts.map((s) => s()));
  const failed = settled.find((r) => r.status === "rejected");
  if (failed === undefined) return settled.map((r) => (r as PromiseFulfilledResult<T>).value);
  await Promise.all(settled.flatMap((r) => (r.status === "fulfilled" ? [r.value.dispose()] : [])));
  throw (failed as PromiseRejectedResult).reason;
}
