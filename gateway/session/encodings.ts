/**
 * Bytes a session sends that other sessions send too, encoded once: an entry shared by every
 * session it fans out to (the hub hands them the same Entry object), and a live MSGS frame of one
 * user's pushes for all of that user's sessions that send every one of them.
 */
import { encodeEntry, encodeMsgsFrame, type Entry, type Push } from "../../protocol/index.js";

const encodings = new WeakMap<Entry, Uint8Array>();

export function encodedOnce(e: Entry): Uint8Array {
  let b = encodings.get(e);
  if (b === undefined) encodings.set(e, (b = encodeEntry(e)));
  return b;
}

const liveFrames = new WeakMap<readonly Push[], Uint8Array>();

export function sharedFrame(pushes: readonly Push[], shard: number): Uint8Array {
  let b = liveFrames.get(pushes);
  if (b === undefined) liveFrames.set(pushes, (b = encodeMsgsFrame(shard, pushes.map((p) => encodedOnce(p.entry)))));
  return b;
}
