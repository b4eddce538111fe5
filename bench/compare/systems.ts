/**
 * The five systems `npm run bench` compares, each started fresh on its own servers, with `nodes`
 * copies of every process that scales out (`--nodes N`):
 * - jetgate: N Dispatcher processes -> JetStream (S shard streams) -> N workers -> N gateways;
 * - uws-limit: N bare uWebSockets.js servers sending from memory, each to its own devices;
 * - jetstream-limit: N producers appending to the same S shard streams, N bare servers each
 *   consuming its share of the streams and sending straight to the devices whose users they hold
 *   (the floor of storing every entry in JetStream);
 * - socketio: N Socket.IO servers on the Redis streams adapter, N producer processes;
 * - centrifugo: N Centrifugo servers on the Redis engine, N producer processes (bench/compare/centrifugo.ts).
 * NATS and Redis are one server each, or with `--cluster` a 3-node NATS cluster with R3 streams and
 * a 3-master Redis Cluster (bench/compare/topology.ts): what they carry is part of what is measured.
 */
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { STAGE_BUCKETS_S, emptyStageCounts, stageCountsOf, type StageCounts } from "../../protocol/index.js";
import { RegistryClient } from "../../protocol/io/index.js";
import { freePort } from "../../test/harness/servers.js";
import { initStack, metricIn, spawnGateway, spawnWorker, type JetgateProcess } from "../../test/harness/stack.js";
import { waitFor } from "../../test/harness/wait.js";
import { startCentrifugo } from "./centrifugo.js";
import { LineProcess, PUSH_LATENCY_BOUNDS, sendSplit, slices, times, type System, type SystemName, type SystemOptions } from "./system-parts.js";
import { startTopology } from "./topology.js";

export async function startSystem(name: SystemName, opts: SystemOptions): Promise<System> {
  if (name === "jetgate") return startJetgate(opts);
  if (name === "uws-limit") return startUwsLimit(opts);
  if (name === "jetstream-limit") return startJetStreamLimit(opts);
  if (name === "centrifugo") return startCentrifugo(opts);
  return startSocketio(opts);
}

/** The producer processes of the systems that append to JetStream (bench/compare/nats-producer.ts). */
async function natsProducers(mode: "dispatcher" | "bare", natsUrls: string[], n: number): Promise<LineProcess[]> {
  // BENCH_PROFILE=producer: jetgate's producers (the Dispatcher) run under --cpu-prof
  const prof = mode === "dispatcher" && process.env.BENCH_PROFILE === "producer" ? ["--cpu-prof", `--cpu-prof-dir=${process.env.BENCH_PROFILE_DIR ?? "bench/profiles"}`] : [];
  return times(n, (k) => LineProcess.node("bench/compare/nats-producer.ts", [mode, natsUrls.join(","), String(k)], {}, prof));
}

/** A process's stage histograms from its /metrics text: per stage, per-bucket counts. */
export function stagesOfMetrics(text: string): Record<string, StageCounts> {
  const bounds = [...STAGE_BUCKETS_S.map(String), "+Inf"];
  const cumulative = new Map<string, number[]>();
  for (const m of text.matchAll(/^jetgate_[a-z]+_stage_seconds_bucket\{([^}]*)\}\s+([-\d.e+]+)$/gm)) {
    const le = /le="([^"]+)"/.exec(m[1]!)?.[1];
    const stage = /stage="([^"]+)"/.exec(m[1]!)?.[1];
    const i = le === undefined ? -1 : bounds.indexOf(le);
    if (stage === undefined || i < 0) continue;
    let c = cumulative.get(stage);
    if (c === undefined) cumulative.set(stage, (c = new Array<number>(bounds.length).fill(0)));
    c[i] = Number(m[2]);
  }
  return Object.fromEntries([...cumulative].map(([k, c]) => [k, stageCountsOf(c)]));
}

/** Adds `b`'s stage counts into `a`. */
export function addStages(a: Record<string, StageCounts>, b: Record<string, StageCounts>): Record<string, StageCounts> {
  for (const [k, counts] of Object.entries(b)) {
    const into = (a[k] ??= emptyStageCounts());
    counts.forEach((n, i) => (into[i]! += n));
  }
  return a;
}

