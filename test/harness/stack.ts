/**
 * Test stacks: nats-server + redis-server from the harness, the registry initialised, and jetgate
 * processes (workers, later gateways) run as real child processes that tests can SIGKILL.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { fileURLToPath } from "node:url";
import { connect, type Msg, type NatsConnection, type Subscription } from "@nats-io/transport-node";
import { Redis, type RedisOptions } from "ioredis";
import { BROADCAST_PUSH_SUBJECT, ALL_PUSH_SUBJECTS, REDIS_SCRIPTS, type RedisScriptCommands, RedisKeys, decodePushBatch, routedPushSubject, type Push } from "../../protocol/index.js";
import { loadConfig, Dispatcher, RegistryClient, connectNats, scripted, type DispatcherOptions } from "../../protocol/io/index.js";
import { initRegistry } from "../../worker/index.js";
import { GATEWAY_NODE_FLAGS } from "../../gateway/node-flags.js";
import { NatsServer, RedisServer, freePort } from "./servers.js";

export { freePort as freePortForTest };
import { WaitAbort, waitFor } from "./wait.js";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));

export interface Infra {
  nats: NatsServer;
  redis: RedisServer;
  /** Base environment for jetgate processes pointed at these servers. */
  env: Record<string, string>;
  dispose(): Promise<void>;
}

export async function startInfra(env: Record<string, string> = {}, servers: { host?: string; redisArgs?: string[] } = {}): Promise<Infra> {
  const [nats, redis] = await Promise.all([NatsServer.start({ host: servers.host }), RedisServer.start({ host: servers.host, args: servers.redisArgs })]);
  return {
    nats,
    redis,
    env: {
      JETGATE_NATS_URL: nats.url,
      JETGATE_REDIS_URL: redis.url,
      JETGATE_LOG_LEVEL: "warn",
      JETGATE_SHARDS: "2",
      ...env,
    },
    async dispose() {
      await Promise.all([nats.dispose(), redis.dispose()]);
    },
  };
}

/** Runs `registry init` in this process against the infra. */
export async function initStack(env: Record<string, string>): Promise<void> {
  const config = loadConfig(env);
  const nc = await connectNats(config, "test-init");
  try {
    await initRegistry(nc, { ...config, shards: config.JETGATE_SHARDS, by: "test" });
  } finally {
    await nc.close();
  }
}

/** A jetgate process under test. */
export class JetgateProcess {
  readonly output: string[] = [];
  private exitCode: Promise<number | null>;

  constructor(
    readonly proc: ChildProcess,
    /** The gateway's device port (WebSocket, dispatch API); the worker's HTTP port. */
    readonly httpPort: number,
    /** For logs: what it is and where it listens. */
    readonly name: string,
    /** Health, readiness and metrics (the gateway's own listener; the worker's HTTP port). */
    readonly opsPort: number = httpPort,
    /** Where the test reaches its ports: another address for a process on a host of its own. */
    readonly host = "127.0.0.1",
  ) {
    const collect = (d: Buffer) => {
      for (const line of d.toString().split("\n")) if (line.trim()) this.output.push(line);
    };
    proc.stdout?.on("data", collect);
    proc.stderr?.on("data", collect);
    this.exitCode = new Promise((resolve) => proc.on("exit", (code) => resolve(code)));
    allProcesses.add(proc);
    proc.on("exit", () => allProcesses.delete(proc));
  }

  get pid(): number {
    return this.proc.pid!;
  }

  get exited(): Promise<number | null> {
    return this.exitCode;
  }

  async kill(signal: NodeJS.Signals = "SIGKILL"): Promise<number | null> {
    if (this.proc.exitCode === null && this.proc.signalCode === null) this.proc.kill(signal);
    return this.exitCode;
  }

