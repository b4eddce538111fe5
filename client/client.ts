/**
 * The jetgate device SDK: one persistent connection to a gateway that keeps a device's view of its
 * mailbox up to date. Runs in browsers (global WebSocket) and in Node (pass a WebSocket class, e.g.
 * from `ws`). No Node-only imports.
 *
 * Guarantees to the app:
 * - `onEntry` is called once per message_id within the dedup window, in increasing seq order, one
 *   entry at a time; the cursor advances (and is saved) only after the handler has finished. A
 *   handler that throws gets the same entry again after a backoff.
 * - A cursor that no longer fits the server (epoch change, rebuilt log, split, retention) is handled
 *   as the server says (ADR-0004 section 4): rebase and dedup, each old shard's range in order (one
 *   per split hop) then the new shard, the app's rebuild hook, or a fresh start.
 * - The stored cursor's token and seq always share one numbering: during a split's ranges the token
 *   is the range's shard's, so a connection lost inside a range resumes it.
 */
import {
  CloseCode,
  DeviceClose,
  ErrorCode,
  decodeServerFrame,
  encodeFrame,
  shouldReconnect,
  DEFAULT_BACKOFF,
  reconnectDelay,
  type BackoffOptions,
  type ClientFrame,
  type CursorToken,
  type DeviceCursor,
  type Entry,
  type ErrorFrame,
  type MailboxSeq,
  type OldRange,
  type ServerFrame,
} from "../protocol/device.js";
import { MemoryCursorStore, type CursorStore } from "./cursor-store.js";
import { RecentIds } from "./dedup.js";

/** The subset of the WebSocket API the SDK uses; the browser's and `ws`'s both fit. */
export interface WebSocketLike {
  binaryType: string;
  readonly readyState: number;
  send(data: Uint8Array): void;
  close(code?: number, reason?: string): void;
  onopen: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
  onclose: ((ev: { code: number; reason: string }) => void) | null;
  onerror: ((ev: unknown) => void) | null;
}
export type WebSocketFactory = new (url: string) => WebSocketLike;

