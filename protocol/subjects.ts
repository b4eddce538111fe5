/** NATS subject and stream names. Every id is validated before it becomes part of a subject. */
import { assertId } from "./ids.js";
import { JetgateError } from "./errors.js";

export const REGISTRY_STREAM = "JETGATE_REGISTRY";
export const REGISTRY_SUBJECT = "jetgate.registry";
export const INGRESS_STREAM = "INGRESS";
export const INGRESS_SUBJECTS = "in.>";
/** Where workers record each epoch's processing floor (protocol/layout.ts, FloorRecord): one subject per shard and epoch. */
export const FLOORS_STREAM = "JETGATE_FLOORS";
export const FLOORS_SUBJECTS = "jetgate.floor.>";

/** The floor record of `shard` under `epoch`. */
export function floorSubject(shard: number, epoch: number): string {
  return `jetgate.floor.${assertShard(shard)}.${epoch}`;
}

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

/**
 * Core NATS subject of the live pushes routed to one gateway: batches of every entry of the users
 * with sessions there (the workers learn where from the users' watermark hashes).
 */
export function routedPushSubject(gateway: string): string {
  return `jetgate.push.gw.${assertId("gateway", gateway)}`;
}

/**
 * Pushes of users whose routes Redis did not have (a new, expired, evicted or flushed hash): every
 * gateway reads them, and those holding the user register again. One token fewer than a
 * gateway's subject, so no gateway id can name it.
 */
export const BROADCAST_PUSH_SUBJECT = "jetgate.push.any";

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

/** Where a gateway is told to close one of its sessions that a newer one of its device replaced (gateway/hub/presence.ts). */
export function kickSubject(gateway: string): string {
  return `jetgate.kick.${assertId("gateway", gateway)}`;
}

/** Subject a shard stream is moved to during a rebuild, so nothing more is appended to it (worker/shard-ops.ts). */
export function frozenSubject(shard: number): string {
  return `jetgate.frozen.${assertShard(shard)}`;
}

/** The operator console's request for every process's counts (protocol/io/ops-stats.ts); jetgate's NATS user only. */
export const OPS_STATS_SUBJECT = "jetgate.ops.stats";

/** Every gateway's live pushes, routed and broadcast: what a listener to all of them subscribes to (tests, debugging). */
export const ALL_PUSH_SUBJECTS = "jetgate.push.>";

/**
 * Requests from the gateway that took a backend's call (HTTP, service token) to every gateway, each
 * answering with what it did or holds (NATS request, many replies). jetgate's own NATS user only
 * (docs/examples/nats-permissions.conf): a backend cannot publish on jetgate.>.
 */
export const CONTROL_SUBJECTS = {
  /** End a user's (or one device's) sessions with a close code the SDK understands. */
  disconnect: "jetgate.ctl.disconnect",
  /** A token revocation: remember it, and end the live sessions it covers. */
  revoke: "jetgate.ctl.revoke",
  /** Which devices of these users have a live session here, and since when. */
  presence: "jetgate.ctl.presence",
  /** Every gateway says it is there, each GATEWAY_LIVENESS.beatEveryMs: whom the requests above wait for (gateway/http/roster.ts). */
  beat: "jetgate.ctl.beat",
} as const;
