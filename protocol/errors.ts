/**
 * Every error code and close code of wire protocol v1, in one table each.
 *
 * Two kinds of failure reach a device (as in centrifuge): an ERROR frame, after which the
 * connection may stay open (`fatal: false`), and a close with a code. What a device does after a
 * close is decided by the code's range (`reconnectPolicy`).
 */

/** Codes carried in `ERROR {code}` frames. */
export const ErrorCode = {
  /** The cursor's epoch is older than the shard's; resume from `replay_from_seq` with `new_cursor`. */
  CURSOR_REBASED: "CURSOR_REBASED",
  /** The cursor points below the trim watermark; entries were lost to retention: rebuild. */
  CURSOR_EXPIRED: "CURSOR_EXPIRED",
  /** The cursor's signature does not verify, or names a shard/log this user never had. */
  CURSOR_INVALID: "CURSOR_INVALID",
  /** The frame is not valid msgpack, not a known frame, or has a bad field. */
  BAD_FRAME: "BAD_FRAME",
  /** Token missing, invalid or expired, or a frame other than AUTH before AUTH. */
  UNAUTHORIZED: "UNAUTHORIZED",
  /** Too many frames, connections or requests. */
  RATE_LIMITED: "RATE_LIMITED",
  /** A frame or a body over the configured size. */
  TOO_LARGE: "TOO_LARGE",
  /** A request the session cannot serve as asked (PULL of an unknown lane, ACK of a seq never sent). */
  BAD_REQUEST: "BAD_REQUEST",
  /** The server cannot answer now (its registry or streams are changing); retry after `retry_ms`. */
  UNAVAILABLE: "UNAVAILABLE",
  /** A server-side fault; the request may be retried. */
  INTERNAL: "INTERNAL",
} as const;
export type ErrorCode = (typeof ErrorCode)[keyof typeof ErrorCode];

/** WebSocket close codes, with the reason text sent along. */
export const CloseCode = {
  /** The backend asked the device to reconnect now (e.g. to pick up a new token): no backoff. */
  RECONNECT_NOW: 4300,
  BAD_FRAME: 4400,
  UNAUTHENTICATED: 4401,
  /** The backend signed the user (or device) out: the device must not reconnect on its own. */
  SIGNED_OUT: 4403,
  SLOW_CONSUMER: 4408,
  REPLACED: 4409,
  TOO_LARGE: 4413,
  RATE_LIMITED: 4429,
  INTERNAL: 4500,
  UNAVAILABLE: 4503,
  GOING_AWAY: 1001,
} as const;
export type CloseCode = (typeof CloseCode)[keyof typeof CloseCode];

export const closeReasons: Readonly<Record<CloseCode, string>> = {
  4300: "reconnect now",
  4400: "bad frame",
  4401: "unauthenticated or auth timeout",
  4403: "signed out: do not reconnect",
  4408: "slow consumer: resume by cursor",
  4409: "replaced by a newer session of this device",
  4413: "frame too large",
  4429: "rate limited",
  4500: "internal error",
  4503: "temporarily unavailable: reconnect",
  1001: "server draining",
};

/**
 * How a session ends, as one value: the close code, the reason text and, for a fatal error, the
 * ERROR code the device is told first (centrifuge's Disconnect). The gateway closes only with
 * these (`Transport.close` takes one), so a code, its ERROR and its reason cannot drift apart.
 * A close without `error` tells the device all it needs by its code.
 */
export interface Disconnect {
  readonly close: CloseCode;
  readonly reason: string;
  readonly error?: ErrorCode;
}

/** A Disconnect that is told as an ERROR frame before the close. */
export type FatalDisconnect = Disconnect & { readonly error: ErrorCode };

