/**
 * The jetgate device SDK: one persistent connection to a gateway that keeps a device's view of its
 * mailbox up to date. Runs in browsers (global WebSocket) and in Node (pass a WebSocket class, e.g.
 * from `ws`). No Node-only imports.
 *
 * Guarantees to the app:
 * - `onEntry` is called once per message_id within the dedup window, in increasing seq order, one
 *   entry at a time; the cursor advances (and is saved) only after the handler has finished. A
 *   handler that throws gets the same entry again after a backoff (apply-loop.ts).
 * - A cursor that no longer fits the server (epoch change, rebuilt log, split, retention) is handled
 *   as the server says (docs/design.md, "Cursor cases"): rebase and dedup, each old shard's range in order (one
 *   per split hop) then the new shard, the app's rebuild hook, or a fresh start.
 * - The stored cursor's token and seq always share one numbering (position.ts): during a split's
 *   ranges the token is the range's shard's, so a connection lost inside a range resumes it.
 *
 * This file is the connection: it opens sockets, reads frames and hands them on; what a close
 * means is in reconnect.ts.
 */
import {
  DeviceClose,
  ErrorCode,
  decodeServerFrame,
  encodeFrame,
  DEFAULT_BACKOFF,
  type ClientFrame,
  type ErrorFrame,
  type MailboxSeq,
  type ServerFrame,
} from "../protocol/device.js";
import { Acks } from "./acks.js";
import { ApplyLoop } from "./apply-loop.js";
import { deviceClock, type Clock, type Timer } from "./clock.js";
import { MemoryCursorStore, type CursorStore } from "./cursor-store.js";
import { RecentIds } from "./dedup.js";
import { JetgateClientError } from "./errors.js";
import { newStats, type ClientEvent, type ClientState, type ClientStats } from "./events.js";
import { PingHeartbeat, type Heartbeat } from "./heartbeat.js";
import { OPEN, type ClientOptions, type WebSocketFactory, type WebSocketLike } from "./options.js";
import { CursorPosition, type PositionAction } from "./position.js";
import { Backoff, afterClose } from "./reconnect.js";
import { PendingPulls, PendingSends, type PullReply } from "./requests.js";
import { TokenRefresh, tokenExpiry } from "./token-refresh.js";

/** Entries asked for by one PULL. */
const PULL_LIMIT = 500;
/** A SEND the gateway answered with INTERNAL is written again after this long. */
const SEND_RETRY_MS = 1000;

function randomId(): string {
  const a = new Uint8Array(12);
  globalThis.crypto.getRandomValues(a);
  return Array.from(a, (b) => b.toString(36).padStart(2, "0")).join("").slice(0, 20);
}

export class JetgateClient {
  /** Where in `url` (a list) this client starts. */
  private readonly urlBase = Math.floor(Math.random() * 1024);
  readonly stats: ClientStats = newStats();
  private stateValue: ClientState = { type: "idle" };
  private readonly clock: Clock;
  private readonly store: CursorStore;
  private readonly WS: WebSocketFactory;
  private readonly listeners = new Set<(e: ClientEvent) => void>();
  private readonly position = new CursorPosition();
  private readonly loop: ApplyLoop;
  private readonly backoff: Backoff;
  /** The app applied an entry since the last close (the cursor moved). */
  private progressed = false;
  private readonly heartbeat: Heartbeat;
  private readonly acks: Acks;
  private readonly refresh: TokenRefresh;
  private readonly pulls = new PendingPulls();
  private readonly sends = new PendingSends();
  private ws: WebSocketLike | undefined;
  /** One sequence for SEND and PULL ids: an ERROR's `id` names one request. */
  private nextId = 1;
  /** The JWT the live session runs on (for its `exp`). */
  private sessionToken: string | undefined;
  private reconnectTimer: Timer | undefined;
  private connectTimer: Timer | undefined;
  private saveChain: Promise<void> = Promise.resolve();

