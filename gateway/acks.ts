/** Cumulative ACKs per device in Redis, upward only (a late or replayed ACK never lowers it). */
import { seqKey, type MailboxSeq, type RedisClient, type RedisKeys } from "../protocol/index.js";

const STORE_LUA = `
local cur = redis.call('GET', KEYS[1])
if (not cur) or cur < ARGV[1] then redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2]) return 1 end
return 0
`;

type AckClient = RedisClient & { jgAckStore(key: string, seq20: string, ttl: number): Promise<number> };

export class AckStore {
  private readonly redis: AckClient;

  constructor(
    redis: RedisClient,
    private readonly keys: RedisKeys,
    private readonly ttlS: number,
  ) {
    redis.defineCommand("jgAckStore", { numberOfKeys: 1, lua: STORE_LUA });
    this.redis = redis as AckClient;
  }

  async store(user: string, device: string, seq: MailboxSeq): Promise<void> {
    await this.redis.jgAckStore(this.keys.deviceAck(user, device), seqKey(seq), this.ttlS);
  }
}
