/**
 * Token refresh: before the session's JWT expires the client asks the app's `token()` for a fresh
 * one and sends it as REFRESH on the live connection; REFRESH_OK's `exp` times the next one.
 */
import type { Clock, Timer } from "./clock.js";

/** After a `token()` that failed: try again this much later (at expiry the gateway closes, and the reconnect asks again). */
const RETRY_MS = 5000;

export class TokenRefresh {
  private timer: Timer | undefined;

  constructor(
    private readonly clock: Clock,
    private readonly token: () => string | Promise<string>,
    /** Sends REFRESH with the new token, if the session is still there. */
    private readonly send: (token: string) => void,
  ) {}

  /** Refreshes before `expMs` (epoch ms); nothing when the expiry is unknown. */
  schedule(expMs: number | undefined): void {
    this.stop();
    if (expMs === undefined) return;
    this.timer = this.clock.setTimeout(() => void this.refresh(), refreshDelay(expMs - this.clock.now()));
  }

  stop(): void {
    this.clock.clearTimeout(this.timer);
    this.timer = undefined;
  }

  private async refresh(): Promise<void> {
    let token: string;
    try {
      token = await this.token();
    } catch {
      this.timer = this.clock.setTimeout(() => void this.refresh(), RETRY_MS);
      return;
    }
    this.send(token);
  }
}

/**
 * When to refresh a token with `leftMs` to live: after three quarters of it, never sooner than a
 * second. A fraction of what is left, not "a minute before expiry": with tokens of a minute or less
 * that asked for a refresh every second, each new token as short as the last.
 */
export function refreshDelay(leftMs: number): number {
  return Math.min(Math.max(1000, Math.floor(leftMs * 0.75)), 2 ** 31 - 1);
}

/** A JWT's `exp` in ms, read without verifying (only to time a refresh); undefined if unreadable. */
export function tokenExpiry(jwt: string | undefined): number | undefined {
  const part = jwt?.split(".")[1];
  if (part === undefined) return undefined;
  try {
    const b64 = part.replace(/-/g, "+").replace(/_/g, "/");
    const json = JSON.parse(atob(b64 + "=".repeat((4 - (b64.length % 4)) % 4))) as { exp?: unknown };
    return typeof json.exp === "number" ? json.exp * 1000 : undefined;
  } catch {
    return undefined;
  }
}
