/**
 * The four systems `npm run bench` compares, each started fresh on its own servers:
 * jetgate (dispatch -> JetStream -> worker -> gateway), uws-limit (bare uWebSockets.js sending from
 * memory), jetstream-limit (the same shard streams, a bare consumer per stream sending straight to
 * a bare uWebSockets.js server: the floor of storing every entry in JetStream) and socketio
 * (Socket.IO 4.8 + msgpack parser + Redis streams adapter, a producer process).
 */
import { spawn, type ChildProcess } from "node:child_process";
import { createInterface, type Interface } from "node:readline";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { headers } from "@nats-io/transport-node";
import { Dispatcher, RegistryClient, encodeStoredEntry, entrySubject } from "../../protocol/index.js";
import { NatsServer, RedisServer, freePort } from "../../test/harness/servers.js";
import { initStack, spawnGateway, spawnWorker, startInfra, type Infra, type JetgateProcess } from "../../test/harness/stack.js";
import { waitFor } from "../../test/harness/wait.js";
import { Window } from "../window.js";

export type SystemName = "jetgate" | "uws-limit" | "jetstream-limit" | "socketio";
export const SYSTEMS: SystemName[] = ["jetgate", "uws-limit", "jetstream-limit", "socketio"];

export interface System {
  name: SystemName;
  /** Where devices connect. */
  url: string;
  /** The device-facing server process (RSS and CPU are reported for it). */
  serverPid: number;
  /** Every process of the system, by role, for CPU shares. */
  pids: Record<string, number>;
  /** nats-server's monitoring port, where the system has one: messages it handled per entry. */
  natsMonitorPort?: number;
  /** Entries to random users of `users`, as fast as the system takes them (or at `rate`/s), for `seconds`. */
  sendFor(seconds: number, users: number, rate?: number): Promise<number>;
  /** `perUser` entries to each of users 0..users-1 while they are offline; resolves once they are stored. */
  sendEach(users: number, perUser: number): Promise<void>;
  /** The server's recent log lines (for a run that went wrong). */
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

  static node(script: string, args: string[], env: Record<string, string> = {}): LineProcess {
    // every process raises its own open-file limit to the hard limit first
    const cmd = `ulimit -n "$(ulimit -Hn)"; exec "${process.execPath}" --import tsx ${script} ${args.map((a) => `'${a}'`).join(" ")}`;
    return new LineProcess(spawn("sh", ["-c", cmd], { stdio: ["pipe", "pipe", "inherit"], env: { ...process.env, ...env } }));
  }

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
    this.proc.kill("SIGKILL");
    await new Promise((r) => this.proc.once("exit", r));
  }
}

export async function startSystem(name: SystemName): Promise<System> {
  if (name === "jetgate") return startJetgate();
  if (name === "uws-limit") return startUwsLimit();
  if (name === "jetstream-limit") return startJetStreamLimit();
  return startSocketio();
}

