/**
 * A backend's read of a user's mailbox (GET /v1/users/{user}/entries), a page at a time, answered
 * as a device's AUTH is: the position (`next`, a cursor token this API signed) goes through the
 * same gather-and-decide (gateway/mailbox/gather.ts, gateway/mailbox/auth-decision.ts), so a position from before
 * an epoch change, a rebuild, a split or retention gets the case a device would get (rebased,
 * rebased onto a new log, moved by a split, expired, invalid) and the same entries after it: a
 * split's old ranges first, then the user's shard. Bounded per request: at most `limit` entries
 * and about MAX_PAGE_BYTES of bodies.
 */
import { z } from "zod";
import { composeSeq, idSchema, seqEpoch, seqOffset, type Entry, type MailboxSeq } from "../../protocol/index.js";
import { type CursorSigner } from "../../protocol/io/index.js";
import type { AuthDecision, CursorIn } from "./auth-decision.js";
import { gatherAndDecide } from "./gather.js";
import type { MailboxSource, RegistryView } from "../ports.js";

/** Entries one page may hold at most, and by default. */
export const MAX_PAGE_ENTRIES = 1000;
export const DEFAULT_PAGE_ENTRIES = 100;
/** Bodies one page carries at most (the entry that crosses it is the page's last). */
export const MAX_PAGE_BYTES = 4 * 1024 * 1024;

/** A position in a user's mailbox as the API hands it out: a cursor token (signed for this user) and the seq. */
const PositionSchema = z.strictObject({
  shard: z.number().int().min(0).max(0xffffffff),
  epoch: z.number().int().min(0).max(65535),
  log: idSchema("log"),
  seq: z.string().regex(/^\d{1,20}$/),
  sig: z.string().regex(/^[A-Za-z0-9_-]{1,200}$/),
});

export class BadPositionError extends Error {}

export function encodePosition(signer: CursorSigner, user: string, shard: number, epoch: number, log: string, seq: MailboxSeq): string {
  const t = signer.sign(user, shard, epoch, log);
  return Buffer.from(JSON.stringify({ shard, epoch, log, seq: seq.toString(), sig: Buffer.from(t.sig).toString("base64url") })).toString("base64url");
}

/** The cursor a `next` stands for; `sigValid` false for one signed for another user or with an unknown key. */
export function decodePosition(signer: CursorSigner, user: string, next: string): CursorIn {
  let raw: unknown;
  try {
    if (!/^[A-Za-z0-9_-]{1,1000}$/.test(next)) throw new Error("not base64url");
    raw = JSON.parse(Buffer.from(next, "base64url").toString("utf8"));
  } catch {
    throw new BadPositionError("next: not a position this API gave out");
  }
  const p = PositionSchema.safeParse(raw);
  if (!p.success) throw new BadPositionError("next: not a position this API gave out");
  const sig = new Uint8Array(Buffer.from(p.data.sig, "base64url"));
  const seq = BigInt(p.data.seq);
  if (seq >= 1n << 64n) throw new BadPositionError("next: not a position this API gave out");
  const { shard, epoch, log } = p.data;
  return { shard, epoch, log, seq, sigValid: signer.verify(user, { shard, epoch, log, sig }) };
}

export interface PageEntry {
  seq: string;
  id: string;
  lane: string;
  ts: number;
  body_b64: string;
}

export interface Page {
  /** How the position was taken, as for a device's AUTH (`fresh` without one). */
  case: AuthDecision["case"];
  /** Why, for `expired` and `invalid`. */
  reason?: string;
  /** `expired`: the seq of the newest entry retention removed; entries resume at the head. */
  trim?: string;
  entries: PageEntry[];
  /** Where the next page starts: pass it as `next`. Also when `more` is false (poll with it later). */
  next: string;
  /** True when the page stopped at `limit` or the byte bound: more entries may follow at once. */
  more: boolean;
}

export interface PageDeps {
  registry: RegistryView;
  mailbox: MailboxSource;
  cursors: CursorSigner;
}

