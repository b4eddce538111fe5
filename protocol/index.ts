/**
 * protocol/: the contract every tier shares. Tiers import from protocol/, never from each other, and
 * only through its three entry points (eslint.config.js enforces it):
 * - this file, the pure contract: frames, codec, seq math, ids and subjects, cursor tokens, config,
 *   the registry model, the data layout. No sockets, no NATS, no Redis.
 * - `io/index.ts`, the shared I/O: connections, stream set-up, the registry client, the dispatcher,
 *   health and ops HTTP, signal handling.
 * - `device.ts`, the browser-safe part the device SDK is allowed.
 */
export * from "./errors.js";
export * from "./backoff.js";
export * from "./seq.js";
export * from "./stages.js";
export * from "./ids.js";
export * from "./subjects.js";
export * from "./msgpack.js";
export * from "./frames.js";
export * from "./codec.js";
export * from "./cursor.js";
export * from "./config.js";
export * from "./hash.js";
export * from "./registry-model.js";
export * from "./entry.js";
export * from "./dispatch-request.js";
export * from "./nats-version.js";
export * from "./layout.js";
export * from "./cli-args.js";
