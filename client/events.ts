/** What the client tells the app: its state, its counters and its events. */
import type { CursorToken, Entry, ErrorFrame, MailboxSeq } from "../protocol/device.js";

export type ClientState =
  | { type: "idle" }
  | { type: "connecting"; attempt: number }
  | { type: "syncing" }
  | { type: "live" }
  | { type: "waiting"; attempt: number; delayMs: number }
  | { type: "closed"; reason: string };

export interface ClientStats {
  applied: number;
  duplicatesDropped: number;
  gapsFilled: number;
  reconnects: number;
  rebases: number;
  /** CURSOR_INVALID answers: each one replays the mailbox from its start. */
  cursorInvalid: number;
  handlerErrors: number;
  /** Must stay 0 (docs/design.md, "Review points"): a received seq at or below the last applied outside a rebase. */
  mailboxSeqRegressionCount: number;
}

export function newStats(): ClientStats {
  return { applied: 0, duplicatesDropped: 0, gapsFilled: 0, reconnects: 0, rebases: 0, cursorInvalid: 0, handlerErrors: 0, mailboxSeqRegressionCount: 0 };
}

export type ClientEvent =
  | { type: "state"; state: ClientState }
  | { type: "synced"; seq: MailboxSeq }
  | { type: "rebased"; replayFrom: MailboxSeq; cursor: CursorToken }
  | { type: "cursor_invalid"; reason: string }
  /** The backend signed this user or device out (close 4403): the client has stopped; sign in again and start a new one. */
  | { type: "signed_out"; reason: string }
  /** The backend asked for a reconnect (close 4300, e.g. to pick up a new token): the client reconnects at once, calling `token()` again. */
  | { type: "reconnect_requested"; reason: string }
  | { type: "handler_error"; entry: Entry; error: unknown }
  /** The rebuild hook (CURSOR_EXPIRED) threw: it runs again after a backoff; entries wait for it. */
  | { type: "rebuild_error"; error: unknown }
  | { type: "error"; frame: ErrorFrame }
  | { type: "closed"; code: number; reason: string };
