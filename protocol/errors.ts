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
  /** A server-side fault; the request may be retried. */
  INTERNAL: "INTERNAL",
} as const;
export type ErrorCode = (typeof ErrorCode)[keyof typeof ErrorCode];

/** WebSocket close codes, with the reason text sent along. */
export const CloseCode = {
  BAD_FRAME: 4400,
  UNAUTHENTICATED: 4401,
  SLOW_CONSUMER: 4408,
  REPLACED: 4409,
  TOO_LARGE: 4413,
  RATE_LIMITED: 4429,
  INTERNAL: 4500,
  GOING_AWAY: 1001,
} as const;
export type CloseCode = (typeof CloseCode)[keyof typeof CloseCode];

export const closeReasons: Readonly<Record<CloseCode, string>> = {
  4400: "bad frame",
  4401: "unauthenticated or auth timeout",
  4408: "slow consumer: resume by cursor",
  4409: "replaced by a newer session of this device",
  4413: "frame too large",
  4429: "rate limited",
  4500: "internal error",
  1001: "server draining",
};

/** Whether a device should reconnect after this close code (all but a replaced session). */
export function shouldReconnect(code: number): boolean {
  return code !== CloseCode.REPLACED;
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
