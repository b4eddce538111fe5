/**
 * protocol/io: the I/O every tier shares (connections, stream set-up, the registry client, the
 * dispatcher, health and ops HTTP, signal handling). Its own entry point, apart from the pure
 * contract in protocol/index.ts, so that importing the contract never pulls in NATS or Redis.
 */
export * from "./registry-client.js";
export * from "./streams.js";
export * from "./dispatch.js";
export * from "./connect.js";
export * from "./process.js";
export * from "./ops-http.js";
export * from "./health.js";
export * from "./ops-stats.js";
export * from "./local-stack.js";
export * from "./stage-metric.js";