async function startJetgate(): Promise<System> {
  const infra: Infra = await startInfra({
    JETGATE_SHARDS: "4", JETGATE_LOG_LEVEL: "error", JETGATE_RATE_USER_FRAMES_PER_S: "100000",
    JETGATE_MAX_CONNS_PER_IP: "0", JETGATE_AUTH_TIMEOUT_MS: "60000",
  });
  const procs: JetgateProcess[] = [];
  await initStack(infra.env);
  // BENCH_PROFILE=gateway|worker: that process runs under --cpu-prof (profile written on stop)
  const prof = (who: string) => (process.env.BENCH_PROFILE === who ? ["--cpu-prof", `--cpu-prof-dir=${process.env.BENCH_PROFILE_DIR ?? "bench/profiles"}`] : []);
  const worker = await spawnWorker(infra.env, {}, prof("worker"));
  const gateway = await spawnGateway(infra.env, { JETGATE_DRAIN_MS: "1000" }, prof("gateway"));
  procs.push(worker, gateway);
  await waitFor("the worker owns every shard", async () => (await worker.metric("jetgate_worker_lease_held")) === 4, { timeoutMs: 30_000 });
  const nc: NatsConnection = await connect({ servers: infra.nats.url });
  const registry = await RegistryClient.open(nc);
  const d = new Dispatcher(nc, () => registry.shards, { lanes: ["default"], maxInFlight: 5000 });
  let n = 0;
  const processed = () => worker.metric("jetgate_worker_entries_processed_total");
  return {
    name: "jetgate",
    url: `ws://127.0.0.1:${gateway.httpPort}/v1/ws`,
    serverPid: gateway.pid,
    // the Dispatcher runs in the benchmark's own process: it is jetgate's producer
    pids: { gateway: gateway.pid, worker: worker.pid, nats: infra.nats.pid!, redis: infra.redis.pid!, producer: process.pid },
    natsMonitorPort: infra.nats.monitorPort,
    logs: () => [...gateway.output.slice(-20), ...worker.output.slice(-20)],
    sendFor: (seconds, users, rate) =>
      paced(seconds, rate, 5000, () => {
        const id = `b${n++}`;
        return d.dispatch({ dispatch_id: id, message_id: id, lane: "default", recipients: [`u${Math.floor(Math.random() * users)}`], body: stampedBody() });
      }),
    async sendEach(users, perUser) {
      const before = await processed();
      const w = new Window(200);
      const recipients = (from: number) => Array.from({ length: Math.min(100, users - from) }, (_, i) => `u${from + i}`);
      for (let k = 0; k < perUser; k++) {
        for (let u = 0; u < users; u += 100) {
          const id = `s${n++}`;
          await w.add(d.dispatch({ dispatch_id: id, message_id: id, lane: "default", recipients: recipients(u), body: stampedBody() }));
        }
      }
      await w.drained();
      // stored and processed by the worker: the devices' catch-up is what is measured, not the worker
      await waitFor("the worker processed the entries", async () => (await processed()) >= before + users * perUser, { timeoutMs: 600_000, intervalMs: 200 });
    },
    async stop() {
      d.close();
      await registry.close();
      await nc.close();
      // SIGTERM: a profiled process writes its profile on the way out
      for (const p of procs) await p.kill(process.env.BENCH_PROFILE ? "SIGTERM" : "SIGKILL");
      await infra.dispose();
    },
  };
}

async function startUwsLimit(): Promise<System> {
  const port = await freePort();
  const server = LineProcess.node("bench/compare/uws-limit-server.ts", [String(port)]);
  await server.next();
  return {
    name: "uws-limit",
    url: `ws://127.0.0.1:${port}/v1/ws`,
    serverPid: server.proc.pid!,
    pids: { server: server.proc.pid! },
    logs: () => [],
    async sendFor(seconds, _users, rate) {
      return (await server.ask({ cmd: "send", seconds, ...(rate !== undefined ? { rate } : {}) })).sent!;
    },
    async sendEach(_users, perUser) {
      // from memory: now to connected devices, at the next AUTH to offline ones
      await server.ask({ cmd: "each", perUser });
    },
    stop: () => server.stop(),
  };
}

/** An entry body: the producer's wall-clock time (float64 ms) first, for the devices' latency. */
function stampedBody(): Uint8Array<ArrayBuffer> {
  const b = new Uint8Array(64);
  new DataView(b.buffer).setFloat64(0, performance.timeOrigin + performance.now());
  return b;
}

/**
 * Sends `one()` for `seconds`, as fast as acks come back (at most `window` in flight), or at
 * `rate`/s in 10 ms ticks; resolves to how many were sent once all are acknowledged.
 */
async function paced(seconds: number, rate: number | undefined, window: number, one: () => Promise<unknown>): Promise<number> {
  const until = performance.now() + seconds * 1000;
  const w = new Window(window);
  let sent = 0;
  if (rate === undefined) {
    while (performance.now() < until) {
      sent++;
      await w.add(one());
    }
  } else {
    const perTick = Math.max(1, Math.round(rate / 100));
    while (performance.now() < until) {
      const t = performance.now();
      for (let i = 0; i < perTick; i++) w.track(one());
      sent += perTick;
      const wait = 10 - (performance.now() - t);
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    }
  }
  await w.drained();
  return sent;
}

