/**
 * The user's watermarks and hot cache for the mailbox reader (MailboxCache), on Redis. A Redis that
 * does not answer now is UNAVAILABLE to a session (4503, come back later), never an internal error.
 */
import { ReplyError } from "ioredis";
import { cacheStreamId, parseCacheRow, HASH_FIELDS, WATERMARK_ALL, type CacheRow, type MailboxSeq, type RedisKeys } from "../../protocol/index.js";
import type { RedisClient } from "../../protocol/io/index.js";
import type { MailboxCache } from "./ports.js";
import { RETRY_LATER_MS, UnavailableError } from "./gather.js";

/** Replies of a Redis (or a Redis Cluster) that cannot serve now: a failover, a load, a busy script. */
const NOT_NOW = /^(CLUSTERDOWN|TRYAGAIN|LOADING|MASTERDOWN|BUSY|READONLY)\b/;

/**
 * What a failed Redis call means to a session: no answer (a timeout, a closed connection, retries
 * spent, a cluster with no node to ask: every error ioredis raises itself) or a reply that says
 * "not now" is unavailable; any other reply (a wrong type: a bug) stays as it is.
 */
export function redisCallError(err: unknown): unknown {
  if (!(err instanceof Error)) return err;
  // ioredis types ReplyError as `any`: the Error check above does the narrowing
  if (err instanceof (ReplyError as typeof Error) && !NOT_NOW.test(err.message)) return err;
  return new UnavailableError(`Redis did not answer (${err.message}); reconnect`, RETRY_LATER_MS, { cause: err });
}

export class RedisMailboxCache implements MailboxCache {
  constructor(
    private readonly redis: RedisClient,
    private readonly keys: RedisKeys,
  ) {}

  watermarkHash(user: string): Promise<Record<string, string>> {
    return this.redis.hgetall(this.keys.watermarks(user)).catch((err: unknown) => {
      throw redisCallError(err);
    });
  }

  async headAndRows(user: string, after: MailboxSeq, until: MailboxSeq | undefined, count: number): Promise<{ head: unknown; rows: (CacheRow | undefined)[] }> {
    const replies = await this.redis
      .pipeline()
      .hget(this.keys.watermarks(user), WATERMARK_ALL)
      .xrangeBuffer(this.keys.hotCache(user), `(${cacheStreamId(after)}`, until === undefined ? "+" : cacheStreamId(until), "COUNT", count)
      .exec()
      .catch((err: unknown) => {
        throw redisCallError(err);
      });
    const [headReply, rowsReply] = replies ?? [];
    if (headReply?.[0] || rowsReply?.[0]) throw redisCallError(headReply?.[0] ?? rowsReply?.[0]);
    const rows = ((rowsReply?.[1] ?? []) as [Buffer, Buffer[]][]).map(([, fields]) => parseCacheRow(fields));
    return { head: headReply?.[1], rows };
  }

  headsAndRoutes(users: readonly string[]): Promise<([unknown, unknown] | null)[]> {
    // one command per user, auto-pipelined: one round trip per Redis node. An explicit pipeline of
    // keys in many slots is refused by a Redis Cluster ("same slots allocation group"), and the tail
    // check read nothing there
    return Promise.all(
      users.map((u) =>
        this.redis
          .hmget(this.keys.watermarks(u), WATERMARK_ALL, HASH_FIELDS.routes)
          .then((v): [unknown, unknown] => [v[0], v[1]])
          .catch(() => null),
      ),
    );
  }
}