export class JetgateClientError extends Error {
  override readonly name: string = "JetgateClientError";
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

/** The server closed for good (replaced by a newer session of this device, 4409). */
/** A send that was pending when the backend signed the user or device out. */
export class SignedOutError extends JetgateClientError {
  override readonly name = "SignedOutError";
  constructor(reason: string) {
    super("SIGNED_OUT", `signed out: ${reason}`);
  }
}

export class SessionReplacedError extends JetgateClientError {
  override readonly name = "SessionReplacedError";
  constructor() {
    super("REPLACED", "a newer session of this device replaced this one");
  }
}

export interface ClientOptions {
  /**
   * ws(s)://host:port/v1/ws, or several gateways: the client starts at a random one and moves to
   * the next after each failed attempt (a load balancer in front does the same job).
   */
  url: string | readonly string[];
  device: string;
  /** Called before every connection attempt: return a fresh device JWT. */
  token: () => string | Promise<string>;
  /** The app's handler for each entry; the cursor advances after it resolves. */
  onEntry: (entry: Entry) => void | Promise<void>;
  /** CURSOR_EXPIRED: entries were lost to retention; rebuild the app's state (live entries wait). */
  onRebuild?: (info: { trimWatermark: MailboxSeq }) => void | Promise<void>;
  store?: CursorStore;
  WebSocket?: WebSocketFactory;
  lanes?: string[];
  backoff?: BackoffOptions;
  /** Message ids remembered for dedup. */
  dedupWindow?: number;
  /** Send a cumulative ACK after this many entries or this many ms, whichever comes first. */
  ackEvery?: { entries: number; ms: number };
  /**
   * An attempt without AUTH_OK by then is given up and the next gateway tried (default 10 s): a
   * gateway behind a silent network, or one waiting on its own dependencies, never answers.
   */
  connectTimeoutMs?: number;
}

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
  /** ADR-0004's release gate: a received seq at or below the last applied outside a rebase. */
  mailboxSeqRegressionCount: number;
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
  | { type: "error"; frame: ErrorFrame }
  | { type: "closed"; code: number; reason: string };

interface PendingSend {
  cmid: string;
  b: Uint8Array<ArrayBuffer>;
  resolve: (r: { dup: boolean }) => void;
  reject: (e: Error) => void;
}

/** What the apply loop takes in arrival order: entries, and the rebases that move the cursor between them. */
type Incoming =
  | { shard: number; entries: Entry[] }
  | { rebase: { to: MailboxSeq; cursor: CursorToken; oldRanges: readonly OldRange[] } }
  | { authOk: { cursor: CursorToken; from: MailboxSeq } };

/**
 * One numbering the device passes through after a split: an old shard's range, or (the last one)
 * the new shard. Entering it: last applied = max(last applied, `after`), token = `cursor` if known.
 */
interface Stage {
  shard: number;
  after: MailboxSeq;
  cursor: CursorToken | undefined;
}

/** The queue item's shard that stands for SYNCED (catch-up done), in order with the entries before it; no real shard is negative. */
const SYNCED_MARK = -1;

const OPEN = 1;

function randomId(): string {
  const a = new Uint8Array(12);
  globalThis.crypto.getRandomValues(a);
  return Array.from(a, (b) => b.toString(36).padStart(2, "0")).join("").slice(0, 20);
}

export class JetgateClient {
  /** Where in `url` (a list) this client starts. */
  private readonly urlBase = Math.floor(Math.random() * 1024);
  readonly stats: ClientStats = { applied: 0, duplicatesDropped: 0, gapsFilled: 0, reconnects: 0, rebases: 0, cursorInvalid: 0, handlerErrors: 0, mailboxSeqRegressionCount: 0 };
  private stateValue: ClientState = { type: "idle" };
  private readonly store: CursorStore;
  private readonly WS: WebSocketFactory;
  private readonly recent: RecentIds;
  private readonly listeners = new Set<(e: ClientEvent) => void>();
  private ws: WebSocketLike | undefined;
  private token: CursorToken | undefined;
  private lastApplied: MailboxSeq = 0n;
  private attempt = 0;
  private nextDelayOverride: number | undefined;
  private queue: Incoming[] = [];
  /** The apply loop while it runs. */
  private applying: Promise<void> | undefined;
  /** Set while CURSOR_EXPIRED's rebuild hook runs: live entries wait. */
  private rebuilding: Promise<void> | undefined;
  /**
   * Split: the old shards' ranges (one per hop, P -> C1 -> C2 ...) then the new shard, in order.
   * `at` is the stage the device is in (-1: none entered yet); the last stage is the new shard
   * (`replay_from_seq`, `new_cursor`), and entering it ends the split. The device moves to a stage's
   * numbering only when that stage's entries begin, never straight to the last one (that dropped
   * C1's entries as regressions), and the stored cursor takes the stage's token at the same time:
   * token and seq must always agree (a child token with a parent seq made a gateway skip the child's
   * first entries; the split fault scenario found it).
   */
  private split: { stages: Stage[]; at: number } | undefined;
  private readonly pulls = new Map<number, (f: Extract<ServerFrame, { t: "MSGS" }>) => void>();
  private nextId = 1;
  private readonly sends = new Map<number, PendingSend>();
  private unacked = 0;
  private ackTimer: ReturnType<typeof setTimeout> | undefined;
  private refreshTimer: ReturnType<typeof setTimeout> | undefined;
  /** The JWT the live session runs on (for its `exp`). */
  private sessionToken: string | undefined;
  private pingTimer: ReturnType<typeof setInterval> | undefined;
  private lastHeard = 0;
  private reconnectTimer: ReturnType<typeof setTimeout> | undefined;
  private connectTimer: ReturnType<typeof setTimeout> | undefined;
  private saveChain: Promise<void> = Promise.resolve();

