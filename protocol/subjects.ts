/** NATS subject and stream names. Every id is validated before it becomes part of a subject. */
import { assertId } from "./ids.js";
import { JetgateError } from "./errors.js";

export const REGISTRY_STREAM = "JETGATE_REGISTRY";
export const REGISTRY_SUBJECT = "jetgate.registry";
export const INGRESS_STREAM = "INGRESS";
export const INGRESS_SUBJECTS = "in.>";

export class InvalidShardError extends JetgateError {
  constructor(shard: unknown) {
    super("INVALID_SHARD", `shard must be an integer in 0..2^32-1, got ${String(shard)}`);
  }
}

/** Shards are numbered 0..2^32-1. */
export function assertShard(shard: unknown): number {
  if (typeof shard !== "number" || !Number.isInteger(shard) || shard < 0 || shard > 0xffffffff) {
    throw new InvalidShardError(shard);
  }
  return shard;
}

export function shardStream(shard: number): string {
  return `MBX_${assertShard(shard)}`;
}

/** All subjects of a shard stream. */
export function shardSubjects(shard: number): string {
  return `mbx.${assertShard(shard)}.>`;
}

/** Subject of one entry: `mbx.<shard>.<user>.<lane>`. */
export function entrySubject(shard: number, user: string, lane: string): string {
  return `mbx.${assertShard(shard)}.${assertId("user", user)}.${assertId("lane", lane)}`;
}

/** Every lane of one user in a shard stream (for filtered reads). */
export function userSubjects(shard: number, user: string): string {
  return `mbx.${assertShard(shard)}.${assertId("user", user)}.*`;
}

/** Parses `mbx.<shard>.<user>.<lane>`; undefined for anything else. */
export function parseEntrySubject(subject: string): { shard: number; user: string; lane: string } | undefined {
  const parts = subject.split(".");
  if (parts.length !== 4 || parts[0] !== "mbx") return undefined;
  const [, s, user, lane] = parts as [string, string, string, string];
  const shard = Number(s);
  if (!/^\d+$/.test(s) || shard > 0xffffffff) return undefined;
  return { shard, user, lane };
}

/** Core NATS subject of a user's live pushes. */
export function pushSubject(user: string): string {
  return `push.${assertId("user", user)}`;
}

/** Upstream subject of a device's SEND frames. */
export function ingressSubject(user: string, device: string): string {
  return `in.${assertId("user", user)}.${assertId("device", device)}`;
}

/** Nats-Msg-Id of a mailbox entry: `<dispatch_id>:<user>`. */
export function entryMsgId(dispatchId: string, user: string): string {
  return `${assertId("dispatch", dispatchId)}:${assertId("user", user)}`;
}

/** Nats-Msg-Id of an upstream SEND: the idempotency triple `<user>:<device>:<cmid>`. */
export function ingressMsgId(user: string, device: string, cmid: string): string {
  return `${assertId("user", user)}:${assertId("device", device)}:${assertId("cmid", cmid)}`;
}