  constructor(private readonly opts: ClientOptions) {
    this.clock = opts.clock ?? deviceClock;
    this.store = opts.store ?? new MemoryCursorStore();
    const ws = opts.WebSocket ?? (globalThis as { WebSocket?: WebSocketFactory }).WebSocket;
    if (ws === undefined) throw new JetgateClientError("NO_WEBSOCKET", "no WebSocket implementation: pass options.WebSocket (e.g. from the ws package)");
    this.WS = ws;
    this.backoff = new Backoff(opts.backoff ?? DEFAULT_BACKOFF);
    this.heartbeat = new PingHeartbeat(this.clock, () => this.write({ t: "PING" }), () => this.abandon(DeviceClose.HEARTBEAT_MISSED));
    this.acks = new Acks(this.clock, opts.ackEvery ?? { entries: 100, ms: 1000 }, () => this.write({ t: "ACK", seq: this.position.seq }));
    this.refresh = new TokenRefresh(this.clock, () => opts.token(), (token) => {
      if (this.stateValue.type !== "live" && this.stateValue.type !== "syncing") return;
      this.sessionToken = token;
      this.write({ t: "REFRESH", token });
    });
    this.loop = new ApplyLoop({
      clock: this.clock,
      position: this.position,
      stats: this.stats,
      recent: new RecentIds(opts.dedupWindow ?? 10_000),
      onEntry: (e) => opts.onEntry(e),
      emit: (e) => this.emit(e),
      closed: () => this.stateValue.type === "closed",
      pull: (after) => this.pull(after),
      perform: (actions) => this.perform(actions),
      advanced: () => {
        this.acks.count();
        this.progressed = true;
      },
    });
  }

  get state(): ClientState {
    return this.stateValue;
  }

  /** The last seq the app's handler finished. */
  get cursorSeq(): MailboxSeq {
    return this.position.seq;
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
    if (c !== undefined) this.position.apply({ type: "stored", cursor: c });
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
    this.clock.clearTimeout(this.reconnectTimer);
    this.teardown();
    this.ws?.close(DeviceClose.BYE.code, DeviceClose.BYE.reason);
    await this.saveChain;
  }

  /** Sends bytes upstream; resolves after the server stored them. Retries on reconnect with the same cmid. */
  send(b: Uint8Array, cmid: string = randomId()): Promise<{ dup: boolean }> {
    return new Promise((resolve, reject) => {
      const id = this.nextId++;
      const body = new Uint8Array(b); // a copy: the app may reuse its buffer before the server acks
      this.sends.add(id, { cmid, b: body, resolve, reject });
      if (this.stateValue.type === "live" || this.stateValue.type === "syncing") this.write({ t: "SEND", id, cmid, b: body });
    });
  }

  // ---- connection ----------------------------------------------------------------------------

  private async connect(): Promise<void> {
    if (this.stateValue.type === "closed") return;
    this.setState({ type: "connecting", attempt: this.backoff.attempt });
    // The entry in the app's hands finishes first: the AUTH cursor must be where applying stopped.
    await this.loop.idle();
    const timeoutMs = this.opts.connectTimeoutMs ?? 10_000;
    const started = this.clock.monotonic();
    const token = await this.appToken(timeoutMs);
    // The app may have closed while the token was fetched.
    if ((this.stateValue as ClientState).type === "closed") return;
    if (token === undefined) {
      this.scheduleReconnect();
      return;
    }
    this.sessionToken = token;
    this.open(token, Math.max(0, timeoutMs - (this.clock.monotonic() - started)));
  }

  /**
   * The app's `token()`, or undefined when it failed or did not answer within `timeoutMs`: the
   * whole attempt is bounded by connectTimeoutMs, and a token callback that hangs must not hold
   * the client in "connecting" for good.
   */
  private async appToken(timeoutMs: number): Promise<string | undefined> {
    let timer: Timer | undefined;
    try {
      return await Promise.race([
        Promise.resolve(this.opts.token()),
        new Promise<undefined>((resolve) => (timer = this.clock.setTimeout(() => resolve(undefined), timeoutMs))),
      ]);
    } catch {
      return undefined;
    } finally {
      this.clock.clearTimeout(timer);
    }
  }

