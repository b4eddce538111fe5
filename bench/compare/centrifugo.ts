/**
 * centrifugo: Centrifugo v6 (the pinned build, scripts/pinned.ts) set up as a Centrifugo user who
 * wants jetgate's guarantees would set it up: N server processes on one redis-server (the Redis
 * engine: PUB/SUB between the nodes, each channel's history in a Redis stream; with --cluster, a
 * Redis Cluster given as `cluster_address`), one personal
 * channel per user (`user:<user>`, namespace `user`) subscribed server-side through the connection JWT's
 * `channels` claim, with history, recovery and positioning forced on (a device that reconnects gets
 * what it missed from history; a gap in the live stream makes it reconnect and recover). Entries
 * come from N producer processes through the server HTTP API's `batch` command
 * (bench/compare/centrifugo-producer.ts); devices speak the client protocol with the `centrifuge`
 * SDK over protobuf (bench/compare/devices.ts).
 */
import { spawn, execFileSync, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import { DEV_JWT_SECRET } from "../../protocol/index.js";
import { ensurePinned } from "../../scripts/pinned.js";
import { freePort } from "../../test/harness/servers.js";
import { WaitAbort, waitFor } from "../../test/harness/wait.js";
import { LineProcess, sendSplit, slices, times, type System, type SystemOptions } from "./system-parts.js";
import { startTopology } from "./topology.js";

/** The namespace of the users' personal channels (`user:<user>`; a name has 2 characters or more). */
export const CENTRIFUGO_NAMESPACE = "user";

/**
 * One node's config (Centrifugo v6's JSON config). Every option set is one the bench needs or one
 * of the guarantees compared; the rest are Centrifugo's defaults.
 */
export function centrifugoConfig(o: { port: number; redisUrls: string[]; redisCluster: boolean; apiKey: string; hmacSecret: string; name: string }): object {
  // a Redis Cluster (--cluster) is one shard given by its seed nodes, host:port each
  const redis = o.redisCluster ? { cluster_address: [o.redisUrls.map((u) => new URL(u).host).join(",")] } : { address: o.redisUrls };
  return {
    http_server: { address: "127.0.0.1", port: o.port },
    log: { level: "warn" },
    // every node on the one Redis: PUB/SUB between nodes, history and stream positions in Redis
    engine: { type: "redis", redis },
    client: {
      // connection JWTs (HS256) carry the user (`sub`) and the channels subscribed server-side
      token: { hmac_secret_key: o.hmacSecret },
      // the per-connection outgoing queue (default 1 MiB) over which a lagging connection is
      // closed as a slow consumer: raised so that the bench's own device generator, briefly behind
      // at the max rate of `hot` (50 devices a user), is not cut off mid-run
      queue_max_size: 16 * 1024 * 1024,
      // connections per user and per node are unlimited by default (`hot`: 50 devices a user):
      // set explicitly so that the setup says so
      user_connection_limit: 0,
      connection_limit: 0,
    },
    channel: {
      namespaces: [{
        name: CENTRIFUGO_NAMESPACE,
        // each channel keeps its last 100 publications for 5 minutes: what a device that was
        // offline gets back on reconnect (the storm scenario misses 10 each)
        history_size: 100,
        history_ttl: "300s",
        // recovery on for every subscriber: a reconnecting device names its last offset and epoch
        // and gets what it missed, from history, before the live stream
        force_recovery: true,
        // positioning on: a gap in the offsets of the live stream (a PUB/SUB message lost between
        // Redis and the node) or a stream position that moved on closes the connection as
        // "insufficient state", and the SDK reconnects and recovers: no entry silently lost
        force_positioning: true,
      }],
    },
    // the server API the producers publish through (`POST /api/batch`, `X-API-Key`)
    http_api: { key: o.apiKey },
    health: { enabled: true },
    usage_stats: { disabled: true },
    node: { name: o.name },
  };
}

/** `centrifugo version`'s line, e.g. "Centrifugo v6.9.1 (Go version: go1.26.8)". */
export function centrifugoVersion(bin: string): string {
  return execFileSync(bin, ["version"], { encoding: "utf8" }).trim();
}

export async function startCentrifugo({ nodes, topology }: SystemOptions): Promise<System> {
  const bin = await ensurePinned("centrifugo", (m) => console.error(m));
  const version = centrifugoVersion(bin);
  const top = await startTopology(topology, { nats: false, redis: true });
  const dir = mkdtempSync(join(tmpdir(), "bench-centrifugo-"));
  const apiKey = randomBytes(16).toString("hex");
  // the device generators sign with the bench's JWT secret (bench/compare/devices.ts)
  const hmacSecret = process.env.JETGATE_JWT_SECRET ?? DEV_JWT_SECRET;
  const ports = await Promise.all(times(nodes, () => freePort()));
  const output: string[] = [];
  const keep = (k: number) => (d: Buffer) => {
    for (const l of d.toString().split("\n")) if (l.trim() !== "") output.push(`centrifugo#${k + 1}: ${l}`);
    if (output.length > 200) output.splice(0, output.length - 200);
  };
  const servers: ChildProcess[] = ports.map((port, k) => {
    const file = join(dir, `node${k + 1}.json`);
    writeFileSync(file, JSON.stringify(centrifugoConfig({ port, redisUrls: top.redisUrls, redisCluster: top.redisCluster, apiKey, hmacSecret, name: `bench-${k + 1}` }), null, 2));
    // its open-file limit raised to the hard limit first, as every process of the bench
    const p = spawn("sh", ["-c", `ulimit -n "$(ulimit -Hn)"; exec "${bin}" --config "${file}"`], { stdio: ["ignore", "pipe", "pipe"] });
    p.stdout!.on("data", keep(k));
    p.stderr!.on("data", keep(k));
    return p;
  });
  const stopServers = async () => {
    for (const s of servers) {
      if (s.exitCode !== null || s.signalCode !== null) continue;
      const exited = new Promise((r) => s.once("exit", r));
      s.kill("SIGKILL");
      await exited;
    }
  };
  try {
    await Promise.all(ports.map((port, k) => waitFor(`centrifugo#${k + 1} answers on :${port}`, async () => {
      if (servers[k]!.exitCode !== null) throw new WaitAbort(`centrifugo#${k + 1} exited (${servers[k]!.exitCode}):\n${output.join("\n")}`);
      return (await fetch(`http://127.0.0.1:${port}/health`)).ok;
    }, { timeoutMs: 30_000, intervalMs: 100 })));
  } catch (err) {
    await stopServers();
    await top.dispose();
    rmSync(dir, { recursive: true, force: true });
    throw err;
  }
  // producer k publishes through node k's API
  const producers = times(nodes, (k) => LineProcess.node("bench/compare/centrifugo-producer.ts", [`http://127.0.0.1:${ports[k]}/api`, apiKey, String(k)]));
  return {
    name: "centrifugo",
    version,
    deviceUrl: (i) => `ws://127.0.0.1:${ports[i % nodes]}/connection/websocket`,
    serverPids: servers.map((s) => s.pid!),
    pids: { server: servers.map((s) => s.pid!), producer: producers.map((p) => p.proc.pid!), redis: top.redisPids },
    topology: top.label,
    redisUrls: top.redisUrls,
    logs: () => output.slice(-20),
    sendFor: (seconds, users, rate) => sendSplit(producers, { cmd: "send", seconds, users }, rate),
    async sendEach(users, perUser) {
      // answered once every publication is in its channel's history
      await Promise.all(slices(users, nodes).map((sl, k) => producers[k]!.ask({ cmd: "each", ...sl, perUser })));
    },
    async stop() {
      for (const p of producers) await p.stop();
      await stopServers();
      await top.dispose();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
