/** protocol/: the contract every tier shares. Tiers import from here, never from each other. */
export * from "./errors.js";
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
export * from "./registry-client.js";
export * from "./streams.js";
export * from "./entry.js";
export * from "./dispatch.js";
export * from "./connect.js";
export * from "./keys.js";
