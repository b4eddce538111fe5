/**
 * Cursor tokens: the server's signature over (user, shard, epoch, log).
 *
 * The signature binds the log (stream generation id), not only the epoch: after a failover to a
 * registry copy that lagged, one epoch number can name two different logs (docs/design.md, "Cursors").
 * Keys rotate: sign with the first key, accept any key of the list. Node-only (node:crypto), so in protocol/io;
 * devices never verify cursors, they only hand them back.
 */
import { createHmac, timingSafeEqual } from "node:crypto";
import { JetgateError } from "../errors.js";
import { CURSOR_SIG_BYTES, type CursorToken } from "../frames.js";
import { assertId } from "../ids.js";
import { assertShard } from "../subjects.js";
import { MAX_EPOCH } from "../seq.js";

export class CursorKeyError extends JetgateError {
  constructor(message: string) {
    super("CURSOR_KEY", message);
  }
}

/** Minimum key length: HMAC-SHA256 keys shorter than 32 bytes weaken the tag. */
export const MIN_CURSOR_KEY_BYTES = 32;

export interface CursorSigner {
  sign(user: string, shard: number, epoch: number, log: string): CursorToken;
  /** True when `sig` is a valid signature of (user, shard, epoch, log) under any configured key. */
  verify(user: string, token: { shard: number; epoch: number; log: string; sig: Uint8Array }): boolean;
}

function message(user: string, shard: number, epoch: number, log: string): Buffer {
  assertId("user", user);
  assertId("log", log);
  assertShard(shard);
  if (!Number.isInteger(epoch) || epoch < 0 || epoch > MAX_EPOCH) throw new CursorKeyError(`bad epoch ${epoch}`);
  // Ids are [A-Za-z0-9_-], so a NUL separator cannot be forged by an id; the version prefix keeps
  // tokens of a future layout from verifying as these.
  return Buffer.from(`jetgate-cursor-v1\0${user}\0${shard}\0${epoch}\0${log}`, "utf8");
}

function tag(key: Uint8Array, msg: Buffer): Buffer {
  return createHmac("sha256", key).update(msg).digest().subarray(0, CURSOR_SIG_BYTES);
}

/** A signer over a key list (newest first). Throws CursorKeyError on an empty list or a short key. */
export function cursorSigner(keys: readonly Uint8Array[]): CursorSigner {
  if (keys.length === 0) throw new CursorKeyError("at least one cursor key is required");
  for (const [i, k] of keys.entries()) {
    if (k.byteLength < MIN_CURSOR_KEY_BYTES) {
      throw new CursorKeyError(`cursor key ${i} has ${k.byteLength} bytes; at least ${MIN_CURSOR_KEY_BYTES} are required`);
    }
  }
  const [first] = keys as [Uint8Array, ...Uint8Array[]];
  return {
    sign(user, shard, epoch, log) {
      return { shard, epoch, log, sig: new Uint8Array(tag(first, message(user, shard, epoch, log))) };
    },
    verify(user, token) {
      if (token.sig.byteLength !== CURSOR_SIG_BYTES) return false;
      let msg: Buffer;
      try {
        msg = message(user, token.shard, token.epoch, token.log);
      } catch {
        return false;
      }
      let ok = false;
      // Check every key (no early exit) so timing does not tell which key matched.
      for (const k of keys) ok = timingSafeEqual(tag(k, msg), token.sig) || ok;
      return ok;
    },
  };
}
