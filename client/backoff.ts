/** Reconnect delays: exponential backoff with full jitter (AWS architecture blog), pure. */
export interface BackoffOptions {
  /** First delay's upper bound, ms. */
  baseMs: number;
  /** No delay is longer than this, ms. */
  capMs: number;
}

export const DEFAULT_BACKOFF: BackoffOptions = { baseMs: 250, capMs: 30_000 };

/**
 * The delay before reconnect attempt `attempt` (0 for the first retry): uniformly random in
 * [0, min(cap, base * 2^attempt)]. A server's GOAWAY `retry_ms` replaces it for one attempt.
 */
export function reconnectDelay(attempt: number, opts: BackoffOptions = DEFAULT_BACKOFF, random: () => number = Math.random): number {
  const ceiling = Math.min(opts.capMs, opts.baseMs * 2 ** Math.min(attempt, 30));
  return Math.floor(random() * ceiling);
}
