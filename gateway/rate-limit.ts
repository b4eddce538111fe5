/** A token bucket, the one every rate limit of the gateway uses (per connection, per user). */
export class TokenBucket {
  private tokens: number;
  private at: number;

  /**
   * `burst` tokens at most, refilled at `perSecond`. With `debt`, tokens may go below zero down to
   * -`debt`: a caller that keeps taking is then refused however its calls are spaced, and one that
   * backs off pays the debt back.
   */
  constructor(
    private readonly burst: number,
    private readonly perSecond: number,
    now: number,
    private readonly debt = 0,
  ) {
    this.tokens = burst;
    this.at = now;
  }

  /** Takes one token: true when there was one. */
  take(now: number): boolean {
    this.tokens = Math.min(this.burst, this.tokens + ((now - this.at) / 1000) * this.perSecond);
    this.at = now;
    if (this.tokens >= 1) {
      this.tokens -= 1;
      return true;
    }
    if (this.debt > 0) this.tokens = Math.max(this.tokens - 1, -this.debt - 1);
    return false;
  }

  /** Tokens there are at `now`, without taking one. */
  peek(now: number): number {
    return Math.min(this.burst, this.tokens + ((now - this.at) / 1000) * this.perSecond);
  }

  /** True when the caller is deeper in debt than allowed (always false without debt). */
  get exhausted(): boolean {
    return this.debt > 0 && this.tokens < -this.debt;
  }
}
