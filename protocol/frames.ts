/**
 * Wire protocol v1 frames (docs/protocol.md; versions side by side: docs/design.md, "Rollout
 * compatibility"): one msgpack map per binary WebSocket frame, `t` names it.
 *
 * Frames from devices are untrusted: their schemas are strict (unknown keys are an error, so an
 * extension value or a smuggled key cannot ride along). Frames from the gateway are parsed
 * leniently by the SDK (unknown keys are dropped) so a newer gateway can add fields.
 */
import { z } from "zod";
import { idSchema } from "./ids.js";
import { U64_MAX, MAX_EPOCH } from "./seq.js";

export const PROTOCOL_VERSION = 1;
/** Largest entry or SEND body, in bytes. Gateways may configure a lower limit, never a higher one. */
export const MAX_BODY_BYTES = 256 * 1024;
/** Largest device JWT, in characters. */
export const MAX_TOKEN_LENGTH = 8192;
/** Lanes a device may name in AUTH. */
export const MAX_LANES = 32;
/** Largest PULL page. */
export const MAX_PULL_LIMIT = 1000;
/** Length of a cursor signature (truncated HMAC-SHA256). */
export const CURSOR_SIG_BYTES = 16;

/** A u64 from any msgpack unsigned int width, normalised to bigint. */
export const u64 = z.union([
  z.bigint().min(0n, "must not be negative").max(U64_MAX, "must fit in 64 bits"),
  z.number().int("must be an integer").min(0, "must not be negative").max(Number.MAX_SAFE_INTEGER).transform(BigInt),
]);
const u32 = z.number().int("must be an integer").min(0, "must not be negative").max(0xffffffff, "must fit in 32 bits");
const shard = u32;
const epoch = z.number().int("must be an integer").min(0, "must not be negative").max(MAX_EPOCH, "must fit in 16 bits");
const bytes = (max: number) =>
  z.instanceof(Uint8Array, { message: "must be bytes (msgpack bin)" }).refine((b) => b.byteLength <= max, {
    message: `must be at most ${max} bytes`,
  });
const sig = z
  .instanceof(Uint8Array, { message: "must be bytes (msgpack bin)" })
  .refine((b) => b.byteLength === CURSOR_SIG_BYTES, { message: `must be ${CURSOR_SIG_BYTES} bytes` });
const lane = idSchema("lane");
/** Milliseconds since the Unix epoch; above 2^32 it travels as uint64, which decodes as bigint. */
const timestamp = z.union([
  z.number().int("must be an integer").min(0, "must not be negative").max(Number.MAX_SAFE_INTEGER),
  z.bigint().min(0n, "must not be negative").max(BigInt(Number.MAX_SAFE_INTEGER)).transform(Number),
]);

// ---- device -> gateway -------------------------------------------------------------------------

/** A cursor as the device sends it back: the signed token plus its last applied seq. */
export const DeviceCursorSchema = z.strictObject({
  shard,
  epoch,
  log: idSchema("log"),
  seq: u64,
  sig,
});

export const AuthFrameSchema = z.strictObject({
  t: z.literal("AUTH"),
  v: z.literal(PROTOCOL_VERSION, { message: `protocol version must be ${PROTOCOL_VERSION}` }),
  token: z.string().min(1).max(MAX_TOKEN_LENGTH),
  device: idSchema("device"),
  cursor: DeviceCursorSchema.optional(),
  lanes: z
    .array(lane)
    .min(1)
    .max(MAX_LANES)
    .refine((l) => new Set(l).size === l.length, { message: "lanes must be unique" })
    .optional(),
});

export const AckFrameSchema = z.strictObject({ t: z.literal("ACK"), seq: u64 });

export const PullFrameSchema = z.strictObject({
  t: z.literal("PULL"),
  id: u32,
  after: u64,
  limit: z.number().int().min(1).max(MAX_PULL_LIMIT),
  lane: lane.optional(),
});

export const SendFrameSchema = z.strictObject({
  t: z.literal("SEND"),
  id: u32,
  cmid: idSchema("cmid"),
  b: bytes(MAX_BODY_BYTES),
});

export const PingFrameSchema = z.strictObject({ t: z.literal("PING"), id: u32.optional() });

/** A fresh device JWT for the live session, before the one it authenticated with expires. */
export const RefreshFrameSchema = z.strictObject({ t: z.literal("REFRESH"), id: u32.optional(), token: z.string().min(1).max(MAX_TOKEN_LENGTH) });

export const ClientFrameSchema = z.discriminatedUnion("t", [
  AuthFrameSchema,
  AckFrameSchema,
  PullFrameSchema,
  SendFrameSchema,
  PingFrameSchema,
  RefreshFrameSchema,
]);

export type DeviceCursor = z.output<typeof DeviceCursorSchema>;
export type AuthFrame = z.output<typeof AuthFrameSchema>;
export type AckFrame = z.output<typeof AckFrameSchema>;
export type PullFrame = z.output<typeof PullFrameSchema>;
export type SendFrame = z.output<typeof SendFrameSchema>;
export type PingFrame = z.output<typeof PingFrameSchema>;
export type RefreshFrame = z.output<typeof RefreshFrameSchema>;
export type ClientFrame = z.output<typeof ClientFrameSchema>;
/** The device frames' type names, read off the union (a new frame's schema adds its name). */
export const CLIENT_FRAME_TYPES: readonly ClientFrame["t"][] = ClientFrameSchema.options.map((o) => o.shape.t.value);

