/**
 * The apply loop: what arrives goes through one queue in arrival order, and entries reach the
 * app's handler one at a time. Rebases, AUTH_OK and SYNCED are queued with the entries, so a
 * mid-session rebase never moves the cursor past entries still waiting to be applied.
 */
import { reconnectDelay, type Entry, type MailboxSeq } from "../protocol/device.js";
import { sleep, type Clock } from "./clock.js";
import type { RecentIds } from "./dedup.js";
import type { ClientEvent, ClientStats } from "./events.js";
import type { CursorPosition, PositionAction, PositionInput } from "./position.js";
import type { PullReply } from "./requests.js";

/** What the loop takes, in arrival order. */
export type Incoming = { type: "entries"; shard: number; entries: Entry[] } | Extract<PositionInput, { type: "synced" | "rebased" | "auth_ok" }>;

/** A handler that throws gets its entry again after this backoff (the rebuild hook too). */
const HANDLER_BACKOFF = { baseMs: 100, capMs: 5000 };
/** PULL rounds for one gap (each up to the gateway's limit). */
const MAX_GAP_ROUNDS = 100;

/** What the loop needs from the client. */
export interface ApplyHost {
  readonly clock: Clock;
  readonly position: CursorPosition;
  readonly stats: ClientStats;
  readonly recent: RecentIds;
  onEntry(e: Entry): void | Promise<void>;
  emit(e: ClientEvent): void;
  /** The app closed the client: nothing more is applied. */
  closed(): boolean;
  /** PULL after `after`: "lost" when the connection is gone, or goes before the answer. */
  pull(after: MailboxSeq): Promise<PullReply>;
  /** Does what the position answered (save the cursor, clear it). */
  perform(actions: PositionAction[]): void;
  /** One more entry behind the cursor: counts towards the next ACK. */
  advanced(): void;
}

export class ApplyLoop {
  private queue: Incoming[] = [];
  private running: Promise<void> | undefined;
  /** Set while CURSOR_EXPIRED's rebuild hook runs: nothing is applied meanwhile. */
  private rebuilding: Promise<void> | undefined;

  constructor(private readonly host: ApplyHost) {}

  /** Queues `item` after everything before it; resolves when the queue has run empty. */
  push(item: Incoming): Promise<void> {
    this.queue.push(item);
    return this.drain();
  }

  /** Resolves once the entry in the app's hands, if any, is finished. */
  idle(): Promise<void> {
    return this.running ?? Promise.resolve();
  }

  /** The connection went: what it delivered and the app has not applied yet comes again after the cursor. */
  clear(): void {
    this.queue = [];
  }

  /**
   * CURSOR_EXPIRED: entries wait until the app's rebuild hook has finished. A hook that throws is
   * told (`rebuild_error`) and run again after the handler's backoff: applying later entries over
   * a state that was not rebuilt would be wrong, and a rejection nobody handles ends a Node app.
   */
  rebuild(hook: () => void | Promise<void>): void {
    // a second CURSOR_EXPIRED while the first hook runs: its hook runs after, and entries wait for both
    const before = this.rebuilding;
    const mine: Promise<void> = (async () => {
      if (before !== undefined) await before;
      for (let attempt = 0; !this.host.closed(); attempt++) {
        try {
          await hook();
          return;
        } catch (error) {
          this.host.stats.handlerErrors++;
          this.host.emit({ type: "rebuild_error", error });
          await sleep(this.host.clock, reconnectDelay(attempt, HANDLER_BACKOFF));
        }
      }
    })().finally(() => {
      if (this.rebuilding === mine) this.rebuilding = undefined;
      void this.drain();
    });
    this.rebuilding = mine;
  }

  private drain(): Promise<void> {
    this.running ??= (async () => {
      await Promise.resolve(); // the loop starts once `running` is set: it clears it when it ends
      try {
        while (this.queue.length > 0 && !this.host.closed()) {
          if (this.rebuilding) await this.rebuilding;
          const item = this.queue.shift();
          if (item === undefined) break; // the connection went while the app rebuilt
          await this.take(item);
        }
      } finally {
        this.running = undefined;
      }
    })();
    return this.running;
  }

  private async take(item: Incoming): Promise<void> {
    const { position, stats } = this.host;
    if (item.type === "rebased") stats.rebases++;
    this.host.perform(position.apply(item));
    if (item.type === "rebased") this.host.emit({ type: "rebased", replayFrom: item.to, cursor: item.cursor });
    if (item.type !== "entries") return;
    for (const e of item.entries) {
      // a gap that could not be filled (the connection went): the rest comes again after the cursor
      if (!(await this.applyOne(e))) return;
    }
  }

  /** False when `e` must wait: its gap could not be filled because the connection is gone. */
  private async applyOne(e: Entry): Promise<boolean> {
    const { position, stats, recent } = this.host;
    if (e.seq <= position.seq) {
      stats.mailboxSeqRegressionCount++;
      return true;
    }
    if (e.prev !== null && e.prev > position.seq && !(await this.fillGap(e))) return false;
    if (recent.has(e.id)) {
      stats.duplicatesDropped++;
      this.advance(e.seq);
      return true;
    }
    for (let attempt = 0; ; attempt++) {
      if (this.host.closed()) return false;
      try {
        await this.host.onEntry(e);
        break;
      } catch (error) {
        stats.handlerErrors++;
        this.host.emit({ type: "handler_error", entry: e, error });
        await sleep(this.host.clock, reconnectDelay(attempt, HANDLER_BACKOFF));
      }
    }
    recent.add(e.id);
    stats.applied++;
    this.advance(e.seq);
    return true;
  }

  /**
   * Entries between the last applied and `e` are missing: PULL them before applying `e`. False when
   * the connection is gone before the answer: `e` must not be applied over the gap (the next
   * session sends everything after the cursor).
   */
  private async fillGap(e: Entry): Promise<boolean> {
    const { position } = this.host;
    this.host.stats.gapsFilled++;
    for (let rounds = 0; rounds < MAX_GAP_ROUNDS; rounds++) {
      const reply = await this.host.pull(position.seq);
      if (reply.type === "lost") return false;
      const before = reply.entries.filter((x) => x.seq < e.seq && x.seq > position.seq);
      for (const x of before) if (!(await this.applyOne({ ...x, prev: null }))) return false;
      if (before.length === 0 || !reply.more || reply.entries.some((x) => x.seq >= e.seq)) return true;
    }
    return true;
  }

  private advance(seq: MailboxSeq): void {
    this.host.perform(this.host.position.apply({ type: "applied", seq }));
    this.host.advanced();
  }
}
