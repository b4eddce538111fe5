/**
 * The gateway's mailbox reader: the decisions of gateway/mailbox/source.ts over Redis (the user's
 * watermarks and hot cache, gateway/mailbox/redis.ts) and the shard streams (NATS JetStream,
 * gateway/mailbox/nats.ts).
 */
import type { NatsConnection } from "@nats-io/transport-node";
import type { RedisKeys } from "../../protocol/index.js";
import type { RedisClient, RegistryClient } from "../../protocol/io/index.js";
import { NatsMailboxStream } from "./nats.js";
import { RedisMailboxCache } from "./redis.js";
import { CacheFirstMailbox } from "./source.js";

export { streamCallError } from "./nats.js";

export class MailboxReader extends CacheFirstMailbox {
  constructor(nc: NatsConnection, redis: RedisClient, keys: RedisKeys, registry: RegistryClient, lanes: readonly string[]) {
    super(new RedisMailboxCache(redis, keys), new NatsMailboxStream(nc, (shard) => registry.state.shards.has(shard)), registry, lanes);
  }
}
