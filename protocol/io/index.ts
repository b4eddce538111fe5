/**
 * protocol/io: the I/O every tier shares (connections, stream set-up, the registry client, the
 * dispatcher, health and ops HTTP, signal handling). Its own entry point, apart from the pure
 * contract in protocol/index.ts, so that importing the contract never pulls in NATS or Redis.
 *
 * Each name is exported by name: this list is the public surface, not everything the modules export.
 */
export { RegistryClient } from "./registry-client.js";
export { CONSUME_OPTIONS, ensureStream, floorsStreamConfig, ingressStreamConfig, isNotFound, logOfStream, newLogId, registryStreamConfig, shardStreamConfig, type StreamSettings } from "./streams.js";
export { Dispatcher, LinkDispatcher, type DispatcherOptions, type DispatchStats } from "./dispatch.js";
export { connectNats, connectRedis, NatsServerTooOldError, scripted, type RedisClient, type ScriptedRedis } from "./connect.js";
export { exitOnUnhandledRejection, onShutdownSignal, registryLogging, runAsMain } from "./process.js";
export { ReadyzSchema, startOpsHttp } from "./ops-http.js";
export { DependencyHealth, writeRefusal } from "./health.js";
export { answerStats, collectStats, ProcessStatsSchema } from "./ops-stats.js";
export { processAlive, readLocalStack, runningStack, stackDir, withLocalStack, writeLocalStack, type LocalStack } from "./local-stack.js";
export { registerStageMetric } from "./stage-metric.js";
export { loadConfig } from "./config-env.js";
export { parseFlags, usageError, wantsHelp } from "./cli-args.js";
export { CursorKeyError, cursorSigner, type CursorSigner } from "./cursor.js";
