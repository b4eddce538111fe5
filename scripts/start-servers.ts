/**
 * NATS and Redis for `npm start`. By default its own: the pinned nats-server with its JetStream
 * store in `<stack dir>/nats` and a redis-server with its append-only file in `<stack dir>/redis`,
 * so the mailboxes and the caches that describe them persist together, and a second `npm start`
 * finds both as the first left them. A server named in the environment (JETGATE_NATS_URL,
 * JETGATE_REDIS_URL) is used instead, as it is; with our NATS beside someone else's Redis, the
 * stack's keys get a prefix of its own store, so no key outlives the log it describes.
 */
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { randomBytes } from "node:crypto";
import { createConnection, createServer } from "node:net";
import { join } from "node:path";
import { connect } from "@nats-io/transport-node";
import { natsVersionProblem } from "../protocol/index.js";
import { NATS_SERVER_VERSION, ensurePinnedNatsServer } from "./pinned.js";
import { say } from "./start-output.js";

export function reachable(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = createConnection({ host, port });
    s.setTimeout(1000);
    s.once("connect", () => (s.destroy(), resolve(true)));
    s.once("timeout", () => (s.destroy(), resolve(false)));
    s.once("error", () => resolve(false));
  });
}

export async function waitUntil(what: string, check: () => Promise<boolean>, ms = 30_000): Promise<void> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${what} did not come up within ${ms / 1000} s`);
}

/** The port `wanted` when it is free on 127.0.0.1 (the same as last run), else any free one. */
export function portFor(wanted: number | undefined): Promise<number> {
  const tryPort = (port: number) =>
    new Promise<number | undefined>((resolve) => {
      const srv = createServer();
      srv.once("error", () => resolve(undefined));
      srv.listen(port, "127.0.0.1", () => {
        const got = (srv.address() as { port: number }).port;
        srv.close(() => resolve(got));
      });
    });
  return (async () => (wanted !== undefined ? await tryPort(wanted) : undefined) ?? (await tryPort(0))!)();
}

function which(bin: string): string | undefined {
  for (const d of ["/usr/sbin", "/usr/bin", "/usr/local/bin", ...(process.env.PATH ?? "").split(":")]) if (existsSync(join(d, bin))) return join(d, bin);
  return undefined;
}

/** redis-server, installed with apt-get when it is missing and we may (root, apt-get, JETGATE_START_INSTALL). */
export function redisServerBin(mayInstall: boolean): string {
  const found = which("redis-server");
  if (found) return found;
  if (!mayInstall || process.getuid?.() !== 0 || which("apt-get") === undefined) {
    throw new Error("redis-server is not installed: install it (Debian/Ubuntu: sudo apt-get install -y redis-server), or set JETGATE_REDIS_URL to a running Redis 7");
  }
  say("installing Debian's redis-server (npm start runs its own Redis for the stack's caches) with apt-get");
  spawnSync("apt-get", ["update", "-qq"], { stdio: "inherit" });
  const r = spawnSync("apt-get", ["install", "-y", "-qq", "redis-server"], { stdio: "inherit", env: { ...process.env, DEBIAN_FRONTEND: "noninteractive" } });
  const after = which("redis-server");
  if (r.status !== 0 || !after) throw new Error(`could not install redis-server (apt-get exit ${r.status})`);
  return after;
}

/** The version of the nats-server answering at `url`; undefined when it does not answer as one. */
async function natsVersionAt(url: string): Promise<string | undefined> {
  const nc = await connect({ servers: url, reconnect: false, timeout: 2000 }).catch(() => undefined);
  if (nc === undefined) return undefined;
  const v = nc.info?.version;
  await nc.close().catch(() => undefined);
  return v;
}

/** NATS named in the environment: it must answer, and be new enough; else one line saying so and what to do. */
export async function checkExternalNats(url: string): Promise<void> {
  const version = await natsVersionAt(url);
  if (version === undefined) throw new Error(`no NATS answers at ${url} (JETGATE_NATS_URL): start it, or unset JETGATE_NATS_URL and npm start runs its own`);
  const problem = natsVersionProblem(version);
  if (problem !== undefined) throw new Error(`not using NATS at ${url} (JETGATE_NATS_URL): ${problem}; unset JETGATE_NATS_URL and npm start runs its own (the pinned nats-server ${NATS_SERVER_VERSION})`);
  say(`using NATS at ${url} (nats-server ${version}, from JETGATE_NATS_URL)`);
}

export async function checkExternalRedis(url: string): Promise<void> {
  const u = new URL(url);
  if (!(await reachable(u.hostname, Number(u.port || 6379)))) throw new Error(`no Redis answers at ${url} (JETGATE_REDIS_URL): start it, or unset JETGATE_REDIS_URL and npm start runs its own`);
  say(`using Redis at ${url} (from JETGATE_REDIS_URL)`);
}

export interface ServerSpec {
  name: "nats" | "redis";
  bin: string;
  args: string[];
  port: number;
}

export async function natsSpec(dir: string, port: number): Promise<ServerSpec> {
  const bin = await ensurePinnedNatsServer(say);
  const store = join(dir, "nats");
  mkdirSync(store, { recursive: true });
  return { name: "nats", bin, port, args: ["-a", "127.0.0.1", "-p", String(port), "-js", "-sd", store] };
}

export function redisSpec(dir: string, port: number, mayInstall: boolean): ServerSpec {
  const data = join(dir, "redis");
  mkdirSync(data, { recursive: true });
  // the append-only file, synced every second: the caches survive a restart with the mailboxes
  return { name: "redis", bin: redisServerBin(mayInstall), port, args: ["--port", String(port), "--bind", "127.0.0.1", "--dir", data, "--appendonly", "yes", "--appendfsync", "everysec", "--save", ""] };
}

/**
 * The id of this stack's JetStream store, made with it: the prefix of its keys in a Redis that is
 * not the stack's own, so that a new store (`--fresh`) never reads the caches of an old one.
 */
export function storeId(dir: string): string {
  const file = join(dir, "nats", "jetgate-store-id");
  if (!existsSync(file)) {
    mkdirSync(join(dir, "nats"), { recursive: true });
    writeFileSync(file, `${randomBytes(4).toString("hex")}\n`);
  }
  return readFileSync(file, "utf8").trim();
}
