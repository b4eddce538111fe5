/** The user's watermarks and hot cache for the mailbox reader (MailboxCache), on Redis. */
import { cacheStreamId, parseCacheRow, HASH_FIELDS, WATERMARK_ALL, type CacheRow, type MailboxSeq, type RedisKeys } from "../../protocol/index.js";
import type { RedisClient } from "../../protocol/io/index.js";
import type { MailboxCache } from "./ports.js";

export class RedisMailboxCache implements MailboxCache {
  constructor(
    private readonly redis: RedisClient,
    private readonly keys: RedisKeys,
  ) {}

  watermarkHash(user: string): Promise<Record<string, string>> {
    return this.redis.hgetall(this.keys.watermarks(user));
  }

  async headAndRows(user: string, after: MailboxSeq, until: MailboxSeq | undefined, count: number): Promise<{ head: unknown; rows: (CacheRow | undefined)[] }> {
    const replies = await this.redis
      .pipeline()
      .hget(this.keys.watermarks(user), WATERMARK_ALL)
      .xrangeBuffer(this.keys.hotCache(user), `(${cacheStreamId(after)}`, until === undefined ? "+" : cacheStreamId(until), "COUNT", count)
      .exec();
    const [headReply, rowsReply] = replies ?? [];
    if (headReply?.[0] || rowsReply?.[0]) throw (headReply?.[0] ?? rowsReply?.[0])!;
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