// ---- gateway -> device -------------------------------------------------------------------------

/** A cursor token as the gateway issues it: (shard, epoch, log) and the server's signature. */
export const CursorTokenSchema = z.object({ shard, epoch, log: idSchema("log"), sig });

export const EntrySchema = z.object({
  seq: u64,
  /** message_id: what devices dedup by. */
  id: idSchema("message"),
  lane,
  /** Previous seq in the same user lane; null when the worker could not know it. */
  prev: u64.nullable(),
  ts: timestamp,
  b: bytes(MAX_BODY_BYTES),
});

export const AuthOkFrameSchema = z.object({
  t: z.literal("AUTH_OK"),
  session: idSchema("session"),
  user: idSchema("user"),
  shard,
  epoch,
  cursor: CursorTokenSchema,
  /** The device's last applied seq as the server takes it: catch-up sends what is above it. */
  from: u64,
  /** Highest seq of this user's mailbox when AUTH was answered. */
  head: u64,
  /** Trim watermark of the shard: entries at or below it may be gone. */
  trim: u64,
  /** Highest seq per lane. */
  lanes: z.record(lane, u64),
  /** Heartbeat interval in ms: send PING at least this often. */
  hb: z.number().int().min(0),
});

/** Most split hops one CURSOR_REBASED describes (a registry loop is refused long before). */
export const MAX_OLD_RANGES = 64;

/**
 * One range of an older shard a moved user still has to receive: its entries with seq in
 * (after, until], in that shard's numbering. `cursor` is that shard's token: a device that stops
 * inside the range resumes with it, so its stored token and seq always share one numbering.
 */
export const OldRangeSchema = z.object({ shard, after: u64, until: u64, cursor: CursorTokenSchema.optional() });

export const ErrorFrameSchema = z.object({
  t: z.literal("ERROR"),
  code: z.string().min(1).max(64),
  msg: z.string().max(1024),
  fatal: z.boolean(),
  id: u32.optional(),
  new_cursor: CursorTokenSchema.optional(),
  replay_from_seq: u64.optional(),
  /** Every split hop, in order (P -> C1 -> C2 ...); the new shard follows from replay_from_seq. */
  old_ranges: z.array(OldRangeSchema).max(MAX_OLD_RANGES).optional(),
  /** The first hop alone, for SDKs older than `old_ranges`; gateways send both. */
  old_range: OldRangeSchema.optional(),
  trim_watermark: u64.optional(),
  rebuild_required: z.boolean().optional(),
  retry_ms: z.number().int().min(0).optional(),
});

export const MsgsFrameSchema = z.object({
  t: z.literal("MSGS"),
  shard,
  e: z.array(EntrySchema),
  id: u32.optional(),
  more: z.boolean().optional(),
});

export const SyncedFrameSchema = z.object({ t: z.literal("SYNCED"), seq: u64 });
export const SendOkFrameSchema = z.object({ t: z.literal("SEND_OK"), id: u32, cmid: idSchema("cmid"), dup: z.boolean() });
export const PongFrameSchema = z.object({ t: z.literal("PONG"), id: u32.optional() });
/** The session now runs on the refreshed token, until `exp` (ms since the epoch). */
export const RefreshOkFrameSchema = z.object({ t: z.literal("REFRESH_OK"), id: u32.optional(), exp: timestamp });
export const GoawayFrameSchema = z.object({ t: z.literal("GOAWAY"), reason: z.string().max(256), retry_ms: z.number().int().min(0) });

export const ServerFrameSchema = z.discriminatedUnion("t", [
  AuthOkFrameSchema,
  ErrorFrameSchema,
  MsgsFrameSchema,
  SyncedFrameSchema,
  SendOkFrameSchema,
  PongFrameSchema,
  GoawayFrameSchema,
  RefreshOkFrameSchema,
]);

export type CursorToken = z.output<typeof CursorTokenSchema>;
export type Entry = z.output<typeof EntrySchema>;
export type AuthOkFrame = z.output<typeof AuthOkFrameSchema>;
export type OldRange = z.output<typeof OldRangeSchema>;
export type ErrorFrame = z.output<typeof ErrorFrameSchema>;
export type MsgsFrame = z.output<typeof MsgsFrameSchema>;
export type SyncedFrame = z.output<typeof SyncedFrameSchema>;
export type SendOkFrame = z.output<typeof SendOkFrameSchema>;
export type PongFrame = z.output<typeof PongFrameSchema>;
export type GoawayFrame = z.output<typeof GoawayFrameSchema>;
export type RefreshOkFrame = z.output<typeof RefreshOkFrameSchema>;
export type ServerFrame = z.output<typeof ServerFrameSchema>;
/** The gateway frames' type names, read off the union. */
export const SERVER_FRAME_TYPES: readonly ServerFrame["t"][] = ServerFrameSchema.options.map((o) => o.shape.t.value);
