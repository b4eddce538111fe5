/** What the app gives the client: its options, and the WebSocket it runs on. */
import type { BackoffOptions, Clock, Entry, MailboxSeq } from "../protocol/device.js";
import type { CursorStore } from "./cursor-store.js";

/** The subset of the WebSocket API the SDK uses; the browser's and `ws`'s both fit. */
export interface WebSocketLike {
  binaryType: string;
  readonly readyState: number;
  send(data: Uint8Array): void;
  close(code?: number, reason?: string): void;
  onopen: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
  onclose: ((ev: { code: number; reason: string }) => void) | null;
  onerror: ((ev: unknown) => void) | null;
}
export type WebSocketFactory = new (url: string) => WebSocketLike;

/** WebSocket.OPEN */
export const OPEN = 1;

export interface ClientOptions {
  /**
   * ws(s)://host:port/v1/ws, or several gateways: the client starts at a random one and moves to
   * the next after each failed attempt (a load balancer in front does the same job).
   */
  url: string | readonly string[];
  device: string;
  /** Called before every connection attempt: return a fresh device JWT. */
  token: () => string | Promise<string>;
  /** The app's handler for each entry; the cursor advances after it resolves. */
  onEntry: (entry: Entry) => void | Promise<void>;
  /** CURSOR_EXPIRED: entries were lost to retention; rebuild the app's state (live entries wait). */
  onRebuild?: (info: { trimWatermark: MailboxSeq }) => void | Promise<void>;
  store?: CursorStore;
  WebSocket?: WebSocketFactory;
  lanes?: string[];
  backoff?: BackoffOptions;
  /** Message ids remembered for dedup. */
  dedupWindow?: number;
  /** Send a cumulative ACK after this many entries or this many ms, whichever comes first. */
  ackEvery?: { entries: number; ms: number };
  /**
   * An attempt without AUTH_OK by then is given up and the next gateway tried (default 10 s): a
   * gateway behind a silent network, or one waiting on its own dependencies, never answers.
   */
  connectTimeoutMs?: number;
  /**
   * The time and timers the client runs on (protocol's Clock): the heartbeat, ACK flushes, token
   * refresh, timeouts and reconnect waits. Default: the runtime's, with timers that keep a Node app
   * running. Tests pass one they step by hand.
   */
  clock?: Clock;
}
