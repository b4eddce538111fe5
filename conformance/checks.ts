/**
 * What every scenario checks of a device's events (docs/conformance.md, "What every scenario
 * checks"): pure functions over the event log and what the kit dispatched, apart from I/O.
 */

/** One entry the kit dispatched: its message id and where the dispatch said it landed. */
export interface Dispatched {
  id: string;
  shard: number;
  seq: bigint;
}

/** The part of an event the checks read. */
export interface LoggedEvent {
  ev: string;
  life: number;
  seq?: unknown;
  id?: unknown;
}

export interface CheckOptions {
  /** Ids the server declared gone (a CURSOR_EXPIRED's retention): not required, never expected after the rebuild. */
  gone?: ReadonlySet<string>;
  /**
   * Repeats in a later life are the documented cost of the case (docs/design.md: a cursor the
   * gateway cannot place, as on a new log, costs repeats, not entries; the SDK drops them by
   * message id while it remembers them, and a restarted process remembers none).
   */
  repeatsAcrossLives?: boolean;
}

/** A broken promise, named for the report. */
export interface Violation {
  check: "once" | "order" | "lost" | "unknown";
  detail: string;
}

/**
 * The checks over a whole log. A `cursor_invalid` or `rebuild` event starts a new generation: the
 * server told the device its state is gone, so it starts over and what it applied before may come
 * again. Within a life and generation each id is applied once, and per shard seqs only go up. An
 * id applied in an earlier life may come again only where that life crashed before the cursor
 * past it was stored (its seq above the life's last `cursor` event), or where the case allows it
 * (`repeatsAcrossLives`). Every dispatched id must have been applied, except those `gone`; after a
 * CURSOR_INVALID (a replay from the mailbox's start) the last generation must hold them all.
 */
export function checkLog(events: readonly LoggedEvent[], dispatched: readonly Dispatched[], opts: CheckOptions = {}): Violation[] {
  const out: Violation[] = [];
  const byId = new Map(dispatched.map((d) => [d.id, d]));
  const stopped = new Set(events.filter((e) => e.ev === "stopped").map((e) => e.life));
  const lastStored = new Map<number, bigint>();
  /** Where each id was first applied in this generation. */
  let applied = new Map<string, { life: number; seq: bigint }>();
  let lastByShard = new Map<number, bigint>();
  let life = 0;
  const everApplied = new Set<string>();
  let resetByInvalid = false;
  for (const e of events) {
    if (e.life !== life) {
      // a new life resumes from its stored cursor: order is checked within a life
      life = e.life;
      lastByShard = new Map();
    }
    if (e.ev === "cursor") {
      lastStored.set(e.life, BigInt(String(e.seq)));
      continue;
    }
    if (e.ev === "cursor_invalid" || e.ev === "rebuild") {
      applied = new Map();
      lastByShard = new Map();
      if (e.ev === "cursor_invalid") resetByInvalid = true;
      continue;
    }
    if (e.ev !== "entry") continue;
    const id = String(e.id);
    const seq = BigInt(String(e.seq));
    const d = byId.get(id);
    if (d === undefined) {
      out.push({ check: "unknown", detail: `entry ${id} (seq ${seq}, life ${e.life}) was never dispatched` });
      continue;
    }
    const before = applied.get(id);
    if (before !== undefined) {
      const crashedUnstored = before.life < e.life && !stopped.has(before.life) && before.seq > (lastStored.get(before.life) ?? -1n);
      const allowed = before.life < e.life && (crashedUnstored || opts.repeatsAcrossLives === true);
      if (!allowed) {
        const why = before.life === e.life ? "in one life" : stopped.has(before.life) ? `after life ${before.life} stopped cleanly` : `after life ${before.life} had stored a cursor at or past it (${lastStored.get(before.life)})`;
        out.push({ check: "once", detail: `entry ${id} applied twice (seq ${before.seq} in life ${before.life}, seq ${seq} in life ${e.life}): ${why}` });
      }
    } else {
      applied.set(id, { life: e.life, seq });
    }
    everApplied.add(id);
    const last = lastByShard.get(d.shard);
    if (last !== undefined && seq <= last) out.push({ check: "order", detail: `entry ${id} of shard ${d.shard}: seq ${seq} after ${last} (life ${e.life})` });
    lastByShard.set(d.shard, seq);
  }
  // after CURSOR_INVALID the device replays from the start: the last generation must hold everything
  const mustHold = resetByInvalid ? new Set(applied.keys()) : everApplied;
  const missing = dispatched.filter((d) => !mustHold.has(d.id) && !(opts.gone?.has(d.id) ?? false));
  if (missing.length > 0) out.push({ check: "lost", detail: `${missing.length} of ${dispatched.length} entries never applied${resetByInvalid ? " after the fresh start" : ""}: ${missing.slice(0, 5).map((d) => `${d.id} (shard ${d.shard}, seq ${d.seq})`).join(", ")}${missing.length > 5 ? ", ..." : ""}` });
  return out;
}
