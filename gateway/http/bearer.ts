/**
 * Bearer tokens: `Authorization: Bearer <token>` (the scheme in any case, RFC 9110 11.1) checked in
 * constant time, so how long it takes tells nothing of the token; and wrong tokens throttled per
 * client address (the console's admin token; the service tokens of the dispatch and users APIs,
 * gateway/http/service-auth.ts). A right token is never refused for the wrong ones sent from its
 * address: only a wrong one is answered 429 while the address is held off.
 */
import { TokenBucket } from "../rate-limit.js";

const SCHEME = "bearer ";

/** The token of an `Authorization: Bearer <token>` header; undefined for another scheme or none. */
export function bearerToken(header: string): string | undefined {
  if (header.slice(0, SCHEME.length).toLowerCase() !== SCHEME) return undefined;
  const token = header.slice(SCHEME.length);
  return token === "" ? undefined : token;
}

export function bearerMatches(header: string, token: string): boolean {
  const scheme = header.slice(0, SCHEME.length).toLowerCase() === SCHEME;
  return constantTimeEqual(header.slice(SCHEME.length), token) && scheme;
}

function constantTimeEqual(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  let diff = x.length ^ y.length;
  for (let i = 0; i < Math.max(x.length, y.length); i++) diff |= (x[i % Math.max(1, x.length)] ?? 0) ^ (y[i % Math.max(1, y.length)] ?? 0);
  return diff === 0;
}

/** Wrong tokens per client address: a burst of 10, then one every 6 s. */
const FAILED_AUTH_BURST = 10;
const FAILED_AUTH_PER_S = 1 / 6;
/** Client addresses tracked for wrong tokens; the oldest is forgotten past this. */
const MAX_TRACKED_CLIENTS = 10_000;

/** Wrong-token budgets by client address: one that keeps guessing is told to wait (429). */
export class FailedAuthThrottle {
  private readonly buckets = new Map<string, TokenBucket>();

  constructor(
    private readonly burst = FAILED_AUTH_BURST,
    private readonly perS = FAILED_AUTH_PER_S,
    private readonly maxClients = MAX_TRACKED_CLIENTS,
  ) {}

  /** Seconds to wait before the next attempt, or 0 when this client may try now. */
  waitS(client: string, now: number): number {
    const b = this.buckets.get(client);
    if (b === undefined || b.peek(now) >= 1) return 0;
    return Math.ceil((1 - b.peek(now)) / this.perS);
  }

  /** A wrong token from `client`. */
  failed(client: string, now: number): void {
    let b = this.buckets.get(client);
    if (b === undefined) {
      if (this.buckets.size >= this.maxClients) this.buckets.delete(this.buckets.keys().next().value!);
      b = new TokenBucket(this.burst, this.perS, now);
      this.buckets.set(client, b);
    }
    b.take(now);
  }
}