  /** Opens a socket to the next gateway and AUTHs on it; without AUTH_OK in `timeoutMs` it is given up. */
  private open(token: string, timeoutMs: number): void {
    const urls = typeof this.opts.url === "string" ? [this.opts.url] : this.opts.url;
    const ws = new this.WS(urls[(this.urlBase + this.backoff.attempt) % urls.length]!);
    this.ws = ws;
    ws.binaryType = "arraybuffer";
    ws.onopen = () => {
      this.heartbeat.heard();
      const cursor = this.position.cursor;
      this.write({ t: "AUTH", v: 1, token, device: this.opts.device, ...(cursor ? { cursor } : {}), ...(this.opts.lanes ? { lanes: this.opts.lanes } : {}) });
    };
    ws.onmessage = (ev) => this.onMessage(ev.data);
    ws.onerror = () => undefined; // onclose follows
    ws.onclose = (ev) => this.onClose(ev.code, ev.reason);
    this.connectTimer = this.clock.setTimeout(() => this.abandon(DeviceClose.CONNECT_TIMEOUT), timeoutMs);
  }

  private onClose(code: number, reason: string): void {
    this.teardown();
    // A session that applied entries starts the backoff over, as SYNCED does: a device too slow
    // for its catch-up (closed 4408 before each SYNCED) comes back at the first step while it gets
    // somewhere, not after a wait that doubles with every session that moved its cursor.
    if (this.progressed) this.backoff.reset();
    this.progressed = false;
    this.emit({ type: "closed", code, reason });
    if (this.stateValue.type === "closed") return;
    const next = afterClose(code, reason);
    if (next.type === "stop") {
      if (next.event) this.emit(next.event);
      this.setState({ type: "closed", reason: next.reason });
      this.sends.rejectAll(next.error);
      return;
    }
    if (next.type === "now") {
      this.emit(next.event);
      this.backoff.now();
    }
    this.scheduleReconnect();
  }

  private teardown(): void {
    this.clock.clearTimeout(this.connectTimer);
    this.heartbeat.stop();
    this.refresh.stop();
    this.acks.flush();
    // What the dead connection delivered and the app has not applied yet comes again after the cursor
    this.loop.clear();
    this.perform(this.position.apply({ type: "connection_lost" }));
    this.pulls.loseAll();
    if (this.ws) {
      this.ws.onmessage = null;
      this.ws.onclose = null;
      this.ws.onopen = null;
    }
  }

  private scheduleReconnect(): void {
    const { attempt, delayMs } = this.backoff.next();
    this.setState({ type: "waiting", attempt, delayMs });
    this.stats.reconnects++;
    this.reconnectTimer = this.clock.setTimeout(() => void this.connect(), delayMs);
  }

  private write(frame: ClientFrame): void {
    if (this.ws?.readyState === OPEN) this.ws.send(encodeFrame(frame));
  }

  private pull(after: MailboxSeq): Promise<PullReply> {
    if (this.ws?.readyState !== OPEN) return Promise.resolve({ type: "lost" });
    const id = this.nextId++;
    return this.pulls.request(id, () => this.write({ t: "PULL", id, after, limit: PULL_LIMIT }));
  }

  /** Does what the position answered: the store follows it in order (a clear after the saves before it, never overtaken by one). */
  private perform(actions: PositionAction[]): void {
    for (const a of actions) {
      const step = a.type === "save" ? () => this.store.save(a.cursor) : () => this.store.clear();
      this.saveChain = this.saveChain.then(step).catch(() => undefined);
    }
  }

  // ---- frames --------------------------------------------------------------------------------

