/**
 * Bytes a session sends that other sessions send too, encoded once: an entry shared by every
 * session it fans out to (the hub hands them the same Entry object), and a live MSGS frame of one
 * user's pushes for all of that user's sessions that send every one of them. A user with one
 * session here gets its frame written in one pass (liveFrame), with no cache to keep: the caches
 * are WeakMaps, whose entries the garbage collector pays for on every young collection.
 */
import { encodeEntry, encodeLiveMsgsFrame, type Entry, type Push } from "../../protocol/index.js";

const encodings = new WeakMap<Entry, Uint8Array>();

export function encodedOnce(e: Entry): Uint8Array {
  let b = encodings.get(e);
  if (b === undefined) encodings.set(e, (b = encodeEntry(e)));
  return b;
}

/** The MSGS frame of every one of `pushes`, for one session. */
export function liveFrame(pushes: readonly Push[], shard: number): Uint8Array {
  return encodeLiveMsgsFrame(shard, pushes.length, (i) => pushes[i]!.entry);
}

const liveFrames = new WeakMap<readonly Push[], Uint8Array>();

/** The same, encoded once for every session of the user that sends them all. */
export function sharedFrame(pushes: readonly Push[], shard: number): Uint8Array {
  let b = liveFrames.get(pushes);
  if (b === undefined) liveFrames.set(pushes, (b = liveFrame(pushes, shard)));
  return b;
}