  /** A GET on the operations port (/healthz, /readyz, /metrics). */
  async http(path: string): Promise<{ status: number; text: string }> {
    const res = await fetch(`http://${this.host}:${this.opsPort}${path}`, { signal: AbortSignal.timeout(5000) });
    return { status: res.status, text: await res.text() };
  }

  /** Sum of a Prometheus counter or gauge over the label sets that match `labels`. */
  async metric(name: string, labels: Record<string, string> = {}): Promise<number> {
    return metricIn((await this.http("/metrics")).text, name, labels);
  }
}

/** Sum of a counter or gauge in a Prometheus text exposition, over the label sets that match `labels`. */
export function metricIn(text: string, name: string, labels: Record<string, string> = {}): number {
  let sum = 0;
  for (const line of text.split("\n")) {
    if (!line.startsWith(name)) continue;
    const m = /^([a-z_]+)(\{[^}]*\})?\s+([-\d.e+]+)$/.exec(line);
    if (!m || m[1] !== name) continue;
    const lbl = m[2] ?? "";
    if (Object.entries(labels).every(([k, v]) => lbl.includes(`${k}="${v}"`))) sum += Number(m[3]);
  }
  return sum;
}

const allProcesses = new Set<ChildProcess>();
process.on("exit", () => {
  for (const p of allProcesses) p.kill("SIGKILL");
});

/**
 * Where a jetgate process runs: on a host of its own (test/harness/netns.ts), started through
 * `wrap` (`ip netns exec ...`); `host` is the address the test reaches its listeners at.
 */
export interface Placement {
  wrap: string[];
  host: string;
}

/**
 * Starts `node --import tsx <script>` with ports of its own and waits for /readyz (20 s, or
 * HARNESS_READY_MS: a benchmark's gateway that loads a million revocations first).
 */
async function spawnJetgate(
  what: string,
  script: string,
  portVar: string,
  opsPortVar: string | undefined,
  env: Record<string, string>,
  extra: Record<string, string>,
  nodeArgs: string[],
  place?: Placement,
): Promise<JetgateProcess> {
  const port = extra[portVar] !== undefined ? Number(extra[portVar]) : await freePort();
  const opsPort = opsPortVar === undefined ? port : extra[opsPortVar] !== undefined ? Number(extra[opsPortVar]) : await freePort();
  // HARNESS_DIST=1 runs the compiled build (npm run build), as the container image does;
  // benchmarks use it: tsx's transform gives every function expression an own `name` property,
  // which costs memory per closure that production code does not pay
  const entry = process.env.HARNESS_DIST === "1" ? [`dist/${script.replace(/\.ts$/, ".js")}`] : ["--import", "tsx", script];
  // `ip netns exec` execs the program: the child's pid is node's, so signals reach it
  const [bin, ...args] = [...(place?.wrap ?? []), process.execPath, ...nodeArgs, ...entry];
  const hosts = place === undefined ? { JETGATE_GATEWAY_HOST: "127.0.0.1" } : { JETGATE_GATEWAY_HOST: "0.0.0.0", JETGATE_METRICS_HOST: "0.0.0.0" };
  const proc = spawn(bin!, args, {
    cwd: ROOT,
    env: { PATH: process.env.PATH ?? "", ...hosts, ...env, ...extra, [portVar]: String(port), ...(opsPortVar ? { [opsPortVar]: String(opsPort) } : {}) },
    stdio: ["ignore", "pipe", "pipe"],
  });
  const p = new JetgateProcess(proc, port, `${what} ${place?.host ?? ""}:${port}`, opsPort, place?.host);
  await waitFor(`${what} on port ${port} to be ready`, async () => {
    if (proc.exitCode !== null) throw new WaitAbort(`${what} exited with ${proc.exitCode}:\n${p.output.join("\n")}`);
    return (await p.http("/readyz")).status === 200;
  }, { timeoutMs: Number(process.env.HARNESS_READY_MS ?? 20_000) });
  return p;
}

