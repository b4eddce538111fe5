/**
 * One device connection. Talks to the socket only through `Transport` (write-only, centrifuge
 * style), so it is driven the same way by uWS and by tests.
 *
 * Frames of one session are handled one at a time on a serial chain (hocuspocus style): an async
 * step (AUTH, a catch-up page, a gap fill) cannot be overtaken by the next frame or push.
 *
 * Delivery invariant: every entry goes out through `emit`, which sends only seqs above the last one
 * sent on this connection; anything else is dropped and counted as a regression (never expected).
 */
import {
  CloseCode,
  ErrorCode,
  FrameError,
  closeReasons,
  decodeClientFrame,
  encodeEntry,
  encodeFrame,
  encodeMsgsFrame,
  ingressMsgId,
  ingressSubject,
  seqEpoch,
  type AckFrame,
  type AuthFrame,
  type RefreshFrame,
  type CursorToken,
  type Entry,
  type MailboxSeq,
  type PullFrame,
  type Push,
  type RegistryState,
  type SendFrame,
  type ServerFrame,
} from "../protocol/index.js";
import { decideAuth, type AuthDecision } from "./auth-decision.js";
import type { GatewayContext } from "./context.js";
import type { Watermarks } from "./mailbox-reader.js";

export interface Transport {
  /** Queues bytes; false when the socket's buffer is building up. */
  send(bytes: Uint8Array): boolean;
  /** Bytes queued and not yet written to the socket. */
  buffered(): number;
  close(code: number, reason: string): void;
}

export type SessionState =
  | { type: "awaiting_auth" }
  | { type: "authenticating" }
  | { type: "syncing" }
  | { type: "live" }
  | { type: "closed"; code: number };

/** An entry's bytes, encoded once however many sessions send it (fan-out shares the Entry object). */
const encodings = new WeakMap<Entry, Uint8Array>();
function encodedOnce(e: Entry): Uint8Array {
  let b = encodings.get(e);
  if (b === undefined) encodings.set(e, (b = encodeEntry(e)));
  return b;
}

/** Bytes per MSGS frame during catch-up. */
const FRAME_BYTES = 64 * 1024;
/** Catch-up waits for the socket to drain above this many buffered bytes. */
const PACE_BYTES = 256 * 1024;
/** Live pushes kept while syncing; beyond it the session re-reads from the stream instead. */
const MAX_HELD_PUSHES = 10_000;
/** The longest delay setTimeout honours. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/** Whether the registry has seen the cursor's shard, its (epoch, log) and the epoch of its seq. */
function registryKnows(state: RegistryState, c: { shard: number; epoch: number; log: string; seq: MailboxSeq }): boolean {
  const s = state.shards.get(c.shard);
  if (s === undefined || c.epoch > s.epoch || seqEpoch(c.seq) > s.epoch) return false;
  return s.boundaries.some((b) => b.epoch === c.epoch && b.log === c.log);
}

export class Session {
  state: SessionState = { type: "awaiting_auth" };
  user = "";
  device = "";
  shard = -1;
  epoch = -1;
  log = "";
  /** Last seq sent on this connection (the cursor the device will report). */
  private lastSent: MailboxSeq = 0n;
  /** Highest seq this session has accounted for, sent or filtered out by its lanes. */
  private lastKnown: MailboxSeq = 0n;
  private lanes: Set<string> | undefined;
  private chain: Promise<void> = Promise.resolve();
  private held: Push[] = [];
  private heldOverflow = false;
  private drainWaiter: (() => void) | undefined;
  private authTimer: NodeJS.Timeout | undefined;
  private expiryTimer: NodeJS.Timeout | undefined;
  private ackedSeq: MailboxSeq = 0n;
  private ackFlushed: MailboxSeq = 0n;
  private bucket: number;
  private bucketAt = Date.now();

  constructor(
    readonly id: string,
    private readonly t: Transport,
    private readonly ctx: GatewayContext,
  ) {
    this.bucket = ctx.config.JETGATE_RATE_BURST;
    this.authTimer = setTimeout(() => {
      if (this.state.type === "awaiting_auth" || this.state.type === "authenticating") {
        this.ctx.metrics.authOutcomes.inc({ case: "timeout" });
        this.close(CloseCode.UNAUTHENTICATED, "auth timeout");
      }
    }, ctx.config.JETGATE_AUTH_TIMEOUT_MS);
  }