/** One page of `user`'s mailbox after `position` (none: from the start). */
export async function readPage(d: PageDeps, user: string, position: CursorIn | undefined, opts: { limit: number; lane?: string }): Promise<Page> {
  const g = await gatherAndDecide(d.registry, d.mailbox, user, position);
  const dec = g.decision;
  const ranges = dec.case === "split" ? dec.oldRanges : [];
  const out: PageEntry[] = [];
  let bytes = 0;
  let full = false;
  // where the page ends: the last entry read (a lane filter may leave it out) or the start
  let at: { shard: number; seq: MailboxSeq } = { shard: dec.shard, seq: dec.from };
  const take = async (shard: number, after: MailboxSeq, until: MailboxSeq | undefined): Promise<void> => {
    at = { shard, seq: after };
    // entries read, not only those of the lane asked for: a read cut at its limit may have more
    const want = opts.limit - out.length;
    let read = 0;
    for await (const page of d.mailbox.read(shard, user, after, { limit: want, ...(until !== undefined ? { until } : {}) })) {
      for (const e of page.entries) {
        at = { shard, seq: e.seq };
        read++;
        if (opts.lane === undefined || e.lane === opts.lane) add(e);
        if (out.length >= opts.limit || bytes >= MAX_PAGE_BYTES || read >= want) {
          full = true;
          return;
        }
      }
    }
  };
  const add = (e: Entry) => {
    out.push({ seq: e.seq.toString(), id: e.id, lane: e.lane, ts: e.ts, body_b64: Buffer.from(e.b).toString("base64") });
    bytes += e.b.byteLength;
  };
  for (const r of ranges) {
    await take(r.shard, r.after, r.until);
    if (full) break;
    // an old range read to its end: the page goes on in the next range (its end is the position)
    at = { shard: r.shard, seq: r.until };
  }
  if (!full) await take(dec.shard, dec.from, undefined);
  const s = g.view.shards.get(at.shard)!;
  return {
    case: dec.case,
    ...(dec.case === "expired" || dec.case === "invalid" ? { reason: dec.reason } : {}),
    ...(dec.case === "expired" ? { trim: dec.trim.toString() } : {}),
    entries: out,
    next: encodePosition(d.cursors, user, at.shard, s.epoch, s.log, at.seq),
    more: full,
  };
}

/** Offsets the first backward window of `lastEntries` spans; each next one doubles, up to LAST_WINDOWS of them. */
const LAST_WINDOW = 1024;
const LAST_WINDOWS = 8;

/**
 * The user's newest `n` entries in its current shard (the console's user lookup), newest last.
 * Entries of all users share a shard's offsets, so the read looks back over a window of offsets
 * below the user's head that doubles until it holds `n` (or reaches the stream's start): at most
 * LAST_WINDOWS reads, each bounded. Older shards (before a split) are not looked at.
 */
export async function lastEntries(d: Pick<PageDeps, "registry" | "mailbox">, user: string, n: number): Promise<Entry[]> {
  const shard = d.registry.shards.shardOf(user);
  const s = shard === undefined ? undefined : d.registry.state.shards.get(shard);
  if (shard === undefined || s === undefined) return [];
  const wm = await d.mailbox.watermarks(shard, user);
  if (wm.head === 0n) return [];
  const head = Number(seqOffset(wm.head));
  const epochOfHead = seqEpoch(wm.head);
  let got: Entry[] = [];
  for (let w = 0, width = LAST_WINDOW; w < LAST_WINDOWS; w++, width *= 2) {
    const from = Math.max(0, head - width);
    // the seq just below the window, in the head's numbering: entries of older epochs below it are older still
    const after = from === 0 ? 0n : composeSeq(epochOfHead, from);
    got = [];
    for await (const page of d.mailbox.read(shard, user, after, { until: wm.head, limit: 100_000 })) got.push(...page.entries);
    if (got.length >= n || from === 0) break;
  }
  return got.slice(-n);
}