/** Starts a worker process and waits until it is ready. `nodeArgs` go before the script (e.g. --cpu-prof). */
export function spawnWorker(env: Record<string, string>, extra: Record<string, string> = {}, nodeArgs: string[] = [], place?: Placement): Promise<JetgateProcess> {
  return spawnJetgate("worker", "worker/main.ts", "JETGATE_WORKER_HTTP_PORT", undefined, env, extra, nodeArgs, place);
}

/** Starts a gateway process (on a free port unless `extra` names one) and waits until it is ready. */
export function spawnGateway(env: Record<string, string>, extra: Record<string, string> = {}, nodeArgs: string[] = [], place?: Placement): Promise<JetgateProcess> {
  // the V8 flags a gateway ships with (gateway/node-flags.ts), then the caller's (a later one wins)
  return spawnJetgate("gateway", "gateway/main.ts", "JETGATE_GATEWAY_PORT", "JETGATE_GATEWAY_METRICS_PORT", env, extra, [...GATEWAY_NODE_FLAGS, ...nodeArgs], place);
}

/**
 * Collects live pushes, decoded. Started with a Redis URL it acts as a gateway of its own
 * (COLLECTOR_GATEWAY): `watch(users)` adds it to those users' routes, so the workers send it every
 * entry of theirs from then on (the first one of a user whose hash the watch made goes to every
 * gateway, and the collector takes those too). Without one it listens to every gateway's pushes
 * (`jetgate.push.>`): what the gateways of the test get.
 */
export class PushCollector {
  private subs: Subscription[] = [];

  private constructor(
    readonly nc: NatsConnection,
    readonly pushes: { user: string; push: Push }[],
    private readonly redis: ScriptedTestRedis | undefined,
    private readonly keys: RedisKeys,
  ) {}

  static async start(natsUrl: string, redisUrl?: string, prefix = loadConfig({}).JETGATE_REDIS_PREFIX): Promise<PushCollector> {
    const nc = await connect({ servers: natsUrl });
    const redis = redisUrl === undefined ? undefined : await redisClient(redisUrl);
    const self = new PushCollector(nc, [], redis, new RedisKeys(prefix));
    const take = (m: Msg) => {
      for (const push of decodePushBatch(m.data).pushes) self.pushes.push({ user: push.user, push });
    };
    // as a gateway: its own pushes and those sent to every gateway (a user's routes unknown: its
    // first entry after the collector registered into a new hash goes there)
    const subjects = redisUrl === undefined ? [ALL_PUSH_SUBJECTS] : [routedPushSubject(COLLECTOR_GATEWAY), BROADCAST_PUSH_SUBJECT];
    self.subs = subjects.map((subject) => nc.subscribe(subject, { callback: (_e, m) => take(m) }));
    await nc.flush();
    return self;
  }

  private async register(user: string): Promise<void> {
    await this.redis!.jgRouteAdd(this.keys.watermarks(user), COLLECTOR_GATEWAY, 1, 86_400);
  }

  /** Adds the collector to these users' routes (needs a Redis URL at start); again after Redis lost them. */
  async watch(...users: string[]): Promise<void> {
    if (this.redis === undefined) throw new Error("PushCollector.watch needs a Redis URL at start");
    await Promise.all(users.map((u) => this.register(u)));
  }

  /** Message ids pushed per user. */
  idsByUser(): Map<string, string[]> {
    const out = new Map<string, string[]>();
    for (const { user, push } of this.pushes) out.set(user, [...(out.get(user) ?? []), push.entry.id]);
    return out;
  }

  async close(): Promise<void> {
    for (const sub of this.subs) sub.unsubscribe();
    this.redis?.disconnect();
    await this.nc.close();
  }
}

/** The gateway id a PushCollector registers in users' routes. */
export const COLLECTOR_GATEWAY = "test-collector";

export type ScriptedTestRedis = Redis & RedisScriptCommands;