  get closed(): boolean {
    return this.state.type === "closed";
  }

  // ---- socket events -----------------------------------------------------------------------

  /** A frame from the device; `bytes` must already be a copy (uWS reuses its buffer). */
  onFrame(bytes: Uint8Array, isBinary: boolean): void {
    if (this.closed) return;
    this.ctx.metrics.bytesIn.inc(bytes.byteLength);
    if (!this.takeToken()) return;
    let frame;
    try {
      frame = decodeClientFrame(isBinary ? bytes : "text", { maxBytes: this.ctx.config.JETGATE_MAX_PAYLOAD });
    } catch (err) {
      if (!(err instanceof FrameError)) throw err;
      this.ctx.metrics.framesIn.inc({ type: "invalid" });
      this.fail(err.reason === "too_large" ? ErrorCode.TOO_LARGE : ErrorCode.BAD_FRAME, err.message, err.reason === "too_large" ? CloseCode.TOO_LARGE : CloseCode.BAD_FRAME);
      return;
    }
    this.ctx.metrics.framesIn.inc({ type: frame.t });
    if (frame.t === "AUTH") {
      if (this.state.type !== "awaiting_auth") {
        this.fail(ErrorCode.BAD_FRAME, "AUTH was already sent on this connection", CloseCode.BAD_FRAME);
        return;
      }
      this.state = { type: "authenticating" };
      this.enqueue(() => this.auth(frame));
      return;
    }
    if (this.state.type === "awaiting_auth" || this.state.type === "authenticating") {
      this.fail(ErrorCode.UNAUTHORIZED, `${frame.t} before AUTH`, CloseCode.UNAUTHENTICATED);
      return;
    }
    switch (frame.t) {
      case "PING":
        this.send({ t: "PONG", ...(frame.id !== undefined ? { id: frame.id } : {}) });
        return;
      case "ACK":
        this.ack(frame);
        return;
      case "PULL":
        this.enqueue(() => this.pull(frame));
        return;
      case "SEND":
        // Not on the chain: an ingress publish must not wait behind a long catch-up.
        void this.sendUpstream(frame);
        return;
      case "REFRESH":
        void this.refresh(frame);
        return;
    }
  }

  /**
   * Closes the session (4401) when its token expires, unless a REFRESH moves the expiry. Node
   * fires a timer longer than 2^31-1 ms at once, so a far expiry is reached in steps.
   */
  private armExpiry(expiresAt: number): void {
    clearTimeout(this.expiryTimer);
    const delay = Math.max(0, expiresAt - Date.now());
    this.expiryTimer = delay > MAX_TIMER_MS
      ? setTimeout(() => this.armExpiry(expiresAt), MAX_TIMER_MS)
      : setTimeout(() => this.close(CloseCode.UNAUTHENTICATED, "token expired"), delay);
  }

  private async refresh(frame: RefreshFrame): Promise<void> {
    let claims;
    try {
      claims = await this.ctx.tokens.verify(frame.token);
    } catch (err) {
      this.ctx.metrics.authOutcomes.inc({ case: "unauthorized" });
      this.fail(ErrorCode.UNAUTHORIZED, `refresh refused: ${(err as Error).message}`, CloseCode.UNAUTHENTICATED);
      return;
    }
    if (this.closed) return;
    if (claims.user !== this.user || (claims.device !== undefined && claims.device !== this.device)) {
      this.ctx.metrics.authOutcomes.inc({ case: "unauthorized" });
      this.fail(ErrorCode.UNAUTHORIZED, "refresh token is for another user or device", CloseCode.UNAUTHENTICATED);
      return;
    }
    this.armExpiry(claims.expiresAt);
    this.send({ t: "REFRESH_OK", ...(frame.id !== undefined ? { id: frame.id } : {}), exp: claims.expiresAt });
  }

  onDrain(): void {
    const w = this.drainWaiter;
    this.drainWaiter = undefined;
    w?.();
  }