/**
 * The jetstream-limit system: the producer (in this process) appends stored entries to the shard
 * streams as the Dispatcher does (core publish with a reply inbox, a Nats-Msg-Id header, one event-loop
 * turn's publishes written together) but with
 * no per-user chain; bench/compare/jetstream-limit-server.ts consumes and sends them.
 */
async function startJetStreamLimit(): Promise<System> {
  const nats = await NatsServer.start();
  const env = { JETGATE_NATS_URL: nats.url, JETGATE_SHARDS: "4", JETGATE_LOG_LEVEL: "error" };
  await initStack(env);
  const port = await freePort();
  const server = LineProcess.node("bench/compare/jetstream-limit-server.ts", [String(port), nats.url, "4"]);
  await server.next();
  const nc: NatsConnection = await connect({ servers: nats.url });
  const registry = await RegistryClient.open(nc);
  const inbox = `_INBOX.jsl.${Math.random().toString(36).slice(2)}`;
  const acks = new Map<string, () => void>();
  nc.subscribe(`${inbox}.*`, { callback: (_e, m) => {
    const k = m.subject.slice(inbox.length + 1);
    acks.get(k)?.();
    acks.delete(k);
  } });
  let n = 0;
  // published together at the end of each event-loop turn, as the Dispatcher does
  const outbox: (() => void)[] = [];
  const publishOutbox = () => {
    for (const p of outbox.splice(0)) p();
  };
  const append = (user: string) => new Promise<void>((resolve) => {
    const id = `j${n++}`;
    const h = headers();
    h.set("Nats-Msg-Id", id);
    acks.set(id, resolve);
    const shard = registry.shards.shardOf(user)!;
    const data = encodeStoredEntry({ id, d: id, ts: Date.now(), b: stampedBody() });
    outbox.push(() => nc.publish(entrySubject(shard, user, "default"), data, { reply: `${inbox}.${id}`, headers: h }));
    if (outbox.length === 1) setImmediate(publishOutbox);
  });
  return {
    name: "jetstream-limit",
    url: `ws://127.0.0.1:${port}/v1/ws`,
    serverPid: server.proc.pid!,
    pids: { server: server.proc.pid!, nats: nats.pid!, producer: process.pid },
    natsMonitorPort: nats.monitorPort,
    logs: () => [],
    sendFor: (seconds, users, rate) => paced(seconds, rate, 5000, () => append(`u${Math.floor(Math.random() * users)}`)),
    async sendEach(users, perUser) {
      const w = new Window(5000);
      for (let k = 0; k < perUser; k++) {
        for (let u = 0; u < users; u++) await w.add(append(`u${u}`));
      }
      await w.drained();
    },
    async stop() {
      await registry.close();
      await nc.close();
      await server.stop();
      await nats.dispose();
    },
  };
}

async function startSocketio(): Promise<System> {
  const redis = await RedisServer.start();
  const port = await freePort();
  const server = LineProcess.node("bench/compare/socketio-server.ts", [String(port), redis.url]);
  await server.next();
  const producer = LineProcess.node("bench/compare/socketio-producer.ts", [redis.url]);
  return {
    name: "socketio",
    url: `http://127.0.0.1:${port}`,
    serverPid: server.proc.pid!,
    pids: { server: server.proc.pid!, producer: producer.proc.pid!, redis: redis.pid! },
    logs: () => [],
    async sendFor(seconds, users, rate) {
      return (await producer.ask({ cmd: "send", seconds, users, ...(rate !== undefined ? { rate } : {}) })).sent!;
    },
    async sendEach(users, perUser) {
      await producer.ask({ cmd: "each", users, perUser });
    },
    async stop() {
      await producer.stop();
      await server.stop();
      await redis.dispose();
    },
  };
}
