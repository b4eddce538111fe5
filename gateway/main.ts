/**
 * Gateway process. Settings from the environment (docs/config.md).
 * SIGTERM/SIGINT: readiness goes false, GOAWAY to every device, connections closed (1001) in waves
 * over JETGATE_DRAIN_MS, then exit 0. SIGHUP: the service tokens are read again (as when
 * JETGATE_SERVICE_TOKENS_FILE changes); no connection is touched.
 */
import { randomBytes } from "node:crypto";
import type { AddressInfo } from "node:net";
import { basename } from "node:path";
import { pino } from "pino";
import { jetstream, jetstreamManager, type JetStreamManager } from "@nats-io/jetstream";
import { Disconnect, ingressMsgId, ingressSubject, RedisKeys, systemClock } from "../protocol/index.js";
import { loadConfig, DependencyHealth, Dispatcher, answerStats, RegistryClient, connectNats, connectRedis, exitOnUnhandledRejection, onShutdownSignal, registryLogging, runAsMain, startOpsHttp, cursorSigner } from "../protocol/io/index.js";
import { AckStore } from "./session/acks.js";
import { tokenVerifier } from "./jwt.js";
import { MailboxReader } from "./mailbox/reader.js";
import type { SessionPorts } from "./ports.js";
import { GatewayMetrics } from "./metrics.js";
import { Presence } from "./hub/presence.js";
import { ControlHandler } from "./http/control.js";
import { NatsRoster } from "./http/roster.js";
import { Revocations } from "./hub/revocations.js";
import { RevocationStore, RevocationSync } from "./hub/revocation-sync.js";
import { lookupUser, type UsersApiDeps } from "./http/users-api.js";
import { NatsPushSource } from "./hub/push-source.js";
import { RouteTable } from "./hub/routes.js";
import { startServer } from "./http/server.js";
import { ServiceAuth } from "./http/service-auth.js";
import { ServiceTokensSource } from "./http/service-tokens-source.js";
import { ConnectionCapacity } from "./connection-capacity.js";
import type { Session } from "./session/session.js";
import { SessionRegistry } from "./hub/sessions.js";
import { loadUws } from "./uws.js";

const DRAIN_WAVES = 10;