  /** The socket is gone (any reason). Never touch the transport after this. */
  onClosed(code: number): void {
    if (this.closed) return;
    this.state = { type: "closed", code };
    this.cleanup();
  }

  private cleanup(): void {
    clearTimeout(this.authTimer);
    clearTimeout(this.expiryTimer);
    this.onDrain();
    this.held = [];
    // every connection, authenticated or not (one that never sent AUTH used to stay in the set:
    // a memory leak any client could drive; the fuzzer found it)
    this.ctx.sessions.remove(this);
    if (this.user !== "") {
      this.flushAck();
      void this.ctx.presence.release(this.user, this.device, this.id, this.authAt).catch(() => undefined);
    }
  }

  /** Closes with a code (idempotent). */
  close(code: number, reason = closeReasons[code as keyof typeof closeReasons] ?? ""): void {
    if (this.closed) return;
    this.ctx.metrics.closes.inc({ code: String(code) });
    this.state = { type: "closed", code };
    try {
      this.t.close(code, reason);
    } finally {
      this.cleanup();
    }
  }

  // ---- output --------------------------------------------------------------------------------

  private send(frame: ServerFrame): void {
    this.sendBytes(encodeFrame(frame), frame.t);
  }

  private sendBytes(bytes: Uint8Array, type: string): void {
    if (this.closed) return;
    this.t.send(bytes);
    this.ctx.metrics.framesOut.inc({ type });
    this.ctx.metrics.bytesOut.inc(bytes.byteLength);
    if (this.t.buffered() > this.ctx.config.JETGATE_MAX_BACKPRESSURE) {
      this.ctx.metrics.slowConsumers.inc();
      this.close(CloseCode.SLOW_CONSUMER);
    }
  }

  private fail(code: ErrorCode, msg: string, closeCode: number): void {
    this.send({ t: "ERROR", code, msg, fatal: true });
    this.close(closeCode, msg.slice(0, 100));
  }

  private cursorToken(): CursorToken {
    return this.ctx.cursors.sign(this.user, this.shard, this.epoch, this.log);
  }

  /**
   * Sends entries of `shard` in increasing seq order, never one at or below the last sent.
   * Entries of lanes this device did not ask for are accounted for but not sent.
   */
  private async emit(shard: number, entries: Entry[], paced: boolean): Promise<void> {
    let frame: Uint8Array[] = [];
    let bytes = 0;
    const flush = async () => {
      if (frame.length === 0) return;
      this.sendBytes(encodeMsgsFrame(shard, frame), "MSGS");
      frame = [];
      bytes = 0;
      if (paced && this.t.buffered() > PACE_BYTES && !this.closed) await new Promise<void>((r) => (this.drainWaiter = r));
    };
    for (const e of entries) {
      if (this.closed) return;
      if (e.seq > this.lastKnown) this.lastKnown = e.seq;
      if (this.lanes !== undefined && !this.lanes.has(e.lane)) continue;
      if (e.seq <= this.lastSent) {
        this.ctx.metrics.regressions.inc({ component: "gateway" });
        continue;
      }
      const enc = encodedOnce(e);
      frame.push(enc);
      bytes += enc.byteLength;
      this.lastSent = e.seq;
      if (bytes >= FRAME_BYTES) await flush();
    }
    await flush();
  }

  private enqueue(step: () => Promise<void>): void {
    this.pendingSteps++;
    this.chain = this.chain
      .then(step)
      .catch((err: unknown) => {
        if (this.closed) return;
        this.ctx.log.error({ err, session: this.id, user: this.user }, "session step failed");
        this.fail(ErrorCode.INTERNAL, "internal error", CloseCode.INTERNAL);
      })
      .finally(() => this.pendingSteps--);
  }

  private pendingSteps = 0;
  /** When the AUTH frame arrived (ms): of two sessions of one device, the later AUTH wins. */
  authAt = 0;

  private get chainIdle(): boolean {
    return this.pendingSteps === 0;
  }

  // ---- AUTH and catch-up ---------------------------------------------------------------------

