/**
 * The one backoff of jetgate: exponential, capped; with full jitter (AWS architecture blog) for
 * devices reconnecting, without it for a server process retrying a dependency. Pure, browser-safe.
 */
export interface BackoffOptions {
  /** First delay's upper bound, ms. */
  baseMs: number;
  /** No delay is longer than this, ms. */
  capMs: number;
}

export const DEFAULT_BACKOFF: BackoffOptions = { baseMs: 250, capMs: 30_000 };

/** The ceiling of attempt `attempt` (0 first): min(cap, base * 2^attempt). A process's retry waits this long. */
export function backoffCeiling(attempt: number, opts: BackoffOptions): number {
  return Math.min(opts.capMs, opts.baseMs * 2 ** Math.min(attempt, 30));
}

/**
 * The delay before reconnect attempt `attempt` (0 for the first retry): uniformly random in
 * [0, min(cap, base * 2^attempt)]. A server's GOAWAY `retry_ms` replaces it for one attempt.
 */
export function reconnectDelay(attempt: number, opts: BackoffOptions = DEFAULT_BACKOFF, random: () => number = Math.random): number {
  return Math.floor(random() * backoffCeiling(attempt, opts));
}
