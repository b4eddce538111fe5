/**
 * `npm start`: the whole stack on one machine, for trying jetgate out.
 *
 * 1. nats-server (JetStream) and redis-server: used when reachable at JETGATE_NATS_URL /
 *    JETGATE_REDIS_URL (NATS only when it is 2.12.1 or later), else started as child processes with
 *    their data in a temp dir: the pinned nats-server (scripts/pinned.ts, built with go install once
 *    per machine), Debian's redis-server (installed with apt-get when missing and we may: root,
 *    apt-get present, JETGATE_START_INSTALL not false).
 * 2. `registry init`, one worker, one gateway (child processes).
 * 3. A demo device (the SDK, in this process) for user `demo`, printing every entry it receives.
 * Ctrl-C stops everything. Send it entries with `npm run dispatch -- --to demo --text hello`.
 * `--state-dir <dir>` keeps the demo device's cursor there (default .jetgate/ in the checkout).
 */
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { createConnection, createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import WebSocket from "ws";
import { SignJWT } from "jose";
import { connect } from "@nats-io/transport-node";
import { loadConfig, natsVersionProblem, parseFlags, seqLabel, ConfigError, type Config } from "../protocol/index.js";
import { Dispatcher, RegistryClient, connectNats } from "../protocol/io/index.js";
import { initRegistry } from "../worker/registry-init.js";
import { JetgateClient, type WebSocketFactory } from "../client/index.js";
import { FileCursorStore } from "../client/node.js";
import { buildSdk } from "./build-sdk.js";
import { NATS_SERVER_VERSION, ensurePinnedNatsServer } from "./pinned.js";

const ROOT = fileURLToPath(new URL("../", import.meta.url));
const children: ChildProcess[] = [];
const say = (msg: string) => console.log(`[start] ${msg}`);

function reachable(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = createConnection({ host, port });
    s.setTimeout(1000);
    s.once("connect", () => (s.destroy(), resolve(true)));
    s.once("timeout", () => (s.destroy(), resolve(false)));
    s.once("error", () => resolve(false));
  });
}

function which(bin: string, extra: string[] = []): string | undefined {
  for (const p of [...extra, ...(process.env.PATH ?? "").split(":").map((d) => join(d, bin))]) if (existsSync(p)) return p;
  return undefined;
}

function ensureInstalled(bin: string, pkg: string, allowed: boolean, extra: string[] = []): string {
  const found = which(bin, extra);
  if (found) return found;
  const mayInstall = allowed && process.getuid?.() === 0 && which("apt-get") !== undefined;
  if (!mayInstall) {
    throw new Error(`${bin} is not installed and not reachable. Install it (Debian/Ubuntu: sudo apt-get install -y ${pkg}) or point JETGATE_REDIS_URL at a running one.`);
  }
  say(`installing ${pkg} with apt-get`);
  spawnSync("apt-get", ["update", "-qq"], { stdio: "inherit" });
  const r = spawnSync("apt-get", ["install", "-y", "-qq", pkg], { stdio: "inherit", env: { ...process.env, DEBIAN_FRONTEND: "noninteractive" } });
  const after = which(bin, extra);
  if (r.status !== 0 || !after) throw new Error(`could not install ${pkg} (apt-get exit ${r.status})`);
  return after;
}

function child(name: string, cmd: string, args: string[], env: NodeJS.ProcessEnv): ChildProcess {
  const p = spawn(cmd, args, { cwd: ROOT, env, stdio: ["ignore", "pipe", "pipe"] });
  const prefix = (d: Buffer) => {
    for (const line of d.toString().split("\n")) if (line.trim()) console.log(`[${name}] ${line}`);
  };
  p.stdout?.on("data", prefix);
  p.stderr?.on("data", prefix);
  p.on("exit", (code, signal) => {
    if (!stopping) say(`${name} exited (${signal ?? code})`);
  });
  children.push(p);
  return p;
}