  private async auth(frame: AuthFrame): Promise<void> {
    this.authAt = Date.now();
    let claims;
    try {
      claims = await this.ctx.tokens.verify(frame.token);
    } catch (err) {
      this.ctx.metrics.authOutcomes.inc({ case: "unauthorized" });
      this.fail(ErrorCode.UNAUTHORIZED, (err as Error).message, CloseCode.UNAUTHENTICATED);
      return;
    }
    if (this.closed) return;
    if (claims.device !== undefined && claims.device !== frame.device) {
      this.ctx.metrics.authOutcomes.inc({ case: "unauthorized" });
      this.fail(ErrorCode.UNAUTHORIZED, "token is bound to another device", CloseCode.UNAUTHENTICATED);
      return;
    }
    if (this.ctx.sessions.countForUser(claims.user) >= this.ctx.config.JETGATE_MAX_CONNS_PER_USER) {
      this.ctx.metrics.authOutcomes.inc({ case: "too_many_connections" });
      this.fail(ErrorCode.RATE_LIMITED, "too many connections for this user", CloseCode.RATE_LIMITED);
      return;
    }
    this.user = claims.user;
    this.device = frame.device;
    this.lanes = frame.lanes ? new Set(frame.lanes) : undefined;
    this.armExpiry(claims.expiresAt);
    if ((await this.ctx.presence.claim(this.user, this.device, this.id, this.authAt)) === "superseded") {
      this.close(CloseCode.REPLACED, "a newer session of this device exists");
      return;
    }
    if (this.closed) return;
    this.ctx.sessions.add(this);
    if (this.closed) return; // a newer session of the device is here already
    clearTimeout(this.authTimer);

    const cursor = frame.cursor;
    // A cursor from a newer registry view than this gateway's (another gateway served it after a
    // takeover this one has not followed yet): read the registry head before deciding, or the
    // cursor would look expired or forged (the NATS R3 fault scenario found that).
    if (cursor !== undefined && !registryKnows(this.ctx.registry.state, cursor)) {
      // Deciding on a view known to be behind would call a good cursor invalid or expired: the
      // device would start over and get entries numbered below what it holds (the NATS R3 fault
      // scenario saw exactly that while the registry stream changed leader). Retry later instead.
      const synced = await this.ctx.registry.sync().then(() => true, () => false);
      if (!synced && !this.closed) {
        this.ctx.metrics.authOutcomes.inc({ case: "registry_unavailable" });
        this.fail(ErrorCode.INTERNAL, "registry unavailable: reconnect later", CloseCode.INTERNAL);
        return;
      }
    }
    if (this.closed) return;
    // One registry view for the whole decision: the registry may change during the reads below,
    // and `start` re-checks against this view once the session is watched.
    const reg = this.ctx.registry.state;
    const userShard = this.ctx.registry.shards.shardOf(this.user);
    if (userShard === undefined) throw new Error("no shard owns this user");
    if (this.ctx.config.JETGATE_FAULT_AUTH_PAUSE_MS > 0) await new Promise((r) => setTimeout(r, this.ctx.config.JETGATE_FAULT_AUTH_PAUSE_MS));
    const wm = await this.ctx.reader.watermarks(userShard, this.user);
    const trims = new Map<number, MailboxSeq>([[userShard, await this.ctx.reader.trim(userShard)]]);
    if (cursor !== undefined && cursor.shard !== userShard && reg.shards.has(cursor.shard)) {
      trims.set(cursor.shard, await this.ctx.reader.trim(cursor.shard));
    }
    const decision = decideAuth({
      user: this.user,
      cursor: cursor && { ...cursor, sigValid: this.ctx.cursors.verify(this.user, cursor) },
      registry: reg,
      userShard,
      trims,
      head: wm.head,
    });
    this.ctx.metrics.authOutcomes.inc({ case: decision.case });
    if (this.closed) return;
    await this.start(decision, wm, cursor?.seq, true, reg);
  }

