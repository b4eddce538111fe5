/**
 * What every system of `npm run bench` is made of (bench/compare/systems.ts starts them): the
 * System interface the scenarios drive, the JSON-lines child process each producer, server and
 * device generator is, and the small helpers they share. A system in a file of its own imports
 * these from here, never from systems.ts, so no import circle forms.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { createInterface, type Interface } from "node:readline";
import { PUSH_LATENCY_BUCKETS_S, type StageCounts } from "../../protocol/index.js";
import type { TopologyKind } from "./topology.js";

export type SystemName = "jetgate" | "uws-limit" | "jetstream-limit" | "socketio" | "centrifugo";
export const SYSTEMS: SystemName[] = ["jetgate", "uws-limit", "jetstream-limit", "socketio", "centrifugo"];

export interface SystemOptions {
  /** Copies of every process that scales out. */
  nodes: number;
  /** Shard streams (jetgate, jetstream-limit). */
  shards: number;
  /** One server of NATS and of Redis, or clusters of them (`--cluster`, bench/compare/topology.ts). */
  topology: TopologyKind;
}

export interface System {
  name: SystemName;
  /** The server's own version line, where it is a third-party binary (rows carry it as `server_version`). */
  version?: string;
  /** Where the device of user `u<i>` connects (as a load balancer would place it). */
  deviceUrl(i: number): string;
  /** The device-facing server processes (RSS and CPU are reported for them). */
  serverPids: number[];
  /** Every process of the system, by role, for CPU shares. */
  pids: Record<string, number[]>;
  /** The servers it runs on, as a row names them (Topology.label). */
  topology: string;
  /** nats-server's monitoring ports (one per node), where the system has NATS: messages handled per entry. */
  natsMonitorPorts?: number[];
  /** Redis's nodes, where the system has Redis: commands run per entry (INFO commandstats of each). */
  redisUrls?: string[];
  /**
   * jetgate's stage histograms (protocol/stages.ts) so far, summed over its processes: per stage,
   * the count in each bucket of STAGE_BUCKETS_S (then above it). Two readings' difference is a phase's.
   */
  stages?(): Promise<Record<string, StageCounts>>;
  /** The servers' V8 heap (MiB, used and committed) and the memory V8 knows of outside it (external: array buffers, native objects held from JS), where the system can tell: jetgate's gateways, from their metrics. */
  serverHeap?(): Promise<{ heap_used_mb: number; heap_total_mb: number; external_mb: number }>;
  /** jetgate's own counters, summed over its processes: what its batching and framing cut. */
  counters?(): Promise<Record<string, number>>;
  /** Entries to random users of `users`, as fast as the system takes them (or at `rate`/s in all), for `seconds`. */
  sendFor(seconds: number, users: number, rate?: number): Promise<number>;
  /** `perUser` entries to each of users 0..users-1 while they are offline; resolves once they are stored. */
  sendEach(users: number, perUser: number): Promise<void>;
  /** The servers' recent log lines (for a run that went wrong). */
  logs(): string[];
  stop(): Promise<void>;
}

/** A child process spoken to in JSON lines. */
export class LineProcess {
  private readonly lines: Interface;
  private readonly waiting: ((o: Record<string, number>) => void)[] = [];
  constructor(readonly proc: ChildProcess) {
    this.lines = createInterface({ input: proc.stdout! });
    this.lines.on("line", (l) => {
      if (!l.startsWith("{")) return;
      this.waiting.shift()?.(JSON.parse(l) as Record<string, number>);
    });
  }

  static node(script: string, args: string[], env: Record<string, string> = {}, nodeArgs: string[] = []): LineProcess {
    // every process raises its own open-file limit to the hard limit first
    const cmd = `ulimit -n "$(ulimit -Hn)"; exec "${process.execPath}" ${nodeArgs.join(" ")} --import tsx ${script} ${args.map((a) => `'${a}'`).join(" ")}`;
    const p = new LineProcess(spawn("sh", ["-c", cmd], { stdio: ["pipe", "pipe", "inherit"], env: { ...process.env, ...env } }));
    p.profiled = nodeArgs.includes("--cpu-prof");
    return p;
  }

  /** Runs under --cpu-prof: stop() asks it to exit instead of killing it. */
  private profiled = false;

  next(): Promise<Record<string, number>> {
    return new Promise((resolve) => this.waiting.push(resolve));
  }

  async ask(o: object): Promise<Record<string, number>> {
    const answer = this.next();
    this.proc.stdin!.write(JSON.stringify(o) + "\n");
    return answer;
  }

  async stop(): Promise<void> {
    if (this.proc.exitCode !== null || this.proc.signalCode !== null) return;
    const exited = new Promise((r) => this.proc.once("exit", r));
    // a profiled process is asked to exit, so that node writes its profile
    if (this.profiled) {
      this.proc.stdin!.write(JSON.stringify({ cmd: "exit" }) + "\n");
      if (await Promise.race([exited.then(() => true), new Promise((r) => setTimeout(() => r(false), 10_000))])) return;
    }
    this.proc.kill("SIGKILL");
    await exited;
  }
}

export const times = <T>(n: number, f: (k: number) => T): T[] => Array.from({ length: n }, (_, k) => f(k));
/** The push latency histograms' bounds, as their `le` labels print them. */
export const PUSH_LATENCY_BOUNDS = [...PUSH_LATENCY_BUCKETS_S.map(String), "+Inf"];
export const sum = (xs: Record<string, number>[], key: string) => xs.reduce((n, x) => n + (x[key] ?? 0), 0);

/** `rate` in all, split evenly over `procs`: each sends its share (all as fast as they go without one). */
export async function sendSplit(procs: LineProcess[], o: object, rate: number | undefined): Promise<number> {
  const answers = await Promise.all(procs.map((p) => p.ask({ ...o, ...(rate !== undefined ? { rate: Math.max(1, rate / procs.length) } : {}) })));
  return sum(answers, "sent");
}

/** Users 0..users-1 in `n` contiguous slices. */
export const slices = (users: number, n: number) => times(n, (k) => ({ from: Math.floor((users * k) / n), to: Math.floor((users * (k + 1)) / n) }));

