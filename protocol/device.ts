/**
 * The browser-safe part of protocol/: what a device needs (frames, codec, seq math, error and close
 * codes, the clock). No node: imports and no server dependencies; the device SDK imports only this.
 */
export * from "./errors.js";
export * from "./backoff.js";
export { globalClock, sleep, systemClock, type Clock, type TimerHandle } from "./clock.js";
export * from "./seq.js";
export * from "./ids.js";
export * from "./frames.js";
export * from "./codec.js";
export { pack, unpackOne, MsgpackWriter, MsgpackDecodeError } from "./msgpack.js";
