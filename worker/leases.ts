/**
 * Advisory shard leases and worker presence in Redis. Leases only spread the shards over workers;
 * correctness comes from epochs (a worker acts only under the epoch it appended, gateways drop
 * pushes of older epochs), so a lost or doubled lease costs an extra takeover, never an entry.
 */
import type { Clock, RedisKeys } from "../protocol/index.js";
import { scripted, type RedisClient, type ScriptedRedis } from "../protocol/io/index.js";

export type RenewOutcome = "held" | "reacquired" | "lost";

export class Leases {
  private readonly redis: ScriptedRedis;

  constructor(
    redis: RedisClient,
    private readonly keys: RedisKeys,
    private readonly owner: string,
    private readonly leaseMs: number,
    /** Its wall time scores the worker set, which every worker reads: a time the workers share. */
    private readonly clock: Pick<Clock, "now">,
  ) {
    this.redis = scripted(redis);
  }

  async acquire(shard: number): Promise<boolean> {
    return (await this.redis.set(this.keys.lease(shard), this.owner, "PX", this.leaseMs, "NX")) === "OK";
  }

  /** Extends a lease this worker holds; a lease that vanished (e.g. FLUSHALL) is taken again. */
  async renew(shard: number): Promise<RenewOutcome> {
    const r = await this.redis.jgLeaseRenew(this.keys.lease(shard), this.owner, this.leaseMs);
    return r === 1 ? "held" : r === 2 ? "reacquired" : "lost";
  }

  async release(shard: number): Promise<void> {
    await this.redis.jgLeaseRelease(this.keys.lease(shard), this.owner);
  }

  /**
   * Records this worker as live for one lease period and returns every live worker, sorted.
   * `redisLost`: Redis lost its data (a restart without persistence, FLUSHALL) less than a lease
   * ago, told by a marker key without expiry that holds when it was (re)created. Every worker
   * ticking within that lease sees it, whichever re-created it. A worker whose own tick ran late
   * finds its entry expired but an old marker: that is not a loss of the worker set.
   */
  async heartbeat(present = true): Promise<{ live: string[]; redisLost: boolean; since: number }> {
    const now = Math.floor(this.clock.now());
    const key = this.keys.workers();
    // issued together: one auto-pipelined round trip, in order
    const [, sinceValue, , , live] = await Promise.all([
      this.redis.set(this.keys.workersSince(), String(now), "NX"),
      this.redis.get(this.keys.workersSince()),
      this.redis.zremrangebyscore(key, "-inf", String(now)),
      // absent: a worker that cannot reach NATS leaves the set, so the others take its share
      present ? this.redis.zadd(key, now + this.leaseMs, this.owner) : this.redis.zrem(key, this.owner),
      this.redis.zrangebyscore(key, String(now), "+inf"),
    ]);
    const since = Number(sinceValue);
    const lost = Number.isFinite(since) && now - since < this.leaseMs;
    return { live: live.includes(this.owner) || !present ? live.sort() : [...live, this.owner].sort(), redisLost: lost, since };
  }

  async leave(): Promise<void> {
    await this.redis.zrem(this.keys.workers(), this.owner);
  }
}
