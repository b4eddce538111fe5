/**
 * `npm start`: the whole stack on one machine, for trying jetgate out.
 *
 * 1. NATS and Redis: its own (scripts/start-servers.ts), their data in the stack dir (`.jetgate/` in
 *    the checkout, or $JETGATE_STACK_DIR), so a second `npm start` resumes the same mailboxes;
 *    `--fresh` starts clean. Servers named in JETGATE_NATS_URL / JETGATE_REDIS_URL are used instead.
 * 2. `registry init`, one worker, one gateway (child processes), with a service token and a console
 *    token of the stack's own (kept across restarts).
 * 3. `<stack dir>/stack.json`: where everything is, for `npm run dispatch`, the `jetgate` CLI and the
 *    benchmark's local mode (protocol/io/local-stack.ts); then the greeting.
 * 4. A demo device (the SDK, in this process) for user `demo`, printing every entry it receives;
 *    its cursor is kept in the stack dir beside the mailboxes it points into.
 * Ctrl-C stops the device, the gateway and the worker, then NATS and Redis, a line each.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import WebSocket from "ws";
import { SignJWT } from "jose";
import { seqLabel, ConfigError, type Config } from "../protocol/index.js";
import { loadConfig, parseFlags, Dispatcher, RegistryClient, connectNats, processAlive, readLocalStack, runningStack, stackDir, writeLocalStack, type LocalStack } from "../protocol/io/index.js";
import { initRegistry } from "../worker/registry-init.js";
import { GATEWAY_NODE_FLAGS } from "../gateway/node-flags.js";
import { JetgateClient, type WebSocketFactory } from "../client/index.js";
import { FileCursorStore } from "../client/node.js";
import { buildSdk } from "./build-sdk.js";
import { ChildOutput, greeting, say } from "./start-output.js";
import { checkExternalNats, checkExternalRedis, natsSpec, portFor, reachable, redisSpec, storeId, waitUntil, type ServerSpec } from "./start-servers.js";

const ROOT = fileURLToPath(new URL("../", import.meta.url));
const DEMO_USER = "demo";

const USAGE = `usage: npm start [-- --fresh]
  the whole stack on this machine: nats-server and redis-server (its own, their data in .jetgate/
  or $JETGATE_STACK_DIR; or the ones JETGATE_NATS_URL / JETGATE_REDIS_URL name), one worker, one
  gateway and a demo device for user demo. A second npm start resumes the same mailboxes.
  Send entries with: npm run dispatch -- --to demo --text hello. Settings: docs/config.md
  --fresh   remove the stack's data first (mailboxes, caches, the demo device's cursor) and start clean`;

interface Child {
  name: string;
  proc: ChildProcess;
  out: ChildOutput;
  exited: Promise<void>;
}

const children: Child[] = [];
let stopping = false;
let pidFile: string | undefined;

function recordPids(): void {
  if (pidFile === undefined) return;
  writeFileSync(pidFile, JSON.stringify(children.flatMap((c) => (c.proc.pid === undefined ? [] : [c.proc.pid]))));
}

/** Ends what a run killed outright (SIGKILL, a crash) left running, from its pid file. */
function endLeftovers(file: string): void {
  let pids: unknown;
  try {
    pids = JSON.parse(readFileSync(file, "utf8"));
  } catch {
    return;
  }
  const alive = (Array.isArray(pids) ? pids : []).filter((p): p is number => Number.isInteger(p) && processAlive(p as number));
  if (alive.length === 0) return;
  say(`ending ${alive.length} process(es) the last npm start left running (pids ${alive.join(", ")})`);
  for (const p of alive) process.kill(p, "SIGKILL");
}

/**
 * A child in a process group of its own: Ctrl-C reaches this process alone, which stops the
 * children in order (NATS last, so the worker can still give its shards back). Their pids are
 * kept in the stack dir, so a run killed outright leaves nothing the next one does not end.
 */