async function waitUntil(what: string, check: () => Promise<boolean>, ms = 30_000): Promise<void> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`${what} did not come up within ${ms / 1000} s`);
}

/** The version of the nats-server answering at `url`; undefined when it does not answer as one. */
async function natsVersionAt(url: string): Promise<string | undefined> {
  const nc = await connect({ servers: url, reconnect: false, timeout: 2000 }).catch(() => undefined);
  if (nc === undefined) return undefined;
  const v = nc.info?.version;
  await nc.close().catch(() => undefined);
  return v;
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const port = (srv.address() as { port: number }).port;
      srv.close(() => resolve(port));
    });
  });
}

/**
 * NATS and Redis for the stack: a running one when it answers (NATS only when new enough), else
 * one started here. Returns the NATS URL to use, which differs from the configured one when a
 * server there was too old and the pinned one was started beside it.
 */
async function infrastructure(config: Config, dir: string): Promise<string> {
  const nats = new URL(config.JETGATE_NATS_URL[0]!);
  const redis = new URL(config.JETGATE_REDIS_URL[0]!);
  let natsPort = Number(nats.port || 4222);
  const redisPort = Number(redis.port || 6379);
  let natsUrl = config.JETGATE_NATS_URL[0]!;
  let start = true;
  if (await reachable(nats.hostname, natsPort)) {
    const version = await natsVersionAt(natsUrl);
    const problem = natsVersionProblem(version);
    if (problem === undefined) {
      say(`using NATS at ${nats.host} (nats-server ${version})`);
      start = false;
    } else {
      natsPort = await freePort();
      natsUrl = `nats://${nats.hostname}:${natsPort}`;
      say(`not using NATS at ${nats.host}: ${problem}; starting the pinned nats-server ${NATS_SERVER_VERSION} on ${natsPort} instead`);
    }
  }
  if (start) {
    const bin = ensurePinnedNatsServer(say);
    say(`starting nats-server ${NATS_SERVER_VERSION} (JetStream) on ${natsPort}, data in ${dir}`);
    child("nats", bin, ["-a", nats.hostname, "-p", String(natsPort), "-js", "-sd", join(dir, "nats")], process.env);
    await waitUntil("nats-server", () => reachable(nats.hostname, natsPort));
  }
  if (await reachable(redis.hostname, redisPort)) say(`using Redis at ${redis.host}`);
  else {
    const bin = ensureInstalled("redis-server", "redis-server", config.JETGATE_START_INSTALL);
    say(`starting redis-server on ${redisPort}`);
    child("redis", bin, ["--port", String(redisPort), "--bind", redis.hostname, "--dir", dir, "--save", "", "--appendonly", "no"], process.env);
    await waitUntil("redis-server", () => reachable(redis.hostname, redisPort));
  }
  return natsUrl;
}

const USAGE = `usage: npm start [-- --state-dir <dir>]
  the whole stack on this machine: nats-server and redis-server (started when not reachable at
  JETGATE_NATS_URL / JETGATE_REDIS_URL), one worker, one gateway and a demo device for user demo;
  send it entries with: npm run dispatch -- --to demo --text hello. Settings: docs/config.md
  --state-dir <dir>   where the demo device keeps its cursor (default .jetgate/ in the checkout)`;

let stopping = false;