  private onMessage(data: unknown): void {
    this.heartbeat.heard();
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
        if (f.id !== undefined) this.pulls.answer(f.id, { type: "entries", entries: f.e, more: f.more ?? false });
        else void this.loop.push({ type: "entries", shard: f.shard, entries: f.e });
        return;
      case "SYNCED":
        // the end of catch-up, in order with the entries before it
        void this.loop.push({ type: "synced" }).then(() => {
          if (this.stateValue.type === "syncing") {
            this.backoff.reset();
            this.setState({ type: "live" });
            this.emit({ type: "synced", seq: this.position.seq });
          }
        });
        return;
      case "SEND_OK":
        this.sends.resolve(f.id, { dup: f.dup });
        return;
      case "GOAWAY":
        this.backoff.retryAfter(f.retry_ms);
        return;
      case "PONG":
        return;
      case "REFRESH_OK":
        this.refresh.schedule(f.exp);
        return;
      default: {
        // A frame type added to ServerFrame and handled nowhere fails to compile here; at run time
        // (the decoder's type list ahead of this switch) it closes as an undecodable frame does.
        const _unhandled: never = f;
        this.ws?.close(DeviceClose.BAD_SERVER_FRAME.code, DeviceClose.BAD_SERVER_FRAME.reason);
        return;
      }
    }
  }

  private onAuthOk(f: Extract<ServerFrame, { t: "AUTH_OK" }>): void {
    this.clock.clearTimeout(this.connectTimer);
    // refreshed before the session's token expires, so the gateway does not close the session at expiry
    this.refresh.schedule(tokenExpiry(this.sessionToken));
    // after a CURSOR_REBASED that came before it
    void this.loop.push({ type: "auth_ok", cursor: f.cursor, from: f.from });
    this.setState({ type: "syncing" });
    this.heartbeat.start(f.hb);
    for (const [id, s] of this.sends.all()) this.write({ t: "SEND", id, cmid: s.cmid, b: s.b });
  }

  private onError(f: ErrorFrame): void {
    this.emit({ type: "error", frame: f });
    if (f.code === ErrorCode.CURSOR_REBASED && f.new_cursor && f.replay_from_seq !== undefined) {
      // Every hop in `old_ranges`; a gateway older than it sends the first hop alone in `old_range`.
      const oldRanges = f.old_ranges !== undefined && f.old_ranges.length > 0 ? f.old_ranges : f.old_range !== undefined ? [f.old_range] : [];
      void this.loop.push({ type: "rebased", to: f.replay_from_seq, cursor: f.new_cursor, oldRanges });
      return;
    }
    if (f.code === ErrorCode.CURSOR_EXPIRED && f.new_cursor) {
      const trimWatermark = f.trim_watermark ?? 0n;
      this.loop.rebuild(() => this.opts.onRebuild?.({ trimWatermark }));
      // AUTH_OK's `from` (the head) is the position after a rebuild
      this.perform(this.position.apply({ type: "expired", cursor: f.new_cursor }));
      return;
    }
    if (f.code === ErrorCode.CURSOR_INVALID) {
      this.stats.cursorInvalid++;
      this.perform(this.position.apply({ type: "invalid", cursor: f.new_cursor }));
      this.emit({ type: "cursor_invalid", reason: f.msg });
      return;
    }
    // UNAVAILABLE (4503 follows): the gateway says when to come back, as a GOAWAY does
    if (f.code === ErrorCode.UNAVAILABLE && f.fatal && f.retry_ms !== undefined) this.backoff.retryAfter(f.retry_ms);
    const id = f.id;
    if (id === undefined) return;
    // a gap's PULL refused (BAD_REQUEST): the gap cannot be filled on this session, and waiting
    // for an answer would stall applying; a new session resumes from the cursor, before the gap
    if (this.pulls.has(id)) {
      this.abandon(DeviceClose.RECONNECT);
      return;
    }
    const s = this.sends.get(id);
    if (s === undefined) return;
    if (f.code === ErrorCode.INTERNAL) this.clock.setTimeout(() => this.write({ t: "SEND", id, cmid: s.cmid, b: s.b }), SEND_RETRY_MS);
    else if (f.code === ErrorCode.TOO_LARGE) this.sends.reject(id, new JetgateClientError(f.code, f.msg));
  }
}
