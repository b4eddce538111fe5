/**
 * Whether and when the client connects again: what a close's code asks for, by its range
 * (`reconnectPolicy`, docs/protocol.md), and the backoff between attempts.
 */
import { CloseCode, reconnectDelay, reconnectPolicy, type BackoffOptions } from "../protocol/device.js";
import { JetgateClientError, SessionReplacedError, SignedOutError } from "./errors.js";
import type { ClientEvent } from "./events.js";

/** What the client does after the connection closed with a code. */
export type AfterClose =
  /** Reconnect after the backoff (or the `retry_ms` of a GOAWAY or an ERROR UNAVAILABLE). */
  | { type: "backoff" }
  /** The backend asked for a reconnect (4300-4399): at once, with the backoff reset; the app is told. */
  | { type: "now"; event: ClientEvent }
  /**
   * Stop for good: state `closed` with `reason`, pending sends rejected with `error()`, and
   * `event` (if any) told first. 4403 and 4409 have their own errors; every other terminal code
   * (4600-4699, including codes this SDK does not know) a JetgateClientError naming it.
   */
  | { type: "stop"; reason: string; error: () => Error; event?: ClientEvent };

export function afterClose(code: number, reason: string): AfterClose {
  switch (reconnectPolicy(code)) {
    case "backoff":
      return { type: "backoff" };
    case "now":
      return { type: "now", event: { type: "reconnect_requested", reason } };
    case "stop":
      if (code === CloseCode.SIGNED_OUT) return { type: "stop", reason: `signed out: ${reason}`, error: () => new SignedOutError(reason), event: { type: "signed_out", reason } };
      if (code === CloseCode.REPLACED) return { type: "stop", reason: `server closed with ${code}`, error: () => new SessionReplacedError() };
      return { type: "stop", reason: `server closed with ${code}`, error: () => new JetgateClientError("SERVER_CLOSED", `server closed with ${code}: ${reason}`) };
  }
}

/**
 * Full-jitter exponential backoff between attempts, reset after each SYNCED and after a session that
 * applied entries (client.ts, onClose); the `retry_ms` of a
 * GOAWAY or an ERROR UNAVAILABLE (or a reconnect the backend asked for) replaces the next delay once.
 */
export class Backoff {
  /** Attempts since the last SYNCED or the last session that applied entries: also picks the gateway of a URL list. */
  attempt = 0;
  private override: number | undefined;

  constructor(
    private readonly opts: BackoffOptions,
    private readonly random: () => number = Math.random,
  ) {}

  /** The next attempt's number and delay (which uses up an override). */
  next(): { attempt: number; delayMs: number } {
    const delayMs = this.override ?? reconnectDelay(this.attempt, this.opts, this.random);
    this.override = undefined;
    return { attempt: this.attempt++, delayMs };
  }

  /** Synced, or a session applied entries: the next failure starts from the first step. */
  reset(): void {
    this.attempt = 0;
  }

  /** GOAWAY {retry_ms}, ERROR UNAVAILABLE {retry_ms}. */
  retryAfter(ms: number): void {
    this.override = ms;
  }

  /** At once, and from the first step if that fails. */
  now(): void {
    this.attempt = 0;
    this.override = 0;
  }
}
