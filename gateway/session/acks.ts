/**
 * Cumulative ACKs per device in Redis, upward only (a late or replayed ACK never lowers it), for
 * at most JETGATE_MAX_DEVICES_PER_USER devices per user: a new device past the bound takes the
 * place of the one whose last ACK is oldest. The session refuses an ACK beyond what it sent, so
 * the values are bounded too.
 */
import { seqKey, type MailboxSeq, type RedisKeys } from "../../protocol/index.js";
import { scripted, type RedisClient, type ScriptedRedis } from "../../protocol/io/index.js";

export class AckStore {
  private readonly redis: ScriptedRedis;

  constructor(
    redis: RedisClient,
    private readonly keys: RedisKeys,
    private readonly ttlS: number,
    private readonly maxDevices: number,
  ) {
    this.redis = scripted(redis);
  }

  /** Stores the ACK; resolves to how many other devices' state it evicted. */
  async store(user: string, device: string, seq: MailboxSeq, now = Date.now()): Promise<number> {
    const k = this.keys;
    const [, evicted] = await this.redis.jgAckStore(k.deviceAck(user, device), k.devices(user), seqKey(seq), this.ttlS, now, this.maxDevices, k.deviceAckPrefix(user), device);
    return evicted;
  }
}