export async function redisClient(url: string, extra: Pick<RedisOptions, "commandTimeout"> = {}): Promise<ScriptedTestRedis> {
  // the scripts as connectRedis defines them, for tests that drive jetgate's Redis code directly
  const r = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 1, scripts: { ...REDIS_SCRIPTS }, ...extra });
  await r.connect();
  return scripted(r);
}

/**
 * Continuous dispatch load from this process: `rate` entries every `everyMs` to random users of
 * `users`, until stopped. Records every acknowledged message id per user.
 */
export class DispatchLoad {
  readonly sent = new Map<string, string[]>();
  readonly failed: unknown[] = [];
  private running = true;
  private loop: Promise<void>;
  private n = 0;

  constructor(
    private readonly dispatcher: Dispatcher,
    private readonly users: readonly string[],
    opts: { perTick: number; everyMs: number; lane?: string; prefix?: string },
  ) {
    const prefix = opts.prefix ?? "L";
    this.loop = (async () => {
      while (this.running) {
        const batch: Promise<void>[] = [];
        for (let i = 0; i < opts.perTick; i++) {
          const user = users[Math.floor(Math.random() * users.length)]!;
          const id = `${prefix}${this.n++}`;
          batch.push(
            dispatcher.dispatch({ dispatch_id: id, message_id: id, lane: opts.lane ?? "default", recipients: [user], body: new Uint8Array(8) }).then(
              (r) => {
                if ("error" in r[0]!) this.failed.push(r[0]);
                else this.sent.set(user, [...(this.sent.get(user) ?? []), id]);
              },
              (e: unknown) => void this.failed.push(e),
            ),
          );
        }
        await Promise.all(batch);
        await new Promise((r) => setTimeout(r, opts.everyMs));
      }
    })();
  }

  get count(): number {
    let c = 0;
    for (const ids of this.sent.values()) c += ids.length;
    return c;
  }

  allIds(): string[] {
    return [...this.sent.values()].flat();
  }

  async stop(): Promise<void> {
    this.running = false;
    await this.loop;
  }
}

/** A whole test stack: servers, the registry initialised, a NATS client, registry, dispatcher, and jetgate processes. */
export interface Stack {
  infra: Infra;
  nc: NatsConnection;
  registry: RegistryClient;
  dispatcher: Dispatcher;
  /** The current processes; a test that replaces one assigns the new one here so dispose stops it. */
  worker: JetgateProcess | undefined;
  gateway: JetgateProcess | undefined;
  dispose(): Promise<void>;
}

export async function startStack(opts: {
  env?: Record<string, string>;
  lanes?: string[];
  dispatcher?: Partial<DispatcherOptions>;
  /** Worker settings, or false for no worker (the test publishes pushes itself). */
  worker?: Record<string, string> | false;
  gateway?: Record<string, string> | false;
} = {}): Promise<Stack> {
  const infra = await startInfra(opts.env);
  await initStack(infra.env);
  const nc = await connect({ servers: infra.nats.url });
  const registry = await RegistryClient.open(nc);
  const dispatcher = new Dispatcher(nc, () => registry.shards, { lanes: opts.lanes ?? ["default"], ...opts.dispatcher });
  const stack: Stack = {
    infra, nc, registry, dispatcher, worker: undefined, gateway: undefined,
    async dispose() {
      await stack.gateway?.kill();
      await stack.worker?.kill();
      dispatcher.close();
      await registry.close();
      await nc.close();
      await infra.dispose();
    },
  };
  if (opts.worker !== false) stack.worker = await spawnWorker(infra.env, opts.worker ?? {});
  if (opts.gateway !== undefined && opts.gateway !== false) stack.gateway = await spawnGateway(infra.env, opts.gateway);
  if (stack.worker !== undefined) {
    const shards = registry.state.shards.size;
    await waitFor("the worker owns every shard", async () => (await stack.worker!.metric("jetgate_worker_lease_held")) === shards, { timeoutMs: 20_000 });
  }
  return stack;
}