async function main(): Promise<void> {
  const { values } = parseFlags({ options: { "state-dir": { type: "string", default: join(ROOT, ".jetgate") } }, strict: true }, USAGE);
  const env: NodeJS.ProcessEnv = { JETGATE_LOG_LEVEL: "warn", JETGATE_DEMO_DIR: join(ROOT, "client", "demo"), ...process.env };
  let config = loadConfig(env);
  const dir = mkdtempSync(join(tmpdir(), "jetgate-start-"));
  const demo: { client?: JetgateClient } = {};
  const stop = async (code: number) => {
    if (stopping) return;
    stopping = true;
    say("stopping");
    await demo.client?.close();
    for (const c of [...children].reverse()) c.kill("SIGTERM");
    await Promise.all(children.map((c) => new Promise((r) => (c.exitCode !== null || c.signalCode !== null ? r(null) : c.once("exit", r)))));
    rmSync(dir, { recursive: true, force: true });
    process.exit(code);
  };
  process.on("SIGINT", () => void stop(0));
  process.on("SIGTERM", () => void stop(0));

  await buildSdk();
  const natsUrl = await infrastructure(config, dir);
  if (natsUrl !== config.JETGATE_NATS_URL[0]) {
    env.JETGATE_NATS_URL = natsUrl;
    config = loadConfig(env);
  }
  const nc = await connectNats(config, "jetgate-start");
  const report = await initRegistry(nc, { ...config, shards: config.JETGATE_SHARDS, by: "npm-start" });
  say(report.layoutWritten ? `registry initialised with ${report.shards} shards` : `registry already has ${report.shards} shards`);
  const node = [process.execPath, "--import", "tsx"];
  child("worker", node[0]!, [...node.slice(1), "worker/main.ts"], env);
  child("gateway", node[0]!, [...node.slice(1), "gateway/main.ts"], env);
  const port = config.JETGATE_GATEWAY_PORT;
  const opsPort = config.JETGATE_GATEWAY_METRICS_PORT;
  await waitUntil("the gateway", async () => (await fetch(`http://127.0.0.1:${opsPort}/readyz`).catch(() => undefined))?.ok === true);
  say(`gateway ready: ws://127.0.0.1:${port}/v1/ws   demo page: http://127.0.0.1:${port}/demo/?user=demo   metrics: http://127.0.0.1:${opsPort}/metrics`);

  const secret = new TextEncoder().encode(config.JETGATE_JWT_SECRET!);
  const user = "demo";
  const client = new JetgateClient({
    url: `ws://127.0.0.1:${port}/v1/ws`,
    device: "demo-device",
    token: () => new SignJWT({}).setProtectedHeader({ alg: "HS256" }).setSubject(user).setExpirationTime("1h").sign(secret),
    store: new FileCursorStore(join(values["state-dir"], "demo-cursor.json")),
    WebSocket: WebSocket as unknown as WebSocketFactory,
    onEntry: (e) => console.log(`[demo] seq=${seqLabel(e.seq)} lane=${e.lane} id=${e.id} body=${JSON.stringify(new TextDecoder().decode(e.b))}`),
    onRebuild: ({ trimWatermark }) => console.log(`[demo] cursor expired (entries up to ${trimWatermark} were removed): rebuilding`),
  });
  client.on((e) => {
    if (e.type === "synced") console.log(`[demo] synced at seq ${seqLabel(e.seq)}; live`);
    if (e.type === "rebased") console.log(`[demo] cursor rebased: replay from ${e.replayFrom}`);
    if (e.type === "closed" && !stopping) console.log(`[demo] connection closed (${e.code}); reconnecting`);
  });
  demo.client = client;
  await client.start();

  const registry = await RegistryClient.open(nc);
  const dispatcher = new Dispatcher(nc, () => registry.shards, { lanes: config.JETGATE_LANES });
  const id = `welcome-${Date.now()}`;
  await dispatcher.dispatch({ dispatch_id: id, message_id: id, lane: config.JETGATE_LANES[0]!, recipients: [user], body: new TextEncoder().encode("welcome to jetgate") });
  dispatcher.close();
  await registry.close();
  say(`send more: npm run dispatch -- --to ${user} --text "hello"     (Ctrl-C stops everything)`);
}

main().catch((err: unknown) => {
  console.error(err instanceof ConfigError ? err.message : `[start] ${err instanceof Error ? err.message : String(err)}`);
  for (const c of children) c.kill("SIGTERM");
  process.exit(1);
});