export async function runGateway(env: Record<string, string | undefined> = process.env): Promise<void> {
  const config = loadConfig(env);
  const gatewayId = config.JETGATE_GATEWAY_ID ?? `gw-${randomBytes(6).toString("hex")}`;
  exitOnUnhandledRejection("gateway");
  const log = pino({ level: config.JETGATE_LOG_LEVEL, base: { component: "gateway", gateway: gatewayId } });
  const { uws, binary } = loadUws();
  const metrics = new GatewayMetrics();
  // the audit trail (the users API's calls, the service tokens' reloads) is written whatever level
  // the other lines are kept to, unless logging is off
  const audit = log.child({ audit: true }, { level: config.JETGATE_LOG_LEVEL === "silent" ? "silent" : "info" });
  // a tokens file that cannot be used stops the gateway here, before it connects to anything
  const serviceTokens = new ServiceTokensSource(config.JETGATE_SERVICE_TOKENS_FILE, config.JETGATE_SERVICE_TOKEN, audit, {
    reloaded: (outcome) => metrics.serviceTokenReloads.inc({ outcome }),
    inForce: (table) => {
      metrics.serviceTokens.set(table.size);
      metrics.serviceTokenNotAfter.reset();
      for (const t of table.tokens) if (t.notAfter !== undefined) metrics.serviceTokenNotAfter.set({ token: t.name }, Math.floor(t.notAfter / 1000));
    },
  });
  serviceTokens.watch();
  process.on("SIGHUP", () => serviceTokens.reload("SIGHUP"));
  const serviceAuth = new ServiceAuth(() => serviceTokens.table, config.JETGATE_ENV === "production", (client) => log.warn({ client }, "too many wrong service tokens from this address: its wrong tokens are answered 429 for a while (right ones are still served)"));
  const nc = await connectNats(config, `jetgate-gateway-${gatewayId}`);
  const redis = connectRedis(config, `jetgate-gateway-${gatewayId}`);
  redis.on("error", (err: Error) => log.warn({ err: err.message }, "redis error"));
  const registry = await RegistryClient.open(nc, { ...registryLogging(log), lagMs: config.JETGATE_FAULT_REGISTRY_LAG_MS, loadTimeoutMs: 10_000 + config.JETGATE_FAULT_REGISTRY_LAG_MS });
  const keys = new RedisKeys(config.JETGATE_REDIS_PREFIX);
  metrics.uwsBinary.set({ binary: basename(binary) }, 1);
  const health = new DependencyHealth(nc, redis, {
    timeoutMs: config.JETGATE_DEPENDENCY_TIMEOUT_MS, log, metrics: { registry: metrics.registry, prefix: "jetgate_gateway_" },
    redisProbeKey: new RedisKeys(config.JETGATE_REDIS_PREFIX).healthProbe(`gateway-${gatewayId}`),
  }).start();
  metrics.registryRecord.set(registry.state.seq);
  registry.onChange((st) => metrics.registryRecord.set(st.seq));
  // a hash a route makes lives as long as one the worker makes (its watermark TTL)
  const routes = new RouteTable(redis, keys, gatewayId, Math.max(config.JETGATE_STREAM_MAX_AGE_S, config.JETGATE_HOT_CACHE_TTL_S), log);
  const pushSource = new NatsPushSource(nc, gatewayId, log, (n) => metrics.unreadablePushes.inc(n));
  const sessions = new SessionRegistry<Session>(pushSource, routes, registry, metrics, config.JETGATE_RATE_USER_FRAMES_PER_S, log, systemClock);
  routes.onRepaired = (user, head) => sessions.repair(user, head);
  routes.start();
  const presence = new Presence(redis, keys, nc, gatewayId, (k) => sessions.kick(k.user, k.device, k.session));
  presence.start();
  // revocations: loaded from Redis before the first AUTH is let through, then their changes every
  // JETGATE_REVOCATIONS_SYNC_MS; new ones arrive over NATS at once (gateway/http/control.ts)
  const revocations = new Revocations();
  const revocationStore = new RevocationStore(redis, keys);
  const revocationSync = new RevocationSync(revocationStore, revocations, {
    loaded: (why, n) => {
      metrics.revocationLoads.inc({ why });
      if (why !== "start") log.info({ why, revocations: n }, "token revocations read whole from Redis again");
    },
    changes: (n) => metrics.revocationChanges.inc(n),
    malformed: (n) => metrics.revocationsMalformed.inc(n),
    hashGone: () => log.warn("the token revocations are gone from Redis (a flush, an eviction): this gateway keeps refusing the ones it holds, a gateway started now knows none; revoke again what matters"),
  });
  metrics.revocationCount = () => revocations.size;
  await revocationSync.sync().catch((err: unknown) => log.warn({ err: (err as Error).message }, "cannot read token revocations from Redis: every AUTH is refused until they are"));
  revocationSync.start(config.JETGATE_REVOCATIONS_SYNC_MS, log);
  const control = new ControlHandler(nc, gatewayId, sessions, revocations, log);
  control.start();
  const roster = new NatsRoster(nc, gatewayId);
  roster.start();
  const js = jetstream(nc);
  const mailbox = new MailboxReader(nc, redis, keys, registry, config.JETGATE_LANES);
  sessions.startTailChecks(config.JETGATE_TAIL_CHECK_S, (users) => mailbox.cachedHeads(users));
  const ctx: SessionPorts = {
    config,
    log,
    metrics,
    revocations: { ready: () => revocations.loaded, revoked: (u, d, iat, now) => revocations.revoked(u, d, iat, now) },
    tokens: await tokenVerifier({ secret: config.JETGATE_JWT_SECRET, previousSecret: config.JETGATE_JWT_PREVIOUS_SECRET, publicKeysFile: config.JETGATE_JWT_PUBLIC_KEYS_FILE, maxLifetimeS: config.JETGATE_JWT_MAX_LIFETIME_S }),
    cursors: cursorSigner(config.JETGATE_CURSOR_KEYS),
    registry,
    mailbox,
    hub: sessions,
    routes,
    presence,
    acks: new AckStore(redis, keys, config.JETGATE_STREAM_MAX_AGE_S, config.JETGATE_MAX_DEVICES_PER_USER),
    ingress: {
      publish: async (user, device, cmid, body) => {
        const ack = await js.publish(ingressSubject(user, device), body, { msgID: ingressMsgId(user, device, cmid) });
        return { duplicate: ack.duplicate };
      },
    },
  };
  const dispatcher = new Dispatcher(nc, () => registry.shards, { lanes: config.JETGATE_LANES, maxBodyBytes: config.JETGATE_MAX_BODY_BYTES, maxQueuedBytes: config.JETGATE_DISPATCH_QUEUE_BYTES,
    timings: { queued: (s) => metrics.stages.observe("dispatch_queue", s), acked: (s) => metrics.stages.observe("dispatch_ack", s) },
  });
  metrics.dispatchStats = () => dispatcher.stats;
  let draining = false;
  let capacity: ConnectionCapacity | undefined = undefined;
  const ops = await startOpsHttp(config.JETGATE_GATEWAY_METRICS_PORT, config.JETGATE_METRICS_HOST, metrics.registry, {
    problems: () => {
      const p: string[] = [];
      // not ready before the device port listens
      if (capacity === undefined) p.push("starting");
      if (draining) p.push("draining");
      p.push(...health.problems());
      if (registry.state.shards.size === 0) p.push("registry");
      if (!revocations.loaded) p.push("revocations");
      const full = capacity?.problem();
      if (full !== undefined) p.push(full);
      return p;
    },
    detail: () => ({ ...health.detail(), ...(capacity?.problem() !== undefined ? { capacity: capacity.detail() } : {}) }),
  });
  const stats = answerStats(nc, { kind: "gateway", id: gatewayId, regressions: metrics.regressions, health, extra: () => ({ connections: sessions.all.size }) }, config.JETGATE_OPS_KEY);
  let jsm: Promise<JetStreamManager> | undefined;
  const admin = {
    gatewayId, nc, jsm: () => (jsm ??= jetstreamManager(nc)), redis, keys, registry, opsKeys: config.JETGATE_OPS_KEY,
    lookupUser: (user: string) => lookupUser({ nc, redis, keys, registry, mailbox, roster, timeoutMs: config.JETGATE_DEPENDENCY_TIMEOUT_MS }, user),
  };
  const usersApi: UsersApiDeps = { config, nc, redis, keys, revocationStore, registry, mailbox, cursors: ctx.cursors, metrics, roster, timeoutMs: config.JETGATE_DEPENDENCY_TIMEOUT_MS, log, audit };
  // everything but devices is open now: what is left of the file limit is theirs, less a reserve
  const files = new ConnectionCapacity(config, log, metrics);
  const server = await startServer(uws, config, ctx, dispatcher, serviceAuth, { unavailable: () => health.problems(), admin, usersApi, maxConnections: files.plan.maxConnections });
  files.watch(server);
  capacity = files;
  log.info({ port: server.port, opsPort: (ops.address() as AddressInfo).port, uws: basename(binary) }, "gateway listening");

  const shutdown = (signal: string) => {
    draining = true;
    server.refuseUpgrades();
    const all = [...sessions.all];
    log.info({ signal, connections: all.length, drainMs: config.JETGATE_DRAIN_MS }, "draining");
    const retry = Math.max(1000, Math.floor(config.JETGATE_DRAIN_MS / 2));
    for (const s of all) s.goAway(retry + Math.floor(Math.random() * retry));
    const perWave = Math.ceil(all.length / DRAIN_WAVES);
    const every = config.JETGATE_DRAIN_MS / DRAIN_WAVES;
    void (async () => {
      for (let w = 0; w < DRAIN_WAVES; w++) {
        for (const s of all.slice(w * perWave, (w + 1) * perWave)) s.close(Disconnect.GOING_AWAY);
        await new Promise((r) => setTimeout(r, every));
      }
      server.stopListening();
      ops.close();
      capacity?.stop();
      serviceTokens.stop();
      dispatcher.close();
      presence.stop();
      control.stop();
      roster.stop();
      revocationSync.stop();
      routes.stop();
      health.stop();
      stats.unsubscribe();
      sessions.close();
      await registry.close().catch(() => undefined);
      await nc.drain().catch(() => undefined);
      redis.disconnect();
      log.info("drained");
      process.exit(0);
    })();
  };
  onShutdownSignal(shutdown);
}

runAsMain(import.meta.url, () => runGateway());