async function startJetgate({ nodes, shards, topology }: SystemOptions): Promise<System> {
  const top = await startTopology(topology, { nats: true, redis: true });
  const infra = {
    env: {
    ...top.env,
    JETGATE_SHARDS: String(shards), JETGATE_LOG_LEVEL: "error", JETGATE_RATE_USER_FRAMES_PER_S: "100000",
    // the hot scenario's 50 devices a user are over the default per-user connection limit
    JETGATE_MAX_CONNS_PER_IP: "0", JETGATE_MAX_CONNS_PER_USER: "1000", JETGATE_AUTH_TIMEOUT_MS: "60000",
    // settings to compare (JETGATE_HOT_CACHE_MAXLEN=0 ...) pass through from the bench's environment
    ...Object.fromEntries(Object.entries(process.env).filter((e): e is [string, string] => e[0].startsWith("JETGATE_") && !e[0].startsWith("JETGATE_HARNESS") && e[1] !== undefined)),
    },
  };
  await initStack(infra.env);
  // BENCH_PROFILE=gateway|worker (|producer, above): those processes run under --cpu-prof (profiles written on stop)
  const prof = (who: string) => (process.env.BENCH_PROFILE === who ? ["--cpu-prof", `--cpu-prof-dir=${process.env.BENCH_PROFILE_DIR ?? "bench/profiles"}`] : []);
  const workers = await Promise.all(times(nodes, () => spawnWorker(infra.env, {}, prof("worker"))));
  // BENCH_GATEWAY_NODE_ARGS: node and V8 flags for the gateways (e.g. "--max-semi-space-size=2"), to compare
  const gatewayArgs = (process.env.BENCH_GATEWAY_NODE_ARGS ?? "").split(" ").filter((a) => a !== "");
  // BENCH_GATEWAY_ENV: more of the gateways' environment, `K=V K=V` (e.g. "MALLOC_ARENA_MAX=2"), to compare
  const gatewayEnv = Object.fromEntries((process.env.BENCH_GATEWAY_ENV ?? "").split(" ").filter((kv) => kv.includes("=")).map((kv) => [kv.slice(0, kv.indexOf("=")), kv.slice(kv.indexOf("=") + 1)]));
  const gateways = await Promise.all(times(nodes, () => spawnGateway(infra.env, { JETGATE_DRAIN_MS: "1000", ...gatewayEnv }, [...prof("gateway"), ...gatewayArgs])));
  const procs: JetgateProcess[] = [...workers, ...gateways];
  // every shard owned, spread evenly (workers hand shards over until each holds its share)
  const share = Math.ceil(shards / nodes);
  await waitFor("the workers own every shard, evenly", async () => {
    const held = await Promise.all(workers.map((w) => w.metric("jetgate_worker_lease_held")));
    return held.reduce((a, b) => a + b, 0) === shards && held.every((h) => h <= share);
  }, { timeoutMs: 60_000 });
  const producers = await natsProducers("dispatcher", top.natsUrls, nodes);
  const processed = async () => (await Promise.all(workers.map((w) => w.metric("jetgate_worker_entries_processed_total")))).reduce((a, b) => a + b, 0);
  return {
    name: "jetgate",
    // one device per user: each user's devices on one gateway, as a load balancer hashing users would
    deviceUrl: (i) => `ws://127.0.0.1:${gateways[i % nodes]!.httpPort}/v1/ws`,
    serverPids: gateways.map((g) => g.pid),
    pids: { gateway: gateways.map((g) => g.pid), worker: workers.map((w) => w.pid), nats: top.natsPids, redis: top.redisPids, producer: producers.map((p) => p.proc.pid!) },
    topology: top.label,
    natsMonitorPorts: top.natsMonitorPorts,
    redisUrls: top.redisUrls,
    async stages() {
      const texts = await Promise.all([...workers, ...gateways].map(async (p) => (await p.http("/metrics")).text));
      const own = (await Promise.all(producers.map((p) => p.ask({ cmd: "stages" })))) as unknown as Record<string, StageCounts>[];
      return [...texts.map(stagesOfMetrics), ...own].reduce(addStages, {});
    },
    async serverHeap() {
      const texts = await Promise.all(gateways.map(async (g) => (await g.http("/metrics")).text));
      const mb = (name: string) => Math.round((texts.reduce((n, t) => n + metricIn(t, name), 0) / 1048576) * 10) / 10;
      return { heap_used_mb: mb("jetgate_gateway_nodejs_heap_size_used_bytes"), heap_total_mb: mb("jetgate_gateway_nodejs_heap_size_total_bytes"), external_mb: mb("jetgate_gateway_nodejs_external_memory_bytes") };
    },
    async counters() {
      // one scrape per process: each scrape is work for it (and restarts its event-loop delay figure,
      // so the longest stall read here is the one since the last reading)
      const scrape = (ps: JetgateProcess[]) => Promise.all(ps.map(async (p) => (await p.http("/metrics")).text));
      const [gw, wk] = await Promise.all([scrape(gateways), scrape(workers)]);
      const sum = (texts: string[], name: string, labels: Record<string, string> = {}) => texts.reduce((n, t) => n + metricIn(t, name, labels), 0);
      const maxMs = (texts: string[], name: string) => Math.round(Math.max(0, ...texts.map((t) => metricIn(t, name))) * 1000);
      return {
        gatewayLoopMaxMs: maxMs(gw, "jetgate_gateway_nodejs_eventloop_lag_max_seconds"),
        workerLoopMaxMs: maxMs(wk, "jetgate_worker_nodejs_eventloop_lag_max_seconds"),
        processed: sum(wk, "jetgate_worker_entries_processed_total"),
        batches: sum(wk, "jetgate_worker_batches_total"),
        pushed: sum(wk, "jetgate_worker_entries_pushed_total"),
        pushMessages: sum(wk, "jetgate_worker_push_messages_total"),
        entriesSent: sum(gw, "jetgate_gateway_entries_sent_total"),
        msgsFrames: sum(gw, "jetgate_gateway_frames_out_total", { type: "MSGS" }),
        // every push a gateway got, for its users or not (stray: a route left behind)
        gatewayPushes: sum(gw, "jetgate_gateway_pushes_received_total") + sum(gw, "jetgate_gateway_stray_pushes_total"),
        // connections the gateways closed (any code: 4408 slow consumer, 4503 a read not answered, ...) and reads to fill gaps
        closes: sum(gw, "jetgate_gateway_closes_total"),
        // and by close code (close_4503: a read the session waited on did not answer)
        ...Object.fromEntries([...new Set(gw.flatMap((t) => [...t.matchAll(/^jetgate_gateway_closes_total\{code="(\d+)"\}/gm)].map((m) => m[1]!)))].map((code) => [`close_${code}`, sum(gw, "jetgate_gateway_closes_total", { code })])),
        slowConsumerCloses: sum(gw, "jetgate_gateway_closes_total", { code: "4408" }),
        gapFills: sum(gw, "jetgate_gateway_gap_fills_total"),
        tailFills: sum(gw, "jetgate_gateway_tail_fills_total"),
        // entries' pushes received by the gateways up to each bound (s) after their dispatch: where a delivery's latency goes
        ...Object.fromEntries(PUSH_LATENCY_BOUNDS.map((le) => [`push_le_${le}`, sum(gw, "jetgate_gateway_push_latency_seconds_bucket", { le })] as const)),
        // and published by the workers up to each bound: the part of it before the worker's push
        ...Object.fromEntries(PUSH_LATENCY_BOUNDS.map((le) => [`wpush_le_${le}`, sum(wk, "jetgate_worker_push_latency_seconds_bucket", { le })] as const)),
      };
    },
    logs: () => procs.flatMap((p) => p.output.slice(-10)),
    sendFor: (seconds, users, rate) => sendSplit(producers, { cmd: "send", seconds, users }, rate),
    async sendEach(users, perUser) {
      const before = await processed();
      await Promise.all(slices(users, nodes).map((sl, k) => producers[k]!.ask({ cmd: "each", ...sl, perUser })));
      // stored and processed by the workers: the devices' catch-up is what is measured, not the workers
      await waitFor("the workers processed the entries", async () => (await processed()) >= before + users * perUser, { timeoutMs: 600_000, intervalMs: 200 });
    },
    async stop() {
      for (const p of producers) await p.stop();
      // BENCH_LOGS=1: what jetgate's processes logged (JETGATE_LOG_LEVEL, error by default), on stderr
      if (process.env.BENCH_LOGS === "1") for (const p of procs) for (const line of p.output) console.error(`${p.name}: ${line}`);
      // SIGTERM: a profiled process writes its profile on the way out
      for (const p of procs) await p.kill(process.env.BENCH_PROFILE ? "SIGTERM" : "SIGKILL");
      await top.dispose();
    },
  };
}

