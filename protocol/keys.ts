/**
 * Redis key layout. Every key of a user carries the hash tag `{u:<user>}` so a script that touches
 * one user's keys stays in one Redis Cluster slot; shard keys carry `{s:<shard>}`.
 */
import { assertId } from "./ids.js";
import { assertShard } from "./subjects.js";

export class RedisKeys {
  constructor(readonly prefix: string) {}

  private user(user: string): string {
    return `${this.prefix}:{u:${assertId("user", user)}}`;
  }

  /** Hash: lane -> highest seq (20-digit decimal), `_all` -> highest over lanes, `_ca` -> hot cache complete after. */
  watermarks(user: string): string {
    return `${this.user(user)}:wm`;
  }

  /** Stream of the user's latest entries, ids `<epoch>-<offset>`. */
  hotCache(user: string): string {
    return `${this.user(user)}:hc`;
  }

  /** Dedup of one dispatch for one user: value `<log>:<offset>` of the first copy. */
  dedup(user: string, dispatchId: string): string {
    return `${this.user(user)}:dd:${assertId("dispatch", dispatchId)}`;
  }

  /** Last cumulative ACK of a device. */
  deviceAck(user: string, device: string): string {
    return `${this.user(user)}:ack:${assertId("device", device)}`;
  }

  /** Presence of a device: which gateway holds its session. */
  presence(user: string, device: string): string {
    return `${this.user(user)}:pr:${assertId("device", device)}`;
  }

  /** Advisory lease of a shard: value is the owner's worker id. */
  lease(shard: number): string {
    return `${this.prefix}:{s:${assertShard(shard)}}:lease`;
  }

  /** Sorted set of live workers, scored by the expiry of their heartbeat. */
  workers(): string {
    return `${this.prefix}:{workers}`;
  }
}

/** A seq as a fixed-width decimal string, so Lua compares seqs as strings (its numbers are doubles). */
export function seqKey(seq: bigint): string {
  return seq.toString().padStart(20, "0");
}
