/**
 * protocol/: the contract every tier shares. Tiers import from here, never from each other.
 * The files at the root are the pure contract (frames, codec, seq math, ids and subjects, cursor
 * tokens, config, the registry model, the data layout); `io/` holds the shared I/O helpers that
 * talk to NATS, Redis and the process (connections, stream set-up, the registry client, the
 * dispatcher, signal handling).
 */
export * from "./errors.js";
export * from "./backoff.js";
export * from "./seq.js";
export * from "./ids.js";
export * from "./subjects.js";
export * from "./msgpack.js";
export * from "./frames.js";
export * from "./codec.js";
export * from "./cursor.js";
export * from "./config.js";
export * from "./hash.js";
export * from "./registry-model.js";
export * from "./io/registry-client.js";
export * from "./io/streams.js";
export * from "./entry.js";
export * from "./io/dispatch.js";
export * from "./io/connect.js";
export * from "./nats-version.js";
export * from "./layout.js";
export * from "./io/process.js";
export * from "./io/ops-http.js";
export * from "./io/health.js";
export * from "./io/ops-stats.js";
export * from "./cli-args.js";
