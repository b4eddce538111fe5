/**
 * Every error code and close code of wire protocol v1, in one table each.
 *
 * Two kinds of failure reach a device (as in centrifuge): an ERROR frame, after which the
 * connection may stay open (`fatal: false`), and a close with a code. Close codes in 4000..4499
 * mean "fix or wait, then reconnect"; 4500 is a server fault; 1001 is a drain.
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
 * How a session ends, as one value: the ERROR code the device is told and the close code that
 * follows (centrifuge's Disconnect). The gateway closes only with these, so a code and its pair
 * cannot drift apart.
 */
export interface Disconnect {
  readonly error: ErrorCode;
  readonly close: CloseCode;
}

export const Disconnect = {
  BAD_FRAME: { error: ErrorCode.BAD_FRAME, close: CloseCode.BAD_FRAME },
  TOO_LARGE: { error: ErrorCode.TOO_LARGE, close: CloseCode.TOO_LARGE },
  UNAUTHORIZED: { error: ErrorCode.UNAUTHORIZED, close: CloseCode.UNAUTHENTICATED },
  RATE_LIMITED: { error: ErrorCode.RATE_LIMITED, close: CloseCode.RATE_LIMITED },
  UNAVAILABLE: { error: ErrorCode.UNAVAILABLE, close: CloseCode.UNAVAILABLE },
  INTERNAL: { error: ErrorCode.INTERNAL, close: CloseCode.INTERNAL },
} as const satisfies Record<string, Disconnect>;

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

/** Whether a device should reconnect after this close code (all but a replaced session and a sign-out). */
export function shouldReconnect(code: number): boolean {
  return code !== CloseCode.REPLACED && code !== CloseCode.SIGNED_OUT;
}

/** Base class of jetgate's named errors: `name` is the class name, `code` is machine-readable. */
export class JetgateError extends Error {
  readonly code: string;
  constructor(code: string, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
  }
}
