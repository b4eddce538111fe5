/** NATS and Redis connections built from the config, the same way in every tier. */
import { readFileSync } from "node:fs";
import { connect, credsAuthenticator, nkeyAuthenticator, type NatsConnection, type NodeConnectionOptions } from "@nats-io/transport-node";
import { Cluster, Redis, type RedisOptions } from "ioredis";
import type { Config } from "../config.js";
import { JetgateError } from "../errors.js";
import { natsVersionProblem } from "../nats-version.js";
import { REDIS_SCRIPTS, type RedisScriptCommands } from "../layout.js";

export type NatsSettings = Pick<
  Config,
  | "JETGATE_NATS_URL"
  | "JETGATE_NATS_USER"
  | "JETGATE_NATS_PASS"
  | "JETGATE_NATS_TOKEN"
  | "JETGATE_NATS_CREDS_FILE"
  | "JETGATE_NATS_NKEY_SEED_FILE"
  | "JETGATE_NATS_CA_FILE"
>;

export function natsOptions(c: NatsSettings, name: string): NodeConnectionOptions {
  const opts: NodeConnectionOptions = {
    servers: c.JETGATE_NATS_URL,
    name,
    // Keep reconnecting forever: a gateway or worker without NATS is not ready, but must come back.
    maxReconnectAttempts: -1,
    reconnectTimeWait: 250,
    pingInterval: 10_000,
    // nats.js otherwise builds two Error objects (with stack traces) for every request, in case it
    // fails: 4.5% of a gateway's CPU in the storm benchmark's profile, and every JetStream publish
    // and API call is a request
    noAsyncTraces: true,
  };
  if (c.JETGATE_NATS_USER !== undefined) {
    opts.user = c.JETGATE_NATS_USER;
    if (c.JETGATE_NATS_PASS !== undefined) opts.pass = c.JETGATE_NATS_PASS;
  }
  if (c.JETGATE_NATS_TOKEN !== undefined) opts.token = c.JETGATE_NATS_TOKEN;
  if (c.JETGATE_NATS_CREDS_FILE !== undefined) {
    opts.authenticator = credsAuthenticator(readFileSync(c.JETGATE_NATS_CREDS_FILE));
  }
  if (c.JETGATE_NATS_NKEY_SEED_FILE !== undefined) {
    opts.authenticator = nkeyAuthenticator(new TextEncoder().encode(readFileSync(c.JETGATE_NATS_NKEY_SEED_FILE, "utf8").trim()));
  }
  if (c.JETGATE_NATS_CA_FILE !== undefined) opts.tls = { caFile: c.JETGATE_NATS_CA_FILE };
  return opts;
}

/** The server a process connected to is older than MIN_NATS_SERVER. */
export class NatsServerTooOldError extends JetgateError {
  constructor(message: string) {
    super("NATS_SERVER_TOO_OLD", message);
  }
}

/** Connects, then refuses (closing the connection) a server older than MIN_NATS_SERVER, naming the version found. */
export async function connectNats(c: NatsSettings, name: string): Promise<NatsConnection> {
  const nc = await connect(natsOptions(c, name));
  const problem = natsVersionProblem(nc.info?.version);
  if (problem !== undefined) {
    await nc.close().catch(() => undefined);
    throw new NatsServerTooOldError(`${problem}; connected to ${nc.getServer()}`);
  }
  return nc;
}

export type RedisClient = Redis | Cluster;
/** A client with jetgate's scripts defined as commands (every client `connectRedis` makes). */
export type ScriptedRedis = RedisClient & RedisScriptCommands;

/**
 * The client with its scripts' typed calls. ioredis defines them at run time from `scripts`, so
 * this is the one place that asserts their types; a client made without them is refused here
 * rather than failing at its first call.
 */
export function scripted<R extends RedisClient>(redis: R): R & RedisScriptCommands {
  for (const name of Object.keys(REDIS_SCRIPTS)) {
    if (typeof (redis as unknown as Record<string, unknown>)[name] !== "function") {
      throw new TypeError(`Redis client lacks the ${name} script: make it with connectRedis (it defines REDIS_SCRIPTS)`);
    }
  }
  return redis as R & RedisScriptCommands;
}
export type RedisSettings = Pick<Config, "JETGATE_REDIS_URL" | "JETGATE_REDIS_CLUSTER" | "JETGATE_REDIS_CA_FILE" | "JETGATE_DEPENDENCY_TIMEOUT_MS">;

/**
 * A Redis (or Redis Cluster) client with auto-pipelining: commands issued in the same tick go out
 * in one round trip per node. That is how batches are sent, because an explicit pipeline cannot
 * span cluster slots.
 */
/**
 * Sent on their own: the worker's batch script spans many slots of one node, which an ioredis
 * Cluster pipeline refuses ("All the keys in a pipeline command should belong to the same slot");
 * it is one call per node and batch anyway.
 */
const UNPIPELINED = ["jgApplyBatch"] as const;

export function connectRedis(c: RedisSettings, name: string): ScriptedRedis {
  const tls = c.JETGATE_REDIS_CA_FILE !== undefined ? { ca: readFileSync(c.JETGATE_REDIS_CA_FILE) } : undefined;
  const base: RedisOptions = {
    connectionName: name,
    enableAutoPipelining: true,
    autoPipeliningIgnoredCommands: [...UNPIPELINED],
    scripts: { ...REDIS_SCRIPTS },
    maxRetriesPerRequest: 2,
    // A Redis that keeps its connection and answers nothing (a partition, SIGSTOP, a long script)
    // fails each command after this long, so every caller answers (a 503, a retry) instead of
    // waiting for the kernel to give the connection up, about 15 minutes later.
    commandTimeout: c.JETGATE_DEPENDENCY_TIMEOUT_MS,
    // Reconnect forever with a capped backoff; callers see errors while it is down and retry.
    retryStrategy: (times) => Math.min(50 * times, 1000),
    ...(tls ? { tls } : {}),
  };
  if (c.JETGATE_REDIS_CLUSTER) {
    const nodes = c.JETGATE_REDIS_URL.map((u) => {
      const url = new URL(u);
      return { host: url.hostname, port: Number(url.port || 6379) };
    });
    const first = new URL(c.JETGATE_REDIS_URL[0]!);
    return scripted(new Cluster(nodes, {
      enableAutoPipelining: true,
      autoPipeliningIgnoredCommands: [...UNPIPELINED],
      scripts: { ...REDIS_SCRIPTS },
      clusterRetryStrategy: (times) => Math.min(100 * times, 2000),
      redisOptions: {
        ...base,
        ...(first.username ? { username: decodeURIComponent(first.username) } : {}),
        ...(first.password ? { password: decodeURIComponent(first.password) } : {}),
      },
    }));
  }
  return scripted(new Redis(c.JETGATE_REDIS_URL[0]!, base));
}
