/**
 * Worker process: `node worker/main.ts` (or `jetgate worker`). Reads its settings from the
 * environment (docs/config.md). SIGTERM/SIGINT: finish the batch in hand, release every shard (its
 * epoch in the registry, then its lease: the next owner resumes the epoch), exit 0; a shutdown that
 * cannot finish (NATS gone) exits 1 after SHUTDOWN_LIMIT_MS, leaving its shards to be fenced.
 */
import { hostname } from "node:os";
import type { AddressInfo } from "node:net";
import { pino } from "pino";
import { RedisKeys, systemClock } from "../protocol/index.js";
import { loadConfig, DependencyHealth, answerStats, RegistryClient, connectNats, connectRedis, exitOnUnhandledRejection, onShutdownSignal, registryLogging, runAsMain, startOpsHttp } from "../protocol/io/index.js";
import { GatewayBeats } from "./gateway-beats.js";
import { WorkerMetrics } from "./metrics.js";
import { PushRouter } from "./push-router.js";
import { Worker } from "./worker.js";

/** The longest a SIGTERM takes: releases wait 5 s for the registry, and a drain for NATS. */
const SHUTDOWN_LIMIT_MS = 15_000;

export async function runWorker(env: Record<string, string | undefined> = process.env): Promise<void> {
  const config = loadConfig(env, "worker");
  const workerId = config.JETGATE_WORKER_ID ?? `${hostname()}-${process.pid}`;
  exitOnUnhandledRejection("worker");
  const log = pino({ level: config.JETGATE_LOG_LEVEL, base: { component: "worker", worker: workerId } });
  const nc = await connectNats(config, `jetgate-worker-${workerId}`);
  const redis = connectRedis(config, `jetgate-worker-${workerId}`);
  redis.on("error", (err: Error) => log.warn({ err: err.message }, "redis error"));
  const registry = await RegistryClient.open(nc, registryLogging(log));
  const metrics = new WorkerMetrics();
  metrics.registryRecord.set(registry.state.seq);
  registry.onChange((st) => metrics.registryRecord.set(st.seq));
  const health = new DependencyHealth(nc, redis, {
    timeoutMs: config.JETGATE_DEPENDENCY_TIMEOUT_MS, log, metrics: { registry: metrics.registry, prefix: "jetgate_worker_" },
    redisProbeKey: new RedisKeys(config.JETGATE_REDIS_PREFIX).healthProbe(`worker-${workerId}`),
  }).start();
  const keys = new RedisKeys(config.JETGATE_REDIS_PREFIX);
  const beats = new GatewayBeats(() => redis.jgGatewaysSeen(keys.gateways()), () => pushes.forgetDrops());
  const noted = { unrouted: metrics.unroutedPushes, broadcast: metrics.broadcastPushes, silent: metrics.silentRoutes };
  const pushes = new PushRouter(
    {
      publish: (subject, data) => {
        nc.publish(subject, data);
        metrics.pushMessages.inc();
      },
      // every registration of a silent gateway, whatever its generation
      dropRoutes: (user, gateways) => void redis.jgRouteDrop(keys.watermarks(user), Number.MAX_SAFE_INTEGER, ...gateways).catch(() => undefined),
      note: (what) => noted[what].inc(),
    },
    beats,
  );
  beats.start();
  const worker = new Worker(
    { nc, redis, keys, registry, metrics, log, workerId, config, pushes, clock: systemClock },
    { leaseMs: config.JETGATE_LEASE_MS, nats: { answering: () => health.answering("nats"), silentMs: () => health.silentMs("nats"), timeoutMs: config.JETGATE_DEPENDENCY_TIMEOUT_MS } },
  );
  const http = await startOpsHttp(config.JETGATE_WORKER_HTTP_PORT, config.JETGATE_METRICS_HOST, metrics.registry, {
    problems: () => {
      const p: string[] = [];
      p.push(...health.problems());
      if (registry.state.shards.size === 0) p.push("registry");
      if (worker.status.type !== "running") p.push(`worker ${worker.status.type}`);
      return p;
    },
    detail: () => health.detail(),
  });
  const stats = answerStats(nc, {
    kind: "worker", id: workerId, regressions: metrics.regressions, health,
    extra: () => ({ shards: worker.owned().map((s) => ({ shard: s.shard, offset: s.offset, ...(s.epoch !== undefined ? { epoch: s.epoch } : {}), ...(s.lag !== undefined ? { lag: s.lag } : {}) })) }),
  }, config.JETGATE_OPS_KEY);
  log.info({ port: (http.address() as AddressInfo).port }, "worker http listening");
  worker.start();

  const shutdown = (signal: string) => {
    log.info({ signal }, "stopping: finishing batches, releasing shards");
    // below the chart's 30 s grace period: a drain that waits on a NATS that is gone must not hang
    setTimeout(() => {
      log.warn({ ms: SHUTDOWN_LIMIT_MS }, "shutdown did not finish in time: exiting");
      process.exit(1);
    }, SHUTDOWN_LIMIT_MS).unref();
    void (async () => {
      await worker.stop();
      beats.stop();
      health.stop();
      stats.unsubscribe();
      await registry.close().catch(() => undefined);
      await nc.drain().catch(() => undefined);
      redis.disconnect();
      http.close();
      log.info("stopped");
      process.exit(0);
    })();
  };
  onShutdownSignal(shutdown);
}

runAsMain(import.meta.url, () => runWorker());
