/**
 * The release of stopped runners' epochs: one registry record for every shard a worker gives back
 * at once. One record per shard raced: the records of a worker stopping its four shards after a
 * NATS stall were written together, each retried on the others' conflicts, one landed within the
 * timeout and the rest fell back to the fenced path (+1 epoch each on their next owner).
 */
import { registryRecord, releaseEpoch } from "../protocol/index.js";
import type { RegistryView } from "./shard-ports.js";

export type ReleaseOutcome = { outcome: "released" | "fenced" | "failed"; epoch?: number; offset: number; error?: string };

/** A stopped runner's epoch (undefined: it never ran) and the last offset it finished. */
export interface Stopped {
  shard: number;
  epoch: number | undefined;
  offset: number;
}

/**
 * Records that `worker` gave each shard's epoch back at its offset, in one record; within
 * `timeoutMs` (after it the epochs stay claimed: each next owner bumps). A shard whose epoch is no
 * longer this worker's is `fenced` and left out of the record.
 */
export async function writeRelease(registry: Pick<RegistryView, "update">, worker: string, stopped: readonly Stopped[], timeoutMs: number): Promise<Map<number, ReleaseOutcome>> {
  const out = new Map<number, ReleaseOutcome>();
  const mine = (state: RegistryView["state"], s: Stopped) => {
    const now = state.shards.get(s.shard);
    return s.epoch !== undefined && now !== undefined && now.epoch === s.epoch && now.owner === worker ? now : undefined;
  };
  let timer: NodeJS.Timeout | undefined;
  try {
    const write = registry.update((state) => {
      const released = stopped.flatMap((s) => {
        const now = mine(state, s);
        return now === undefined ? [] : [releaseEpoch(now, worker, s.offset)];
      });
      return released.length === 0 ? null : registryRecord("release", worker, released);
    });
    // a write that answers after the timeout must not become an unhandled rejection
    write.catch(() => undefined);
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`no answer from the registry within ${timeoutMs} ms`)), timeoutMs);
    });
    const written = await Promise.race([write, timeout]);
    for (const s of stopped) {
      const at = { ...(s.epoch !== undefined ? { epoch: s.epoch } : {}), offset: s.offset };
      const now = written?.state.shards.get(s.shard);
      if (now !== undefined && now.epoch === s.epoch && now.owner === null && now.released_offset === s.offset) out.set(s.shard, { outcome: "released", ...at });
      // appended, but not applied: a registry of an older version refuses the record
      else if (now !== undefined && now.epoch === s.epoch && now.owner === worker) out.set(s.shard, { outcome: "failed", ...at, error: "the release record was not applied" });
      else out.set(s.shard, { outcome: "fenced", ...at });
    }
  } catch (err) {
    for (const s of stopped) out.set(s.shard, { outcome: "failed", ...(s.epoch !== undefined ? { epoch: s.epoch } : {}), offset: s.offset, error: (err as Error).message });
  } finally {
    clearTimeout(timer);
  }
  return out;
}
