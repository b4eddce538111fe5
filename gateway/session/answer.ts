/**
 * From a cursor decision to the frames that answer it: a pure function, used by AUTH and by the
 * mid-session rebase alike, so both tell a device the same thing for the same case.
 */
import { ErrorCode, type CursorToken, type MailboxSeq, type RegistryState, type ServerFrame } from "../../protocol/index.js";
import type { AuthDecision, OldRange } from "../mailbox/auth-decision.js";

/** Signs a cursor token for (shard, epoch, log) of this session's user. */
export type Signer = (shard: number, epoch: number, log: string) => CursorToken;

export type AnswerFor =
  /** The answer to AUTH: the decision's ERROR frame if any, then AUTH_OK. */
  | {
      kind: "auth";
      session: string;
      user: string;
      /** The user's head and per-lane watermarks, the shard's trim, the heartbeat interval. */
      head: MailboxSeq;
      trim: MailboxSeq;
      lanes: ReadonlyMap<string, MailboxSeq>;
      hb: number;
      /** Whether the device sent a cursor: an invalid one is told only then. */
      hadCursor: boolean;
    }
  /** A registry change moved a live session: always a CURSOR_REBASED with the new token. */
  | { kind: "rebase" };

export interface Answer {
  frames: ServerFrame[];
  /** Old shards' ranges to stream, in order, before the session's shard. */
  ranges: OldRange[];
  /** The token the session now runs on. */
  token: CursorToken;
}

export function planAnswer(d: AuthDecision, registry: RegistryState, sign: Signer, to: AnswerFor): Answer {
  const token = sign(d.shard, d.epoch, d.log);
  const frames: ServerFrame[] = [];
  const ranges = d.case === "split" ? d.oldRanges : [];
  switch (d.case) {
    case "rebased":
    case "rebased_new_log":
    case "split":
      frames.push(rebasedFrame(d, token, ranges, registry, sign));
      break;
    case "expired":
      frames.push({ t: "ERROR", code: ErrorCode.CURSOR_EXPIRED, msg: d.reason, fatal: false, trim_watermark: d.trim, rebuild_required: true, new_cursor: token });
      break;
    case "invalid":
      if (to.kind === "auth" && to.hadCursor) frames.push({ t: "ERROR", code: ErrorCode.CURSOR_INVALID, msg: d.reason, fatal: false, new_cursor: token });
      break;
    case "normal":
    case "fresh":
      // mid-session the device still needs the new token (it may have seen the new epoch's pushes already)
      if (to.kind === "rebase") frames.push(rebasedFrame(d, token, [], registry, sign));
      break;
  }
  if (to.kind === "auth") {
    frames.push({
      t: "AUTH_OK", session: to.session, user: to.user, shard: d.shard, epoch: d.epoch, cursor: token,
      from: d.from, head: to.head, trim: to.trim, lanes: Object.fromEntries(to.lanes), hb: to.hb,
    });
  }
  return { frames, ranges, token };
}

function rebasedFrame(d: AuthDecision, token: CursorToken, ranges: readonly OldRange[], registry: RegistryState, sign: Signer): ServerFrame {
  const withTokens = ranges.map((r) => {
    const s = registry.shards.get(r.shard)!;
    return { ...r, cursor: sign(r.shard, s.epoch, s.log) };
  });
  return {
    t: "ERROR", code: ErrorCode.CURSOR_REBASED, msg: `cursor rebased (${d.case === "normal" || d.case === "fresh" ? "epoch change" : d.case})`, fatal: false,
    new_cursor: token, replay_from_seq: d.from,
    ...(withTokens.length > 0 ? { old_ranges: withTokens, old_range: withTokens[0] } : {}),
  };
}