function child(name: string, cmd: string, args: string[], env: NodeJS.ProcessEnv, logDir: string): Child {
  const proc = spawn(cmd, args, { cwd: ROOT, env, stdio: ["ignore", "pipe", "pipe"], detached: true });
  const out = new ChildOutput(name, logDir, () => stopping);
  proc.stdout?.on("data", (d: Buffer) => out.write(d));
  proc.stderr?.on("data", (d: Buffer) => out.write(d));
  const exited = new Promise<void>((resolve) => {
    proc.once("exit", (code, signal) => {
      if (!stopping) say(`${name} exited (${signal ?? code}); its log: ${join(logDir, `${name}.log`)}`);
      out.close();
      resolve();
    });
    proc.once("error", (err) => {
      say(`${name} could not run: ${err.message}`);
      resolve();
    });
  });
  const c = { name, proc, out, exited };
  children.push(c);
  recordPids();
  return c;
}

/** Stops the children in order (devices' gateway and the worker first, then NATS and Redis), a line each. */
async function stopAll(): Promise<void> {
  const stopOne = async (c: Child) => {
    const t0 = Date.now();
    if (c.proc.exitCode === null && c.proc.signalCode === null) {
      c.proc.kill("SIGTERM");
      const killer = setTimeout(() => c.proc.kill("SIGKILL"), 3000);
      await c.exited;
      clearTimeout(killer);
    }
    say(`stopped ${c.name} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
  };
  const infra = new Set(["nats", "redis"]);
  await Promise.all(children.filter((c) => !infra.has(c.name)).map(stopOne));
  await Promise.all(children.filter((c) => infra.has(c.name)).map(stopOne));
}

async function startServer(spec: ServerSpec, logDir: string): Promise<void> {
  child(spec.name, spec.bin, spec.args, process.env, logDir);
  await waitUntil(spec.name === "nats" ? "nats-server" : "redis-server", () => reachable("127.0.0.1", spec.port));
}

/** Removes what a stack dir holds of the last run (the logs stay). */
function fresh(dir: string): void {
  const gone = ["nats", "redis", "demo-cursor.json", "stack.json"].filter((f) => existsSync(join(dir, f)));
  for (const f of gone) rmSync(join(dir, f), { recursive: true, force: true });
  say(gone.length > 0 ? `--fresh: removed the last run's ${gone.join(", ")} from ${dir}; starting clean` : `--fresh: nothing to remove in ${dir}; starting clean`);
}

/**
 * NATS and Redis (its own, or the environment's), and the settings every process of the stack gets.
 * Ports, tokens and the Redis prefix are the last run's where it left them.
 */
async function infrastructure(dir: string, last: LocalStack | undefined, mayInstall: boolean, logDir: string): Promise<Record<string, string>> {
  const lastPort = (url: string | undefined) => (url === undefined ? undefined : Number(new URL(url).port) || undefined);
  const out: Record<string, string> = {};
  const externalNats = process.env.JETGATE_NATS_URL;
  if (externalNats !== undefined) {
    await checkExternalNats(externalNats.split(",")[0]!);
  } else {
    const spec = await natsSpec(dir, await portFor(lastPort(last?.env.JETGATE_NATS_URL)));
    say(`starting nats-server (JetStream) on 127.0.0.1:${spec.port}, its store in ${join(dir, "nats")}`);
    await startServer(spec, logDir);
    out.JETGATE_NATS_URL = `nats://127.0.0.1:${spec.port}`;
  }
  const externalRedis = process.env.JETGATE_REDIS_URL;
  if (externalRedis !== undefined) {
    await checkExternalRedis(externalRedis.split(",")[0]!);
    // someone else's Redis beside our own store: keys of this store only (a --fresh store never reads the last one's)
    if (externalNats === undefined && process.env.JETGATE_REDIS_PREFIX === undefined) out.JETGATE_REDIS_PREFIX = `jg-${storeId(dir)}`;
  } else {
    const spec = redisSpec(dir, await portFor(lastPort(last?.env.JETGATE_REDIS_URL)), mayInstall);
    say(`starting redis-server on 127.0.0.1:${spec.port}, its data in ${join(dir, "redis")}`);
    await startServer(spec, logDir);
    out.JETGATE_REDIS_URL = `redis://127.0.0.1:${spec.port}`;
  }
  return out;
}

async function main(): Promise<void> {
  const { values } = parseFlags({ options: { fresh: { type: "boolean", default: false } }, strict: true }, USAGE);
  const dir = stackDir(process.env);
  const shown = relative(process.cwd(), dir) || ".";
  const running = runningStack(dir);
  if (running !== undefined) {
    throw new Error(`a jetgate stack already runs from ${shown} (npm start pid ${running.pid}, since ${running.startedAt}): use it (its URLs are in ${join(shown, "stack.json")}), stop it with Ctrl-C in its terminal, or give this one another JETGATE_STACK_DIR`);
  }
  mkdirSync(dir, { recursive: true });
  pidFile = join(dir, "pids.json");
  endLeftovers(pidFile);
  process.on("exit", () => {
    for (const c of children) if (c.proc.exitCode === null && c.proc.signalCode === null) c.proc.kill("SIGKILL");
  });
  if (values.fresh) fresh(dir);
  const logDir = join(dir, "logs");
  const last = readLocalStack(dir);
  const resumed = existsSync(join(dir, "nats"));
  const startConfig = loadConfig({ ...process.env }, "tool");

  process.on("SIGINT", () => void stop(0));
  process.on("SIGTERM", () => void stop(0));
  const infra = await infrastructure(dir, last, startConfig.JETGATE_START_INSTALL, logDir);
  // the stack's own tokens, kept across restarts (a bookmarked console keeps working)
  const stackEnv: Record<string, string> = {
    JETGATE_SERVICE_TOKEN: last?.env.JETGATE_SERVICE_TOKEN ?? randomBytes(18).toString("base64url"),
    JETGATE_ADMIN_TOKEN: last?.env.JETGATE_ADMIN_TOKEN ?? randomBytes(18).toString("base64url"),
    ...infra,
  };
  const env: NodeJS.ProcessEnv = {
    JETGATE_LOG_LEVEL: "warn",
    JETGATE_DEMO_DIR: join(ROOT, "client", "demo"),
    // a local stack has nobody to drain for: Ctrl-C ends it at once
    JETGATE_DRAIN_MS: "0",
    ...stackEnv,
    ...process.env,
  };
  const config = loadConfig(env);
  await buildSdk();
  const nc = await connectNats(config, "jetgate-start");
  try {
    const report = await initRegistry(nc, { ...config, shards: config.JETGATE_SHARDS, by: "npm-start" });
    say(report.layoutWritten ? `registry initialised with ${report.shards} shards` : `registry of ${report.shards} shards found: resuming`);
    const node = [process.execPath, "--import", "tsx"];
    child("worker", node[0]!, [...node.slice(1), "worker/main.ts"], env, logDir);
    child("gateway", node[0]!, [...GATEWAY_NODE_FLAGS, ...node.slice(1), "gateway/main.ts"], env, logDir);
    const stack = stackRecord(config, env);
    await waitUntil("the gateway", async () => (await fetch(`http://127.0.0.1:${config.JETGATE_GATEWAY_METRICS_PORT}/readyz`).catch(() => undefined))?.ok === true);
    writeLocalStack(dir, stack);
    console.log(greeting({ dir: shown, devices: stack.devices, demo: stack.demo, console: stack.console, adminToken: config.JETGATE_ADMIN_TOKEN!, metrics: stack.metrics, http: stack.http, serviceToken: config.JETGATE_SERVICE_TOKEN!, user: DEMO_USER, resumed }));
    await startDemo(config, dir);
    if (report.layoutWritten) await welcome(nc, config);
  } finally {
    await nc.close();
  }
}

function stackRecord(config: Config, env: NodeJS.ProcessEnv): LocalStack {
  const http = `http://127.0.0.1:${config.JETGATE_GATEWAY_PORT}`;
  const keep = ["JETGATE_NATS_URL", "JETGATE_REDIS_URL", "JETGATE_REDIS_PREFIX", "JETGATE_LANES", "JETGATE_SERVICE_TOKEN", "JETGATE_ADMIN_TOKEN", "JETGATE_JWT_SECRET", "JETGATE_CURSOR_KEYS"];
  return {
    v: 1,
    pid: process.pid,
    startedAt: new Date().toISOString(),
    nats: config.JETGATE_NATS_URL.join(","),
    redis: config.JETGATE_REDIS_URL.join(","),
    devices: `ws://127.0.0.1:${config.JETGATE_GATEWAY_PORT}/v1/ws`,
    http,
    demo: `${http}/demo/?user=${DEMO_USER}`,
    console: `${http}/admin/`,
    metrics: `http://127.0.0.1:${config.JETGATE_GATEWAY_METRICS_PORT}/metrics`,
    env: Object.fromEntries(keep.flatMap((k) => (env[k] !== undefined ? [[k, env[k]]] : []))),
  };
}

let demo: JetgateClient | undefined;

async function startDemo(config: Config, dir: string): Promise<void> {
  const secret = new TextEncoder().encode(config.JETGATE_JWT_SECRET!);
  const client = new JetgateClient({
    url: `ws://127.0.0.1:${config.JETGATE_GATEWAY_PORT}/v1/ws`,
    device: "demo-device",
    token: () => new SignJWT({}).setProtectedHeader({ alg: "HS256" }).setSubject(DEMO_USER).setIssuedAt().setExpirationTime("1h").sign(secret),
    store: new FileCursorStore(join(dir, "demo-cursor.json")),
    WebSocket: WebSocket as unknown as WebSocketFactory,
    onEntry: (e) => console.log(`[demo] seq ${seqLabel(e.seq)} lane=${e.lane} id=${e.id} body=${JSON.stringify(new TextDecoder().decode(e.b))}`),
    onRebuild: ({ trimWatermark }) => console.log(`[demo] cursor expired (entries up to ${seqLabel(trimWatermark)} were removed): rebuilding`),
  });
  client.on((e) => {
    if (e.type === "synced") console.log(`[demo] synced at seq ${seqLabel(e.seq)}; live`);
    if (e.type === "rebased") console.log(`[demo] cursor rebased: replay from ${seqLabel(e.replayFrom)}`);
    if (e.type === "cursor_invalid") console.log("[demo] its cursor is not one this stack gave out: starting over from the mailbox's start");
    if (e.type === "closed" && !stopping) console.log(`[demo] connection closed (${e.code}); reconnecting`);
  });
  demo = client;
  await client.start();
}

async function welcome(nc: Awaited<ReturnType<typeof connectNats>>, config: Config): Promise<void> {
  const registry = await RegistryClient.open(nc);
  const dispatcher = new Dispatcher(nc, () => registry.shards, { lanes: config.JETGATE_LANES });
  const id = `welcome-${Date.now()}`;
  await dispatcher.dispatch({ dispatch_id: id, message_id: id, lane: config.JETGATE_LANES[0]!, recipients: [DEMO_USER], body: new TextEncoder().encode("welcome to jetgate") });
  dispatcher.close();
  await registry.close();
}

async function stop(code: number): Promise<void> {
  if (stopping) return;
  stopping = true;
  say("stopping");
  await demo?.close();
  if (demo !== undefined) say("stopped the demo device");
  await stopAll();
  process.exit(code);
}

main().catch(async (err: unknown) => {
  console.error(err instanceof ConfigError ? err.message : `[start] ${err instanceof Error ? err.message : String(err)}`);
  stopping = true;
  await stopAll();
  process.exit(1);
});