async function startUwsLimit({ nodes }: SystemOptions): Promise<System> {
  const ports = await Promise.all(times(nodes, () => freePort()));
  const servers = ports.map((port, k) => LineProcess.node("bench/compare/uws-limit-server.ts", [String(port), String(k)]));
  await Promise.all(servers.map((s) => s.next()));
  return {
    name: "uws-limit",
    topology: "no servers",
    deviceUrl: (i) => `ws://127.0.0.1:${ports[i % nodes]}/v1/ws`,
    serverPids: servers.map((s) => s.proc.pid!),
    pids: { server: servers.map((s) => s.proc.pid!) },
    logs: () => [],
    // from memory: each server to its own devices
    sendFor: (seconds, _users, rate) => sendSplit(servers, { cmd: "send", seconds }, rate),
    async sendEach(_users, perUser) {
      // now to connected devices, at the next AUTH to offline ones
      await Promise.all(servers.map((s) => s.ask({ cmd: "each", perUser })));
    },
    async stop() {
      for (const s of servers) await s.stop();
    },
  };
}

/**
 * jetstream-limit: the producers append stored entries to the shard streams as the Dispatcher does
 * (bench/compare/nats-producer.ts, `bare`); server k consumes shards k, k+N, ... and holds the
 * devices of their users (bench/compare/jetstream-limit-server.ts).
 */
