/**
 * How many devices a gateway takes, and when it stops accepting at all: pure decisions over its
 * file limit (docs/operations.md, "Connections and the file limit").
 *
 * Every connection is a file. uWebSockets.js's listener, once `accept` fails for want of one
 * (EMFILE), is readable again at once and tries again without pause: the gateway spun at a core
 * and answered nothing, its HTTP API and /readyz included. So the gateway keeps files in hand:
 * - devices past JETGATE_MAX_CONNECTIONS (by default the limit less the files open at start and a
 *   reserve) are answered 503 with Retry-After, so a load balancer moves them;
 * - the reserve serves what must go on answering: NATS and Redis, the HTTP API, health and
 *   metrics, and the 503s themselves;
 * - should the files run out anyway (clients holding sockets open without a request), the
 *   listener is closed until enough are free again: new connections are refused at once instead
 *   of hanging, and nothing spins.
 */

export interface CapacityPlan {
  /** The soft limit of open files. */
  limit: number;
  /** Files open before any device (measured at start). */
  baseline: number;
  /** Files kept for everything but devices. */
  reserve: number;
  /** Devices taken at once; more are answered 503. */
  maxConnections: number;
  /** Why JETGATE_MAX_CONNECTIONS was not taken as given (it was above what the limit allows). */
  clamped?: string;
}

/** Files kept back: a tenth of the limit, at least 64 and at most 1,024. */
export function fileReserve(limit: number): number {
  return Math.min(1024, Math.max(64, Math.floor(limit / 10)));
}

/** The plan for a limit, the files open at start and JETGATE_MAX_CONNECTIONS (0: from the limit). */
export function capacityPlan(limit: number, baseline: number, configured: number): CapacityPlan {
  const reserve = fileReserve(limit);
  const allowed = Math.max(1, limit - baseline - reserve);
  if (configured <= 0) return { limit, baseline, reserve, maxConnections: allowed };
  if (configured <= allowed) return { limit, baseline, reserve, maxConnections: configured };
  return {
    limit, baseline, reserve, maxConnections: allowed,
    clamped: `JETGATE_MAX_CONNECTIONS ${configured} is above what ${limit} open files allow (${allowed}: ${baseline} open at start, ${reserve} kept back); taking ${allowed}: raise the limit (ulimit -n) to take more`,
  };
}

/** Files that must stay free for the listener to keep accepting: a quarter of the reserve, at least 16. */
export function pauseMargin(reserve: number): number {
  return Math.max(16, Math.floor(reserve / 4));
}

/**
 * What the listener does with `open` files (undefined: they could not even be counted, which takes
 * a file: the limit is reached): stop accepting within the pause margin of the limit, start again
 * once half the reserve is free (apart enough that it does not flap).
 */
export function acceptDecision(open: number | undefined, limit: number, reserve: number, paused: boolean): "pause" | "resume" | "keep" {
  if (!paused) return open === undefined || open >= limit - pauseMargin(reserve) ? "pause" : "keep";
  return open !== undefined && open <= limit - Math.floor(reserve / 2) ? "resume" : "keep";
}
