/**
 * User -> 32-bit hash, the coordinate that shard ranges partition (explicit partitioning: never a
 * broker-side key hash). Documented in docs/registry.md so producers in any language can compute it:
 *
 *   userHash(user) = first 4 bytes, big-endian, of SHA-256(UTF-8 bytes of the user id)
 */
import { createHash } from "node:crypto";
import { assertId } from "./ids.js";

export const HASH_SPACE = 2 ** 32;

export function userHash(user: string): number {
  return createHash("sha256").update(assertId("user", user), "utf8").digest().readUInt32BE(0);
}