  /**
   * Answers a decision inline: the rebase/expired/invalid ERROR frame if any, AUTH_OK (on AUTH),
   * old ranges, catch-up, SYNCED, then live.
   */
  private async start(decision: AuthDecision, wm: Watermarks, deviceSeq: MailboxSeq | undefined, isAuth: boolean, decidedOn: RegistryState): Promise<void> {
    this.state = { type: "syncing" };
    this.shard = decision.shard;
    this.epoch = decision.epoch;
    this.log = decision.log;
    this.ctx.sessions.watch(this);
    // A registry change between the decision's view and `watch` reached no session of this one's
    // shard: look again after this start (a split landing mid-AUTH left a moved user's session on
    // the parent for good; the split fault scenario found it).
    if (this.ctx.registry.state !== decidedOn) this.onShardChange();
    const token = this.cursorToken();
    const trim = await this.ctx.reader.trim(decision.shard);
    switch (decision.case) {
      case "rebased":
      case "rebased_new_log":
      case "split":
        this.send({
          t: "ERROR", code: ErrorCode.CURSOR_REBASED, msg: decision.reason ?? `cursor rebased (${decision.case})`, fatal: false,
          new_cursor: token, replay_from_seq: decision.replayFrom ?? decision.from,
          ...(decision.oldRanges && decision.oldRanges.length > 0 ? { old_range: decision.oldRanges[0] } : {}),
        });
        break;
      case "expired":
        this.send({
          t: "ERROR", code: ErrorCode.CURSOR_EXPIRED, msg: decision.reason ?? "cursor expired", fatal: false,
          trim_watermark: decision.trim ?? trim, rebuild_required: true, new_cursor: token,
        });
        break;
      case "invalid":
        if (deviceSeq !== undefined) this.send({ t: "ERROR", code: ErrorCode.CURSOR_INVALID, msg: decision.reason ?? "cursor invalid", fatal: false, new_cursor: token });
        break;
    }
    if (isAuth) {
      this.send({
        t: "AUTH_OK", session: this.id, user: this.user, shard: this.shard, epoch: this.epoch, cursor: token,
        from: decision.from, head: wm.head, trim, lanes: Object.fromEntries(wm.lanes), hb: this.ctx.config.JETGATE_HEARTBEAT_MS,
      });
    }
    // Old ranges of a split: their seqs (parent numbering) are all below the child's.
    let base = deviceSeq !== undefined && deviceSeq > this.lastSent ? deviceSeq : this.lastSent;
    for (const r of decision.oldRanges ?? []) {
      this.lastSent = base > r.after ? base : r.after;
      this.lastKnown = this.lastSent;
      for await (const page of this.ctx.reader.read(r.shard, this.user, r.after, { until: r.until })) {
        this.ctx.metrics.catchupEntries.inc({ source: page.source }, page.entries.length);
        await this.emit(r.shard, page.entries, true);
      }
      base = this.lastSent;
    }
    if (decision.from > this.lastSent || decision.case !== "normal") this.lastSent = decision.from > this.lastSent ? decision.from : this.lastSent;
    this.lastKnown = this.lastSent;
    await this.catchUp(wm);
  }

  /** Everything after lastSent in the current shard, then the pushes held meanwhile, then live. */
  private async catchUp(wm: Watermarks): Promise<void> {
    if (wm.head > this.lastSent || wm.from === "stream") {
      for await (const page of this.ctx.reader.read(this.shard, this.user, this.lastSent, { wm })) {
        if (this.closed) return;
        this.ctx.metrics.catchupEntries.inc({ source: page.source }, page.entries.length);
        await this.emit(this.shard, page.entries, true);
      }
    }
    await this.releaseHeld();
    if (this.closed) return;
    this.send({ t: "SYNCED", seq: this.lastSent });
    this.state = { type: "live" };
  }

  /**
   * Anti-entropy for live sessions: a push lost with no later entry of the user (a NATS node dying
   * with it in flight) would otherwise wait for the device's next reconnect. The registry of
   * sessions calls this every JETGATE_TAIL_CHECK_S per session: when the user's head (the Redis
   * watermark; one HGET) is past what this session accounted for, the rest is read and sent
   * through the session's chain, in order with live pushes. Found by the NATS R3 fault scenario.
   */
  checkTail(): void {
    if (this.state.type !== "live" || !this.chainIdle) return;
    this.enqueue(async () => {
      // Redis only: the worker raises the watermark before it pushes, so a lost push shows there
      const head = await this.ctx.reader.cachedHead(this.user).catch(() => undefined);
      if (head === undefined || head <= this.lastKnown || this.closed) return;
      const wm = await this.ctx.reader.watermarks(this.shard, this.user);
      this.ctx.metrics.tailFills.inc();
      for await (const page of this.ctx.reader.read(this.shard, this.user, this.lastKnown, { wm })) {
        await this.emit(this.shard, page.entries, true);
      }
    });
  }

