/** client/: the device SDK. Browser-safe; Node-only helpers are in client/node.ts. */
export { JetgateClient, JetgateClientError, SessionReplacedError, SignedOutError } from "./client.js";
export type { ClientOptions, ClientState, ClientStats, ClientEvent, WebSocketLike, WebSocketFactory } from "./client.js";
export { reconnectDelay, DEFAULT_BACKOFF, type BackoffOptions } from "../protocol/device.js";
export { MemoryCursorStore, LocalStorageCursorStore, serializeCursor, deserializeCursor, type CursorStore } from "./cursor-store.js";
export { RecentIds } from "./dedup.js";
