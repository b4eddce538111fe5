/** client/: the device SDK. Browser-safe; Node-only helpers are in client/node.ts. */
export { JetgateClient } from "./client.js";
export { JetgateClientError, SessionReplacedError, SignedOutError } from "./errors.js";
export type { ClientOptions, WebSocketLike, WebSocketFactory } from "./options.js";
export type { ClientState, ClientStats, ClientEvent } from "./events.js";
export { reconnectDelay, DEFAULT_BACKOFF, type BackoffOptions, type Clock, type TimerHandle } from "../protocol/device.js";
export { MemoryCursorStore, LocalStorageCursorStore, serializeCursor, deserializeCursor, type CursorStore } from "./cursor-store.js";
export { RecentIds } from "./dedup.js";