  private async releaseHeld(): Promise<void> {
    while (!this.closed) {
      if (this.heldOverflow) {
        // Too many pushes arrived while syncing: read the stream again instead of keeping them.
        this.heldOverflow = false;
        this.held = [];
        for await (const page of this.ctx.reader.read(this.shard, this.user, this.lastKnown)) {
          await this.emit(this.shard, page.entries, true);
        }
        continue;
      }
      const next = this.held.shift();
      if (next === undefined) return;
      await this.deliver(next);
    }
  }

  // ---- live ----------------------------------------------------------------------------------

  /** A live push for this user (already checked against the registry's epoch by the fan-out). */
  onPush(push: Push): void {
    if (this.closed || this.state.type === "awaiting_auth" || this.state.type === "authenticating") return;
    if (push.shard !== this.shard) return;
    if (this.state.type === "syncing") {
      if (this.held.length >= MAX_HELD_PUSHES) this.heldOverflow = true;
      else this.held.push(push);
      return;
    }
    // Live: the common case needs no await; a gap or a busy chain goes through the chain.
    if (this.chainIdle && push.entry.seq > this.lastKnown && push.prevAll !== null && push.prevAll <= this.lastKnown) {
      void this.emit(this.shard, [push.entry], false);
      return;
    }
    this.enqueue(() => this.deliver(push));
  }

  private async deliver(push: Push): Promise<void> {
    if (push.entry.seq <= this.lastKnown) {
      this.ctx.metrics.duplicatesDropped.inc();
      return;
    }
    // A lost push (or one whose predecessor the worker could not know): fill from the stream first.
    if (push.prevAll === null || push.prevAll > this.lastKnown) {
      this.ctx.metrics.gapFills.inc();
      const got = await this.ctx.reader.fill(this.shard, this.user, this.lastKnown, push.entry.seq);
      if (got === "too_many") {
        for await (const page of this.ctx.reader.read(this.shard, this.user, this.lastKnown, { until: push.entry.seq - 1n })) {
          await this.emit(this.shard, page.entries, true);
        }
      } else {
        await this.emit(this.shard, got, false);
      }
    }
    await this.emit(this.shard, [push.entry], false);
  }

  /** The registry changed this session's shard (epoch bump, split): rebase mid-session. */
  onShardChange(): void {
    if (this.state.type !== "live" && this.state.type !== "syncing") return;
    this.enqueue(async () => {
      const reg = this.ctx.registry.state;
      const cur = reg.shards.get(this.shard);
      const userShard = this.ctx.registry.shards.shardOf(this.user);
      if (cur === undefined || userShard === undefined) return;
      if (cur.epoch === this.epoch && cur.log === this.log && userShard === this.shard) return;
      const seqEpochOf = Number(this.lastSent >> 48n);
      const cursorEpoch = Math.max(this.epoch, Math.min(seqEpochOf, cur.epoch));
      const wm = await this.ctx.reader.watermarks(userShard, this.user);
      const trims = new Map<number, MailboxSeq>([[userShard, await this.ctx.reader.trim(userShard)]]);
      if (userShard !== this.shard) trims.set(this.shard, await this.ctx.reader.trim(this.shard));
      const decision = decideAuth({
        user: this.user,
        cursor: { shard: this.shard, epoch: cursorEpoch, log: this.log, seq: this.lastSent, sigValid: true },
        registry: reg, userShard, trims, head: wm.head,
      });
      // Same epoch after all (the session already saw the new epoch's pushes): a new token only.
      const d: AuthDecision = decision.case === "normal" ? { ...decision, case: "rebased", replayFrom: this.lastSent } : decision;
      this.ctx.metrics.midSessionRebases.inc({ case: d.case });
      await this.start(d, wm, this.lastSent, false, reg);
    });
  }

  // ---- requests ------------------------------------------------------------------------------