export const Disconnect = {
  BAD_FRAME: { error: ErrorCode.BAD_FRAME, close: CloseCode.BAD_FRAME, reason: closeReasons[4400] },
  TOO_LARGE: { error: ErrorCode.TOO_LARGE, close: CloseCode.TOO_LARGE, reason: closeReasons[4413] },
  UNAUTHORIZED: { error: ErrorCode.UNAUTHORIZED, close: CloseCode.UNAUTHENTICATED, reason: closeReasons[4401] },
  RATE_LIMITED: { error: ErrorCode.RATE_LIMITED, close: CloseCode.RATE_LIMITED, reason: closeReasons[4429] },
  UNAVAILABLE: { error: ErrorCode.UNAVAILABLE, close: CloseCode.UNAVAILABLE, reason: closeReasons[4503] },
  INTERNAL: { error: ErrorCode.INTERNAL, close: CloseCode.INTERNAL, reason: closeReasons[4500] },
  /** No AUTH within JETGATE_AUTH_TIMEOUT_MS. */
  AUTH_TIMEOUT: { close: CloseCode.UNAUTHENTICATED, reason: "auth timeout" },
  /** The session's token (the last REFRESH's) expired. */
  TOKEN_EXPIRED: { close: CloseCode.UNAUTHENTICATED, reason: "token expired" },
  /** The socket's buffer stayed over the limit: the device resumes by cursor. */
  SLOW_CONSUMER: { close: CloseCode.SLOW_CONSUMER, reason: closeReasons[4408] },
  /** A newer session of the same device exists (here or on another gateway). */
  REPLACED: { close: CloseCode.REPLACED, reason: "a newer session of this device exists" },
  /** The backend signed the user or device out (users API). */
  SIGNED_OUT: { close: CloseCode.SIGNED_OUT, reason: closeReasons[4403] },
  /** The backend asked the device to reconnect at once (users API). */
  RECONNECT_NOW: { close: CloseCode.RECONNECT_NOW, reason: closeReasons[4300] },
  /** The gateway drains (SIGTERM). */
  GOING_AWAY: { close: CloseCode.GOING_AWAY, reason: "server draining" },
} as const satisfies Record<string, Disconnect>;

/** The same Disconnect told with another reason (a WebSocket close reason is at most 123 bytes: cut to 100 characters). */
export function withReason<D extends Disconnect>(d: D, reason: string): D {
  return { ...d, reason: reason.slice(0, 100) };
}

/**
 * Close codes a device uses itself (4000..4099: the device's own reasons). A gateway logs them;
 * they change nothing on its side.
 */
export const DeviceClose = {
  BYE: { code: 1000, reason: "bye" },
  RECONNECT: { code: 4000, reason: "client reconnect" },
  HEARTBEAT_MISSED: { code: 4001, reason: "heartbeat missed" },
  BAD_SERVER_FRAME: { code: 4002, reason: "bad frame from server" },
  CONNECT_TIMEOUT: { code: 4003, reason: "no AUTH_OK in time" },
} as const satisfies Record<string, { code: number; reason: string }>;

/** What a device does after a server's close: reconnect at once, reconnect after its backoff, or stop. */
export type ReconnectPolicy = "now" | "backoff" | "stop";

/**
 * What a device does after the server closed with `code`, by ranges (docs/protocol.md):
 * 4300..4399 reconnect at once; 4600..4699 stop (reserved for terminal codes, so an SDK that
 * does not know a new one still stops); every other code reconnects after the backoff. Wire v1
 * has two terminal codes older than the ranges, kept as they are so that no device's behaviour
 * changes: 4403 (signed out) and 4409 (replaced). No code joins that list: a new terminal code
 * takes a number in 4600..4699.
 */
export function reconnectPolicy(code: number): ReconnectPolicy {
  if (code >= 4300 && code <= 4399) return "now";
  if ((code >= 4600 && code <= 4699) || V1_TERMINAL.has(code)) return "stop";
  return "backoff";
}
const V1_TERMINAL: ReadonlySet<number> = new Set([CloseCode.SIGNED_OUT, CloseCode.REPLACED]);

/** Base class of jetgate's named errors: `name` is the class name, `code` is machine-readable. */
export class JetgateError extends Error {
  readonly code: string;
  constructor(code: string, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
  }
}
