/**
 * User -> 32-bit hash, the coordinate that shard ranges partition (explicit partitioning: never a
 * broker-side key hash). Documented in docs/registry.md so producers in any language can compute it:
 *
 *   userHash(user) = first 4 bytes, big-endian, of SHA-256(UTF-8 bytes of the user id)
 */
import { sha256 } from "@noble/hashes/sha2.js";
import { assertId } from "./ids.js";

export const HASH_SPACE = 2 ** 32;

const utf8 = new TextEncoder();

/** Recent users' hashes: a dispatch hashes every recipient, and the same users come back. */
const recent = new Map<string, number>();
const RECENT_MAX = 100_000;

export function userHash(user: string): number {
  const known = recent.get(user);
  if (known !== undefined) return known;
  assertId("user", user);
  // a pure-JS digest (@noble/hashes): the pure core imports no Node module; the cache above makes its cost rare
  const d = sha256(utf8.encode(user));
  const h = ((d[0]! << 24) | (d[1]! << 16) | (d[2]! << 8) | d[3]!) >>> 0;
  if (recent.size >= RECENT_MAX) recent.clear();
  recent.set(user, h);
  return h;
}

/**
 * A hash range as people read it, the same in the CLI and the console: both ends in hex, eight
 * digits each (`0x00000000-0x7fffffff`), so the shares of a split line up.
 */
export function rangeLabel(range: { lo: number; hi: number }): string {
  const hex = (v: number) => `0x${v.toString(16).padStart(8, "0")}`;
  return `${hex(range.lo)}-${hex(range.hi)}`;
}

/** A count or an epoch as people read it: `65,535`. */
export function countLabel(n: number): string {
  return n.toLocaleString("en-US");
}
