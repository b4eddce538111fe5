/** Cumulative ACKs per device in Redis, upward only (a late or replayed ACK never lowers it). */
import { seqKey, type MailboxSeq, type RedisClient, type RedisKeys } from "../protocol/index.js";


type AckClient = RedisClient & { jgAckStore(key: string, seq20: string, ttl: number): Promise<number> };

export class AckStore {
  private readonly redis: AckClient;

  constructor(
    redis: RedisClient,
    private readonly keys: RedisKeys,
    private readonly ttlS: number,
  ) {
    this.redis = redis as AckClient;
  }

  async store(user: string, device: string, seq: MailboxSeq): Promise<void> {
    await this.redis.jgAckStore(this.keys.deviceAck(user, device), seqKey(seq), this.ttlS);
  }
}