async function startJetStreamLimit({ nodes, shards, topology }: SystemOptions): Promise<System> {
  const top = await startTopology(topology, { nats: true, redis: false });
  const natsUrl = top.natsUrls.join(",");
  await initStack({ ...top.env, JETGATE_SHARDS: String(shards), JETGATE_LOG_LEVEL: "error" });
  const ports = await Promise.all(times(nodes, () => freePort()));
  const servers = ports.map((port, k) => {
    const mine = times(shards, (s) => s).filter((s) => s % nodes === k);
    return LineProcess.node("bench/compare/jetstream-limit-server.ts", [String(port), natsUrl, mine.join(",")]);
  });
  await Promise.all(servers.map((s) => s.next()));
  const nc: NatsConnection = await connect({ servers: top.natsUrls });
  const registry = await RegistryClient.open(nc);
  const producers = await natsProducers("bare", top.natsUrls, nodes);
  return {
    name: "jetstream-limit",
    deviceUrl: (i) => `ws://127.0.0.1:${ports[registry.shards.shardOf(`u${i}`)! % nodes]}/v1/ws`,
    serverPids: servers.map((s) => s.proc.pid!),
    pids: { server: servers.map((s) => s.proc.pid!), nats: top.natsPids, producer: producers.map((p) => p.proc.pid!) },
    topology: top.label,
    natsMonitorPorts: top.natsMonitorPorts,
    logs: () => [],
    sendFor: (seconds, users, rate) => sendSplit(producers, { cmd: "send", seconds, users }, rate),
    async sendEach(users, perUser) {
      await Promise.all(slices(users, nodes).map((sl, k) => producers[k]!.ask({ cmd: "each", ...sl, perUser })));
    },
    async stop() {
      for (const p of producers) await p.stop();
      await registry.close();
      await nc.close();
      for (const s of servers) await s.stop();
      await top.dispose();
    },
  };
}

async function startSocketio({ nodes, topology }: SystemOptions): Promise<System> {
  const top = await startTopology(topology, { nats: false, redis: true });
  // on a Redis Cluster the adapter's one stream lives on one master; ioredis's Cluster client finds it
  const redis = [top.redisUrls.join(","), String(top.redisCluster)];
  const ports = await Promise.all(times(nodes, () => freePort()));
  const servers = ports.map((port) => LineProcess.node("bench/compare/socketio-server.ts", [String(port), ...redis]));
  await Promise.all(servers.map((s) => s.next()));
  const producers = times(nodes, (k) => LineProcess.node("bench/compare/socketio-producer.ts", [...redis, String(k)]));
  return {
    name: "socketio",
    deviceUrl: (i) => `http://127.0.0.1:${ports[i % nodes]}`,
    serverPids: servers.map((s) => s.proc.pid!),
    pids: { server: servers.map((s) => s.proc.pid!), producer: producers.map((p) => p.proc.pid!), redis: top.redisPids },
    topology: top.label,
    redisUrls: top.redisUrls,
    logs: () => [],
    sendFor: (seconds, users, rate) => sendSplit(producers, { cmd: "send", seconds, users }, rate),
    async sendEach(users, perUser) {
      await Promise.all(slices(users, nodes).map((sl, k) => producers[k]!.ask({ cmd: "each", ...sl, perUser })));
    },
    async stop() {
      for (const p of producers) await p.stop();
      for (const s of servers) await s.stop();
      await top.dispose();
    },
  };
}