  constructor(private readonly opts: ClientOptions) {
    this.store = opts.store ?? new MemoryCursorStore();
    const ws = opts.WebSocket ?? (globalThis as { WebSocket?: WebSocketFactory }).WebSocket;
    if (ws === undefined) throw new JetgateClientError("NO_WEBSOCKET", "no WebSocket implementation: pass options.WebSocket (e.g. from the ws package)");
    this.WS = ws;
    this.recent = new RecentIds(opts.dedupWindow ?? 10_000);
  }

  get state(): ClientState {
    return this.stateValue;
  }

  /** The last seq the app's handler finished. */
  get cursorSeq(): MailboxSeq {
    return this.lastApplied;
  }

  on(listener: (e: ClientEvent) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  private emit(e: ClientEvent): void {
    for (const l of this.listeners) l(e);
  }

  private setState(s: ClientState): void {
    this.stateValue = s;
    this.emit({ type: "state", state: s });
  }

  /** Loads the stored cursor and connects; reconnects by itself until `close()`. */
  async start(): Promise<void> {
    const c = await this.store.load();
    if (c !== undefined) {
      this.token = { shard: c.shard, epoch: c.epoch, log: c.log, sig: c.sig };
      this.lastApplied = c.seq;
    }
    void this.connect();
  }

  /** Drops the current connection and reconnects (e.g. after the app saw the network change). */
  disconnect(): void {
    if (this.ws && this.ws.readyState === OPEN) this.abandon(DeviceClose.RECONNECT);
  }

  /**
   * Closes the socket and goes on at once: the close handshake of a dead link would wait on a
   * timeout of the WebSocket's own (30 s in `ws`) before onclose.
   */
  private abandon(why: { code: number; reason: string }): void {
    this.ws?.close(why.code, why.reason);
    this.onClose(why.code, why.reason);
  }

  /** Closes for good. */
  async close(): Promise<void> {
    this.setState({ type: "closed", reason: "closed by the app" });
    clearTimeout(this.reconnectTimer);
    this.teardown();
    this.ws?.close(DeviceClose.BYE.code, DeviceClose.BYE.reason);
    await this.saveChain;
  }

  /** Sends bytes upstream; resolves after the server stored them. Retries on reconnect with the same cmid. */
  send(b: Uint8Array, cmid: string = randomId()): Promise<{ dup: boolean }> {
    return new Promise((resolve, reject) => {
      const id = this.nextId++;
      const body = new Uint8Array(b); // a copy: the app may reuse its buffer before the server acks
      this.sends.set(id, { cmid, b: body, resolve, reject });
      if (this.stateValue.type === "live" || this.stateValue.type === "syncing") this.write({ t: "SEND", id, cmid, b: body });
    });
  }

  // ---- connection ----------------------------------------------------------------------------

  private async connect(): Promise<void> {
    if (this.stateValue.type === "closed") return;
    this.setState({ type: "connecting", attempt: this.attempt });
    // The entry in the app's hands finishes first: the AUTH cursor must be where applying stopped.
    await this.applying;
    // The whole attempt, the app's token() included, is bounded by connectTimeoutMs: a token
    // callback that hangs must not hold the client in "connecting" for good.
    const timeoutMs = this.opts.connectTimeoutMs ?? 10_000;
    const started = Date.now();
    let timer: ReturnType<typeof setTimeout> | undefined;
    let token: string | undefined;
    try {
      token = await Promise.race([
        Promise.resolve(this.opts.token()),
        new Promise<undefined>((resolve) => (timer = setTimeout(() => resolve(undefined), timeoutMs))),
      ]);
    } catch {
      token = undefined;
    } finally {
      clearTimeout(timer);
    }
    // The app may have closed while the token was fetched.
    if ((this.stateValue as ClientState).type === "closed") return;
    if (token === undefined) {
      this.scheduleReconnect();
      return;
    }
    this.sessionToken = token;
    const urls = typeof this.opts.url === "string" ? [this.opts.url] : this.opts.url;
    const ws = new this.WS(urls[(this.urlBase + this.attempt) % urls.length]!);
    this.ws = ws;
    ws.binaryType = "arraybuffer";
    ws.onopen = () => {
      this.lastHeard = Date.now();
      const cursor: DeviceCursor | undefined = this.token && { ...this.token, seq: this.lastApplied };
      this.write({ t: "AUTH", v: 1, token, device: this.opts.device, ...(cursor ? { cursor } : {}), ...(this.opts.lanes ? { lanes: this.opts.lanes } : {}) });
    };
    ws.onmessage = (ev) => this.onMessage(ev.data);
    ws.onerror = () => undefined; // onclose follows
    ws.onclose = (ev) => this.onClose(ev.code, ev.reason);
    this.connectTimer = setTimeout(() => this.abandon(DeviceClose.CONNECT_TIMEOUT), Math.max(0, timeoutMs - (Date.now() - started)));
  }

  private onClose(code: number, reason: string): void {
    this.teardown();
    this.emit({ type: "closed", code, reason });
    if (this.stateValue.type === "closed") return;
    if (code === CloseCode.SIGNED_OUT) this.emit({ type: "signed_out", reason });
    if (!shouldReconnect(code)) {
      this.setState({ type: "closed", reason: code === CloseCode.SIGNED_OUT ? `signed out: ${reason}` : `server closed with ${code}` });
      for (const s of this.sends.values()) s.reject(code === CloseCode.SIGNED_OUT ? new SignedOutError(reason) : new SessionReplacedError());
      this.sends.clear();
      return;
    }
    if (code === CloseCode.RECONNECT_NOW) {
      // asked for by the backend: at once, and from the first backoff step if that fails
      this.emit({ type: "reconnect_requested", reason });
      this.attempt = 0;
      this.nextDelayOverride = 0;
    }
    this.scheduleReconnect();
  }

  private teardown(): void {
    clearTimeout(this.connectTimer);
    clearInterval(this.pingTimer);
    clearTimeout(this.ackTimer);
    clearTimeout(this.refreshTimer);
    this.flushAck();
    // What the dead connection delivered and the app has not applied yet comes again after the cursor
    this.queue = [];
    this.split = undefined;
    for (const resolve of this.pulls.values()) resolve({ t: "MSGS", shard: -1, e: [] });
    this.pulls.clear();
    if (this.ws) {
      this.ws.onmessage = null;
      this.ws.onclose = null;
      this.ws.onopen = null;
    }
  }

  private scheduleReconnect(): void {
    const delayMs = this.nextDelayOverride ?? reconnectDelay(this.attempt, this.opts.backoff ?? DEFAULT_BACKOFF);
    this.nextDelayOverride = undefined;
    this.setState({ type: "waiting", attempt: this.attempt, delayMs });
    this.attempt++;
    this.stats.reconnects++;
    this.reconnectTimer = setTimeout(() => void this.connect(), delayMs);
  }

  private write(frame: ClientFrame): void {
    if (this.ws?.readyState === OPEN) this.ws.send(encodeFrame(frame));
  }

  // ---- frames --------------------------------------------------------------------------------

  private onMessage(data: unknown): void {
    this.lastHeard = Date.now();
    let f: ServerFrame;
    try {
      f = decodeServerFrame(data instanceof ArrayBuffer ? new Uint8Array(data) : data);
    } catch {
      this.ws?.close(DeviceClose.BAD_SERVER_FRAME.code, DeviceClose.BAD_SERVER_FRAME.reason);
      return;
    }
    switch (f.t) {
      case "AUTH_OK":
        this.onAuthOk(f);
        return;
      case "ERROR":
        this.onError(f);
        return;
      case "MSGS":
        if (f.id !== undefined) {
          this.pulls.get(f.id)?.(f);
          this.pulls.delete(f.id);
          return;
        }
        this.queue.push({ shard: f.shard, entries: f.e });
        void this.drain();
        return;
      case "SYNCED":
        this.queue.push({ shard: SYNCED_MARK, entries: [] }); // marks the end of catch-up in order
        void this.drain().then(() => {
          if (this.stateValue.type === "syncing") {
            this.attempt = 0;
            this.setState({ type: "live" });
            this.emit({ type: "synced", seq: this.lastApplied });
          }
        });
        return;
      case "SEND_OK": {
        const s = this.sends.get(f.id);
        this.sends.delete(f.id);
        s?.resolve({ dup: f.dup });
        return;
      }
      case "GOAWAY":
        this.nextDelayOverride = f.retry_ms;
        return;
      case "PONG":
        return;
      case "REFRESH_OK":
        this.scheduleRefresh(f.exp);
        return;
    }
  }

  /** Sends a fresh token (REFRESH) before the session's one expires, so the gateway does not close the session at expiry. */
  private scheduleRefresh(expMs: number | undefined): void {
    clearTimeout(this.refreshTimer);
    if (expMs === undefined) return;
    this.refreshTimer = setTimeout(() => void this.refresh(), refreshDelay(expMs - Date.now()));
  }

  private async refresh(): Promise<void> {
    let token: string;
    try {
      token = await this.opts.token();
    } catch {
      // the app could not get a token now: try again shortly; at expiry the gateway closes and
      // the reconnect asks for a token again
      this.refreshTimer = setTimeout(() => void this.refresh(), 5000);
      return;
    }
    if (this.stateValue.type !== "live" && this.stateValue.type !== "syncing") return;
    this.sessionToken = token;
    this.write({ t: "REFRESH", token });
  }

  private onAuthOk(f: Extract<ServerFrame, { t: "AUTH_OK" }>): void {
    clearTimeout(this.connectTimer);
    this.scheduleRefresh(tokenExpiry(this.sessionToken));
    // after a CURSOR_REBASED that came before it
    this.queue.push({ authOk: { cursor: f.cursor, from: f.from } });
    void this.drain();
    this.setState({ type: "syncing" });
    clearInterval(this.pingTimer);
    const hb = Math.max(1000, f.hb);
    this.pingTimer = setInterval(() => {
      if (Date.now() - this.lastHeard > hb * 2 + 5000) {
        this.abandon(DeviceClose.HEARTBEAT_MISSED);
        return;
      }
      this.write({ t: "PING" });
    }, hb);
    for (const [id, s] of this.sends) this.write({ t: "SEND", id, cmid: s.cmid, b: s.b });
  }

  private onError(f: ErrorFrame): void {
    this.emit({ type: "error", frame: f });
    if (f.code === ErrorCode.CURSOR_REBASED && f.new_cursor && f.replay_from_seq !== undefined) {
      // in order with the entries before it: a mid-session rebase must not move the cursor past
      // entries still waiting to be applied. Every hop in `old_ranges`; a gateway older than it
      // sends the first hop alone in `old_range`.
      const oldRanges = f.old_ranges !== undefined && f.old_ranges.length > 0 ? f.old_ranges : f.old_range !== undefined ? [f.old_range] : [];
      this.queue.push({ rebase: { to: f.replay_from_seq, cursor: f.new_cursor, oldRanges } });
      void this.drain();
      return;
    }
    if (f.code === ErrorCode.CURSOR_EXPIRED && f.new_cursor) {
      this.token = f.new_cursor;
      const trim = f.trim_watermark ?? 0n;
      this.rebuilding = Promise.resolve(this.opts.onRebuild?.({ trimWatermark: trim })).finally(() => {
        this.rebuilding = undefined;
        void this.drain();
      });
      this.lastApplied = 0n; // AUTH_OK's `from` (the head) is the position after a rebuild
      return;
    }
    if (f.code === ErrorCode.CURSOR_INVALID) {
      this.stats.cursorInvalid++;
      this.token = f.new_cursor;
      this.lastApplied = 0n;
      void this.store.clear();
      this.emit({ type: "cursor_invalid", reason: f.msg });
      return;
    }
    if (f.code === ErrorCode.INTERNAL && f.id !== undefined && this.sends.has(f.id)) {
      const s = this.sends.get(f.id)!;
      setTimeout(() => this.write({ t: "SEND", id: f.id!, cmid: s.cmid, b: s.b }), 1000);
      return;
    }
    if (f.code === ErrorCode.TOO_LARGE && f.id !== undefined && this.sends.has(f.id)) {
      this.sends.get(f.id)!.reject(new JetgateClientError(f.code, f.msg));
      this.sends.delete(f.id);
    }
  }

  // ---- applying entries -------------------------------------------------------------------------

  /** Applies queued entries one at a time, in order. */
  private drain(): Promise<void> {
    this.applying ??= (async () => {
      await Promise.resolve(); // the loop starts once `applying` is set: it clears it when it ends
      try {
        while (this.queue.length > 0 && this.stateValue.type !== "closed") {
          if (this.rebuilding) await this.rebuilding;
          const item = this.queue.shift()!;
          if ("rebase" in item) {
            this.rebase(item.rebase);
            continue;
          }
          if ("authOk" in item) {
            this.authOk(item.authOk);
            continue;
          }
          if (this.split !== undefined) this.splitArrival(item.shard);
          for (const e of item.entries) {
            // a gap that could not be filled (the connection went): the rest comes again after the cursor
            if (!(await this.applyOne(e))) break;
          }
        }
      } finally {
        this.applying = undefined;
      }
    })();
    return this.applying;
  }

  /**
   * `from` is the server's position for this device: the cursor, its rebased value, the head after a
   * rebuild, 0 for a fresh start. During a split the old ranges play first: AUTH_OK's token is the
   * new shard's, taken when its entries begin.
   */
  private authOk(a: Extract<Incoming, { authOk: unknown }>["authOk"]): void {
    if (this.split === undefined) {
      this.token = a.cursor;
      this.lastApplied = a.from;
    } else {
      this.split.stages.at(-1)!.cursor = a.cursor;
    }
    this.saveCursor();
  }

  private rebase(r: Extract<Incoming, { rebase: unknown }>["rebase"]): void {
    this.stats.rebases++;
    const stages: Stage[] = [...r.oldRanges.map((o) => ({ shard: o.shard, after: o.after, cursor: o.cursor })), { shard: r.cursor.shard, after: r.to, cursor: r.cursor }];
    if (this.split !== undefined) {
      // Another rebase before the last one's new shard began (its shard split again, or changed
      // epoch): its stages follow the ones still ahead. Its first stage is usually that same new
      // shard: one stage then, which keeps the earlier token when this frame names none.
      const last = this.split.stages.at(-1)!;
      const first = stages[0]!;
      if (first.shard === last.shard) {
        stages.shift();
        if (first.after > last.after) last.after = first.after;
        last.cursor = first.cursor ?? last.cursor;
      }
      this.split.stages.push(...stages);
    } else if (stages.length > 1) {
      // The old shards' ranges come first (their seqs are below the new shard's), each in its own
      // numbering, entered as its entries begin.
      this.split = { stages, at: -1 };
    } else {
      this.enterStage(stages[0]!);
    }
    this.saveCursor();
    this.emit({ type: "rebased", replayFrom: r.to, cursor: r.cursor });
  }

  /**
   * Entries of `shard` (or SYNCED) arrive during a split: entries of a later stage's shard enter
   * that stage, passing over the ranges before it that had no entries; SYNCED means every range
   * and the new shard's catch-up were sent: on to the new shard. Entries of the stage the device
   * is in change nothing.
   */
  private splitArrival(shard: number): void {
    const split = this.split!;
    if (split.at >= 0 && split.stages[split.at]!.shard === shard) return;
    const last = split.stages.length - 1;
    const next = shard === SYNCED_MARK ? last : split.stages.findIndex((s, i) => i > split.at && s.shard === shard);
    if (next === -1) return; // a shard no stage ahead names: stay in the numbering the device is in
    this.enterStage(split.stages[next]!);
    split.at = next;
    if (next === last) this.split = undefined;
    this.saveCursor();
  }

  /** Moves to a stage's numbering: never below the last applied; its token when it has one. */
  private enterStage(s: Stage): void {
    if (s.after > this.lastApplied) this.lastApplied = s.after;
    if (s.cursor !== undefined) this.token = s.cursor;
  }

  /** False when `e` must wait: its gap could not be filled because the connection is gone. */
  private async applyOne(e: Entry): Promise<boolean> {
    if (e.seq <= this.lastApplied) {
      this.stats.mailboxSeqRegressionCount++;
      return true;
    }
    if (e.prev !== null && e.prev > this.lastApplied && !(await this.fillGap(e))) return false;
    if (this.recent.has(e.id)) {
      this.stats.duplicatesDropped++;
      this.advance(e.seq);
      return true;
    }
    for (let attempt = 0; ; attempt++) {
      if (this.stateValue.type === "closed") return false;
      try {
        await this.opts.onEntry(e);
        break;
      } catch (error) {
        this.stats.handlerErrors++;
        this.emit({ type: "handler_error", entry: e, error });
        await new Promise((r) => setTimeout(r, reconnectDelay(attempt, { baseMs: 100, capMs: 5000 })));
      }
    }
    this.recent.add(e.id);
    this.stats.applied++;
    this.advance(e.seq);
    return true;
  }

  /**
   * Entries between the last applied and `e` are missing: PULL them before applying `e`. False when
   * the connection is gone before the answer: `e` must not be applied over the gap (the next
   * session sends everything after the cursor).
   */
  private async fillGap(e: Entry): Promise<boolean> {
    this.stats.gapsFilled++;
    for (let rounds = 0; rounds < 100; rounds++) {
      if (this.ws?.readyState !== OPEN) return false;
      const id = this.nextId++;
      const reply = await new Promise<Extract<ServerFrame, { t: "MSGS" }>>((resolve) => {
        this.pulls.set(id, resolve);
        this.write({ t: "PULL", id, after: this.lastApplied, limit: 500 });
      });
      if (reply.shard === -1) return false; // answered by the teardown: the connection went
      const before = reply.e.filter((x) => x.seq < e.seq && x.seq > this.lastApplied);
      for (const x of before) if (!(await this.applyOne({ ...x, prev: null }))) return false;
      if (before.length === 0 || !reply.more || reply.e.some((x) => x.seq >= e.seq)) return true;
    }
    return true;
  }

  private advance(seq: MailboxSeq): void {
    this.lastApplied = seq;
    this.saveCursor();
    const every = this.opts.ackEvery ?? { entries: 100, ms: 1000 };
    if (++this.unacked >= every.entries) this.flushAck();
    else this.ackTimer ??= setTimeout(() => this.flushAck(), every.ms);
  }

  private flushAck(): void {
    clearTimeout(this.ackTimer);
    this.ackTimer = undefined;
    if (this.unacked === 0) return;
    this.unacked = 0;
    this.write({ t: "ACK", seq: this.lastApplied });
  }

  private saveCursor(): void {
    if (this.token === undefined) return;
    const c: DeviceCursor = { ...this.token, seq: this.lastApplied };
    this.saveChain = this.saveChain.then(() => this.store.save(c)).catch(() => undefined);
  }
}

/**
 * When to refresh a token with `leftMs` to live: after three quarters of it, never sooner than a
 * second. A fraction of what is left, not "a minute before expiry": with tokens of a minute or less
 * that asked for a refresh every second, each new token as short as the last.
 */
export function refreshDelay(leftMs: number): number {
  return Math.min(Math.max(1000, Math.floor(leftMs * 0.75)), 2 ** 31 - 1);
}

/** A JWT's `exp` in ms, read without verifying (only to time a refresh); undefined if unreadable. */
export function tokenExpiry(jwt: string | undefined): number | undefined {
  const part = jwt?.split(".")[1];
  if (part === undefined) return undefined;
  try {
    const b64 = part.replace(/-/g, "+").replace(/_/g, "/");
    const json = JSON.parse(atob(b64 + "=".repeat((4 - (b64.length % 4)) % 4))) as { exp?: unknown };
    return typeof json.exp === "number" ? json.exp * 1000 : undefined;
  } catch {
    return undefined;
  }
}
