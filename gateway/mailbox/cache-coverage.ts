/**
 * What a user's hot cache proves, read from its rows alone (docs/design.md, "Nothing is lost": any
 * Redis key may vanish on its own, so a fact about the cache lives in the cache). Each row carries `prevAll`, the
 * user's previous seq over all lanes when the worker wrote it. A row whose `prevAll` is at or below
 * the position before it says "no entry of the user lies between them": a run of such rows, starting
 * at a reader's `after`, holds every entry of the user in its range. A missing key gives no rows, a
 * trimmed cache starts with a row whose `prevAll` lies past `after`, a row written while the
 * watermark hash was gone has no `prevAll`: each is a break, never "nothing there".
 *
 * Pure: the reader (gateway/mailbox/reader.ts) gives the rows and asks the stream about a break.
 */
import type { MailboxSeq } from "../../protocol/index.js";

export interface ChainRow {
  seq: MailboxSeq;
  /** The user's seq before this row's entry; null when the worker did not know it. */
  prevAll: MailboxSeq | null;
  /** The shard whose log holds it (a moved user's cache mixes parent and child rows). */
  shard: number;
}

export type ChainStop =
  /** Every entry of the user up to the target is among the kept rows. */
  | { type: "complete" }
  /** The rows ran out before the target: the cache says nothing past `at`. */
  | { type: "rows_end" }
  /**
   * Row `index` does not follow on from `at` (no `prevAll`, or one past `at`): the stream can say
   * whether anything lies between. A row of another shard is never vouched for: its XADD and this
   * shard's can fail behind each other.
   */
  | { type: "break"; index: number; vouchable: boolean };

export interface Chain<R extends ChainRow> {
  /** Rows proven to hold every entry of the user in (after, at], oldest first. */
  kept: R[];
  /** The seq up to which the kept rows are complete (`after` when none). */
  at: MailboxSeq;
  stop: ChainStop;
}

/**
 * The longest run of `rows` (seq above `after`, increasing) that provably holds every entry of the
 * user in `shard` with seq in (after, target]. `firstVouched`: the stream has shown that nothing lies
 * between `after` and the first row, whatever its `prevAll` says.
 */
export function followChain<R extends ChainRow>(rows: readonly R[], shard: number, after: MailboxSeq, target: MailboxSeq, firstVouched = false): Chain<R> {
  const kept: R[] = [];
  let at = after;
  for (let i = 0; i < rows.length && at < target; i++) {
    const r = rows[i]!;
    if (r.seq <= at) continue;
    const follows = r.shard === shard && ((i === 0 && firstVouched) || (r.prevAll !== null && r.prevAll <= at && r.prevAll < r.seq));
    if (!follows) return { kept, at, stop: { type: "break", index: i, vouchable: r.shard === shard } };
    // a row past the target that follows on says nothing lies between `at` and it
    if (r.seq > target) return { kept, at, stop: { type: "complete" } };
    kept.push(r);
    at = r.seq;
  }
  return { kept, at, stop: at >= target ? { type: "complete" } : { type: "rows_end" } };
}