  private ack(frame: AckFrame): void {
    if (frame.seq > this.ackedSeq) this.ackedSeq = frame.seq;
    // Written at most once a second per session (and on close): ACKs are frequent, Redis is shared.
    if (this.ackTimer === undefined) {
      this.ackTimer = setTimeout(() => {
        this.ackTimer = undefined;
        this.flushAck();
      }, 1000);
    }
  }

  private ackTimer: NodeJS.Timeout | undefined;

  private flushAck(): void {
    if (this.ackedSeq <= this.ackFlushed || this.user === "") return;
    this.ackFlushed = this.ackedSeq;
    void this.ctx.acks.store(this.user, this.device, this.ackedSeq).catch(() => undefined);
  }

  private async pull(frame: PullFrame): Promise<void> {
    const entries: Entry[] = [];
    let more = false;
    const lane = frame.lane;
    // Read until limit + 1 entries pass the lane filters (the extra one only says `more`).
    const unfiltered = lane === undefined && this.lanes === undefined;
    for await (const page of this.ctx.reader.read(this.shard, this.user, frame.after, unfiltered ? { limit: frame.limit + 1 } : {})) {
      for (const e of page.entries) {
        if (lane !== undefined && e.lane !== lane) continue;
        if (this.lanes !== undefined && !this.lanes.has(e.lane)) continue;
        if (entries.length === frame.limit) {
          more = true;
          break;
        }
        entries.push(e);
      }
      if (more) break;
    }
    // A PULL reply answers an explicit request; it is not the live stream and does not move lastSent.
    this.sendBytes(encodeMsgsFrame(this.shard, entries.map(encodeEntry), { id: frame.id, more }), "MSGS");
  }

  private async sendUpstream(frame: SendFrame): Promise<void> {
    if (frame.b.byteLength > this.ctx.config.JETGATE_MAX_BODY_BYTES) {
      this.send({ t: "ERROR", code: ErrorCode.TOO_LARGE, msg: `body over ${this.ctx.config.JETGATE_MAX_BODY_BYTES} bytes`, fatal: false, id: frame.id });
      return;
    }
    try {
      const ack = await this.ctx.js.publish(ingressSubject(this.user, this.device), frame.b, { msgID: ingressMsgId(this.user, this.device, frame.cmid) });
      this.send({ t: "SEND_OK", id: frame.id, cmid: frame.cmid, dup: ack.duplicate });
    } catch (err) {
      this.ctx.log.warn({ err: (err as Error).message, user: this.user }, "ingress publish failed");
      this.send({ t: "ERROR", code: ErrorCode.INTERNAL, msg: "could not accept the message; retry with the same cmid", fatal: false, id: frame.id });
    }
  }

  /**
   * Per-connection token bucket that may go into debt: a frame without a token is refused (the
   * first refusal of a stretch is told with a non-fatal RATE_LIMITED), and a connection whose debt
   * passes the burst is closed with 4429. A client that backs off pays the debt back and recovers;
   * one that keeps flooding is closed however its frames are spaced. The user's bucket (all of the
   * user's connections on this gateway) refuses without debt.
   */
  private takeToken(): boolean {
    const c = this.ctx.config;
    const now = Date.now();
    this.bucket = Math.min(c.JETGATE_RATE_BURST, this.bucket + ((now - this.bucketAt) / 1000) * c.JETGATE_RATE_FRAMES_PER_S);
    this.bucketAt = now;
    this.bucket -= 1;
    if (this.bucket >= 0 && (this.user === "" || this.ctx.sessions.takeUserToken(this.user, now))) {
      this.limited = false;
      return true;
    }
    this.ctx.metrics.rateLimited.inc();
    if (this.bucket < -c.JETGATE_RATE_BURST) {
      this.fail(ErrorCode.RATE_LIMITED, "rate limit exceeded", CloseCode.RATE_LIMITED);
    } else if (!this.limited) {
      this.limited = true;
      this.send({ t: "ERROR", code: ErrorCode.RATE_LIMITED, msg: "slow down", fatal: false });
    }
    return false;
  }

  private limited = false;

  /** GOAWAY before a drain close. */
  goAway(retryMs: number): void {
    this.send({ t: "GOAWAY", reason: "server draining", retry_ms: retryMs });
  }
}
