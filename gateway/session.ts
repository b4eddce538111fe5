/**
 * One device connection. It talks to the world only through ports (gateway/ports.ts): a
 * write-only transport, the mailbox, the registry view, presence, ingress, the ACK store.
 *
 * Frames of one session are handled one at a time on a serial chain (hocuspocus style): an async
 * step (AUTH, a catch-up page, a gap fill) cannot be overtaken by the next frame or push.
 *
 * A cursor is answered in four steps, the same on AUTH and on a mid-session rebase:
 * gather (gather.ts) -> decide (auth-decision.ts) -> answer (answer.ts) -> deliver (here).
 * Every entry goes out through `emit`, which sends only what `Delivery` selects: seqs above the
 * last one sent on this connection (anything else is dropped and counted as a regression).
 */
import {
  CloseCode,
  Disconnect,
  ErrorCode,
  type FatalDisconnect,
  FrameError,
  closeReasons,
  seqEpoch,
  decodeClientFrame,
  encodeEntry,
  encodeFrame,
  encodeMsgsFrame,
  type AckFrame,
  type AuthFrame,
  type Entry,
  type MailboxSeq,
  type PullFrame,
  type Push,
  type RefreshFrame,
  type RegistryState,
  type SendFrame,
  type ServerFrame,
} from "../protocol/index.js";
import { planAnswer, type AnswerFor } from "./answer.js";
import type { CursorIn } from "./auth-decision.js";
import { Delivery } from "./delivery.js";
import { gatherAndDecide, RETRY_LATER_MS, ShardNotReadyError, UnavailableError, type Gathered } from "./gather.js";
import { pullRanges } from "./positions.js";
import type { HubMember, SessionPorts, Transport, Watermarks } from "./ports.js";
import { TokenBucket } from "./rate-limit.js";

export type { Transport } from "./ports.js";

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

/** A live MSGS frame for a batch's pushes of one user, encoded once for all of its sessions that send every one. */
const liveFrames = new WeakMap<readonly Push[], Uint8Array>();
function sharedFrame(pushes: readonly Push[], shard: number): Uint8Array {
  let b = liveFrames.get(pushes);
  if (b === undefined) liveFrames.set(pushes, (b = encodeMsgsFrame(shard, pushes.map((p) => encodedOnce(p.entry)))));
  return b;
}

/** Bytes per MSGS frame during catch-up. */
const FRAME_BYTES = 64 * 1024;
/** Catch-up waits for the socket to drain above this many buffered bytes. */
const PACE_BYTES = 256 * 1024;
/** Live pushes kept while syncing; beyond it the session re-reads the mailbox instead. */
const MAX_HELD_PUSHES = 10_000;

/** Whether the registry has seen the cursor's shard, its (epoch, log) and the epoch of its seq. */
function registryKnows(state: RegistryState, c: CursorIn): boolean {
  const s = state.shards.get(c.shard);
  if (s === undefined || c.epoch > s.epoch || Number(c.seq >> 48n) > s.epoch) return false;
  return s.boundaries.some((b) => b.epoch === c.epoch && b.log === c.log);
}

export class Session implements HubMember {
  state: SessionState = { type: "awaiting_auth" };
  user = "";
  device = "";
  shard = -1;
  epoch = -1;
  log = "";
  /** When the AUTH frame arrived (ms): of two sessions of one device, the later AUTH wins. */
  authAt = 0;
  issuedAt: number | undefined;
  private delivery = new Delivery(undefined, MAX_HELD_PUSHES);
  private chain: Promise<void> = Promise.resolve();
  /** REFRESH frames, one after the other. */
  private refreshes: Promise<void> = Promise.resolve();
  private pendingSteps = 0;
  private drainWaiter: (() => void) | undefined;
  private authTimer: NodeJS.Timeout | undefined;
  /** When the token expires (ms); the hub's sweep closes the session then (expireIfDue). */
  private expiresAt = Infinity;
  private ackTimer: NodeJS.Timeout | undefined;
  /** Where the session stood when a tail check last asked the stream for a head Redis lacked. */
  private tailAskedAt: MailboxSeq | undefined;
  private ackedSeq = 0n;
  /** This session holds its user's route on this gateway (released on close). */
  private routeHeld = false;
  private ackFlushed = 0n;
  private readonly bucket: TokenBucket;
  private limited = false;

  constructor(
    readonly id: string,
    private readonly t: Transport,
    private readonly p: SessionPorts,
  ) {
    const c = p.config;
    this.bucket = new TokenBucket(c.JETGATE_RATE_BURST, c.JETGATE_RATE_FRAMES_PER_S, Date.now(), c.JETGATE_RATE_BURST);
    this.authTimer = setTimeout(() => {
      if (this.state.type === "awaiting_auth" || this.state.type === "authenticating") {
        this.p.metrics.authOutcomes.inc({ case: "timeout" });
        this.close(CloseCode.UNAUTHENTICATED, "auth timeout");
      }
    }, c.JETGATE_AUTH_TIMEOUT_MS).unref();
  }

  get closed(): boolean {
    return this.state.type === "closed";
  }

  // ---- socket events -----------------------------------------------------------------------

  /** A frame from the device; `bytes` must already be a copy (uWS reuses its buffer). */
  onFrame(bytes: Uint8Array, isBinary: boolean): void {
    if (this.closed) return;
    this.p.metrics.bytesIn.inc(bytes.byteLength);
    if (!this.takeToken()) return;
    let frame;
    try {
      frame = decodeClientFrame(isBinary ? bytes : "text", { maxBytes: this.p.config.JETGATE_MAX_PAYLOAD });
    } catch (err) {
      if (!(err instanceof FrameError)) throw err;
      this.p.metrics.framesIn.inc({ type: "invalid" });
      this.fail(err.reason === "too_large" ? Disconnect.TOO_LARGE : Disconnect.BAD_FRAME, err.message);
      return;
    }
    this.p.metrics.framesIn.inc({ type: frame.t });
    if (frame.t === "AUTH") {
      if (this.state.type !== "awaiting_auth") return this.fail(Disconnect.BAD_FRAME, "AUTH was already sent on this connection");
      this.state = { type: "authenticating" };
      this.enqueue(() => this.auth(frame));
      return;
    }
    if (this.state.type === "awaiting_auth" || this.state.type === "authenticating") return this.fail(Disconnect.UNAUTHORIZED, `${frame.t} before AUTH`);
    switch (frame.t) {
      case "PING":
        return this.send({ t: "PONG", ...(frame.id !== undefined ? { id: frame.id } : {}) });
      case "ACK":
        return this.ack(frame);
      case "PULL":
        return this.enqueue(() => this.pull(frame));
      case "SEND":
        // Not on the chain: an ingress publish must not wait behind a long catch-up.
        return void this.sendUpstream(frame);
      case "REFRESH":
        // Not on the chain either (a token must not expire behind a catch-up), but in order among
        // themselves: the expiry is the last frame's, whichever verification finishes first.
        this.refreshes = this.refreshes.then(() => this.refresh(frame)).catch((err: unknown) => {
          this.p.log.error({ err, session: this.id }, "refresh failed");
          this.fail(Disconnect.INTERNAL, "internal error");
        });
        return;
    }
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

  /** Closes with a code (idempotent). */
  close(code: number, reason = closeReasons[code as keyof typeof closeReasons] ?? ""): void {
    if (this.closed) return;
    this.p.metrics.closes.inc({ code: String(code) });
    this.state = { type: "closed", code };
    try {
      this.t.close(code, reason);
    } finally {
      this.cleanup();
    }
  }

  /** GOAWAY before a drain close. */
  goAway(retryMs: number): void {
    this.send({ t: "GOAWAY", reason: "server draining", retry_ms: retryMs });
  }

  private cleanup(): void {
    clearTimeout(this.authTimer);
    this.onDrain();
    this.delivery.clearHeld();
    // every connection, authenticated or not (one that never sent AUTH used to stay in the set)
    this.p.hub.remove(this);
    if (this.routeHeld) {
      this.routeHeld = false;
      this.p.routes.release(this.user);
    }
    if (this.user !== "") {
      this.flushAck();
      void this.p.presence.release(this.user, this.device, this.id, this.authAt).catch(() => undefined);
    }
  }

  // ---- output --------------------------------------------------------------------------------

  private send(frame: ServerFrame): void {
    this.sendBytes(encodeFrame(frame), frame.t);
  }

  private sendBytes(bytes: Uint8Array, type: string): void {
    if (this.closed) return;
    this.t.send(bytes);
    this.p.metrics.frameOut(type).inc();
    this.p.metrics.bytesOut.inc(bytes.byteLength);
    if (this.t.buffered() > this.p.config.JETGATE_MAX_BACKPRESSURE) {
      this.p.metrics.slowConsumers.inc();
      this.close(CloseCode.SLOW_CONSUMER);
    }
  }

  /** A fatal ERROR, then the close its code pairs with. */
  private fail(d: FatalDisconnect, msg: string, extra: { retry_ms?: number } = {}): void {
    this.send({ t: "ERROR", code: d.error, msg, fatal: true, ...extra });
    this.close(d.close, msg.slice(0, 100));
  }

  /** A request refused without closing (BAD_REQUEST, TOO_LARGE, ...), tied to its request id. */
  private refuse(code: ErrorCode, msg: string, id?: number): void {
    this.send({ t: "ERROR", code, msg, fatal: false, ...(id !== undefined ? { id } : {}) });
  }

  /** Sends what `Delivery` selects of `entries` (of `shard`), in MSGS frames; `paced` waits for the socket. */
  private async emit(shard: number, entries: readonly Entry[], paced: boolean): Promise<void> {
    if (this.closed) return;
    // Entries numbered by an epoch this session's token does not have: a step queued before the
    // rebase read them on a registry view that has moved on since (a gap fill after a rebuild).
    // Sent now, they would reach the device under the older epoch's token (CURSOR_INVALID at its
    // next AUTH); the rebase reads them again from what was sent.
    // entries ascend: only when the last is beyond is any (no scan per entry otherwise)
    const last = entries[entries.length - 1];
    const beyond = last !== undefined && seqEpoch(last.seq) > this.epoch ? entries.findIndex((e) => seqEpoch(e.seq) > this.epoch) : -1;
    if (beyond >= 0) {
      this.onShardChange();
      entries = entries.slice(0, beyond);
    }
    const out = this.select(entries);
    let frame: Uint8Array[] = [];
    let bytes = 0;
    for (let i = 0; i < out.length; i++) {
      const enc = encodedOnce(out[i]!);
      frame.push(enc);
      bytes += enc.byteLength;
      if (bytes < FRAME_BYTES && i < out.length - 1) continue;
      this.sendBytes(encodeMsgsFrame(shard, frame), "MSGS");
      frame = [];
      bytes = 0;
      if (this.closed) return;
      if (paced && this.t.buffered() > PACE_BYTES) await new Promise<void>((r) => (this.drainWaiter = r));
    }
  }

  /** What `Delivery` lets out of `entries`, counted. */
  private select(entries: readonly Entry[]): Entry[] {
    const before = this.delivery.regressions;
    const out = this.delivery.select(entries);
    if (this.delivery.regressions > before) this.p.metrics.regressions.inc({ component: "gateway" }, this.delivery.regressions - before);
    if (out.length > 0) this.p.metrics.entriesSent.inc(out.length);
    return out;
  }

  private enqueue(step: () => Promise<void>): void {
    this.pendingSteps++;
    this.chain = this.chain
      .then(step)
      .catch((err: unknown) => {
        if (this.closed) return;
        // A dependency that did not answer, or a live read of a shard whose stream is not there
        // yet: the device resumes by cursor and loses nothing (4500 would name a server fault).
        if (err instanceof UnavailableError || err instanceof ShardNotReadyError) {
          this.p.log.warn({ err: err.message, session: this.id, user: this.user }, "session step: not ready");
          const retryMs = err instanceof UnavailableError ? err.retryMs : RETRY_LATER_MS;
          this.fail(Disconnect.UNAVAILABLE, err.message, { retry_ms: retryMs });
          return;
        }
        this.p.log.error({ err, session: this.id, user: this.user }, "session step failed");
        this.fail(Disconnect.INTERNAL, "internal error");
      })
      .finally(() => this.pendingSteps--);
  }

  private get chainIdle(): boolean {
    return this.pendingSteps === 0;
  }

  // ---- AUTH: gather, decide, answer, deliver --------------------------------------------------

  private async auth(frame: AuthFrame): Promise<void> {
    this.authAt = Date.now();
    if (!(await this.authenticate(frame))) return;
    const cursor: CursorIn | undefined = frame.cursor && { ...frame.cursor, sigValid: this.p.cursors.verify(this.user, frame.cursor) };
    if (!(await this.registryCovers(cursor))) return;
    const g = await gatherAndDecide(this.p.registry, this.p.mailbox, this.user, cursor, { closed: () => this.closed, pauseMs: this.p.config.JETGATE_FAULT_AUTH_PAUSE_MS });
    this.p.metrics.authOutcomes.inc({ case: g.decision.case });
    if (this.closed) return;
    await this.answerAndDeliver(g, {
      kind: "auth", session: this.id, user: this.user, head: g.wm.head, trim: g.input.bounds.get(g.decision.shard)!.trim,
      lanes: g.wm.lanes, hb: this.p.config.JETGATE_HEARTBEAT_MS, hadCursor: cursor !== undefined,
    });
  }

  /** Token, device binding, per-user limit, presence, the hub. False when the session was refused. */
  private async authenticate(frame: AuthFrame): Promise<boolean> {
    let claims;
    try {
      claims = await this.p.tokens.verify(frame.token);
    } catch (err) {
      this.tokenRefused(err);
      this.fail(Disconnect.UNAUTHORIZED, (err as Error).message);
      return false;
    }
    if (this.closed) return false;
    if (claims.device !== undefined && claims.device !== frame.device) {
      this.p.metrics.authOutcomes.inc({ case: "unauthorized" });
      this.fail(Disconnect.UNAUTHORIZED, "token is bound to another device");
      return false;
    }
    if (!this.p.revocations.ready()) {
      this.p.metrics.authOutcomes.inc({ case: "revocations_unavailable" });
      this.fail(Disconnect.UNAVAILABLE, "token revocations not loaded yet: reconnect");
      return false;
    }
    if (this.p.revocations.revoked(claims.user, frame.device, claims.issuedAt, Date.now())) {
      this.p.metrics.authOutcomes.inc({ case: "revoked" });
      this.fail(Disconnect.UNAUTHORIZED, "token revoked");
      return false;
    }
    if (this.p.hub.countForUser(claims.user) >= this.p.config.JETGATE_MAX_CONNS_PER_USER) {
      this.p.metrics.authOutcomes.inc({ case: "too_many_connections" });
      this.fail(Disconnect.RATE_LIMITED, "too many connections for this user");
      return false;
    }
    this.user = claims.user;
    this.device = frame.device;
    this.delivery = new Delivery(frame.lanes ? new Set(frame.lanes) : undefined, MAX_HELD_PUSHES);
    this.armExpiry(claims.expiresAt);
    this.issuedAt = claims.issuedAt;
    // The route is in Redis before the mailbox is read (gateway/routes.ts): what the worker does
    // after it is routed here, what it did before is in the read. Beside the claim: one round trip.
    this.routeHeld = true;
    const [claimed] = await Promise.all([this.p.presence.claim(this.user, this.device, this.id, this.authAt), this.p.routes.acquire(this.user)]);
    if (claimed === "superseded") {
      this.close(CloseCode.REPLACED, "a newer session of this device exists");
      return false;
    }
    if (this.closed) return false;
    this.p.hub.add(this);
    if (this.closed) return false; // a newer session of the device is here already
    // a revocation that came in while this AUTH claimed its presence found no session to end
    if (this.p.revocations.revoked(this.user, this.device, this.issuedAt, Date.now())) {
      this.p.metrics.authOutcomes.inc({ case: "revoked" });
      this.fail(Disconnect.UNAUTHORIZED, "token revoked");
      return false;
    }
    clearTimeout(this.authTimer);
    this.authTimer = undefined; // a cleared Timeout still held is 120 bytes per idle session
    return true;
  }

  /**
   * A cursor from a newer registry view than this gateway's (another gateway served it after a
   * change this one has not followed yet): read the registry head before deciding. Deciding on a
   * view known to be behind would call a good cursor invalid or expired (the NATS R3 fault
   * scenario saw that while the registry stream changed leader): the device retries instead.
   */
  private async registryCovers(cursor: CursorIn | undefined): Promise<boolean> {
    if (cursor === undefined || registryKnows(this.p.registry.state, cursor)) return true;
    const synced = await this.p.registry.sync().then(() => true, () => false);
    if (this.closed) return false;
    if (!synced) {
      this.p.metrics.authOutcomes.inc({ case: "registry_unavailable" });
      this.fail(Disconnect.UNAVAILABLE, "registry unavailable: reconnect later", { retry_ms: RETRY_LATER_MS });
      return false;
    }
    return true;
  }

  /** Answers a decision inline: the ERROR frame if any, AUTH_OK (on AUTH), old ranges, catch-up, SYNCED, live. */
  private async answerAndDeliver(g: Gathered & { decision: Parameters<typeof planAnswer>[0] }, to: AnswerFor): Promise<void> {
    const d = g.decision;
    this.state = { type: "syncing" };
    this.shard = d.shard;
    this.epoch = d.epoch;
    this.log = d.log;
    this.p.hub.watch(this);
    // A registry change between the decision's view and `watch` reached no session of this one's
    // shard: look again after this step (a split landing mid-AUTH left a moved user's session on
    // the parent for good; the split fault scenario found it).
    if (this.p.registry.state !== g.view) this.onShardChange();
    const answer = planAnswer(d, g.view, (s, e, l) => this.p.cursors.sign(this.user, s, e, l), to);
    for (const f of answer.frames) this.send(f);
    // Old ranges of a split: their seqs (older shards' numbering) are all below the new shard's.
    for (const r of answer.ranges) {
      this.delivery.moveTo(r.after);
      for await (const page of this.p.mailbox.read(r.shard, this.user, r.after, { until: r.until })) {
        this.p.metrics.catchupEntries.inc({ source: page.source }, page.entries.length);
        await this.emit(r.shard, page.entries, true);
      }
    }
    this.delivery.moveTo(d.from);
    await this.catchUp(g.wm);
  }

  /** Everything after lastSent in the current shard, then the pushes held meanwhile, then live. */
  private async catchUp(wm: Watermarks): Promise<void> {
    if (wm.head > this.delivery.lastSent || wm.from === "stream") {
      for await (const page of this.p.mailbox.read(this.shard, this.user, this.delivery.lastSent, { wm })) {
        if (this.closed) return;
        this.p.metrics.catchupEntries.inc({ source: page.source }, page.entries.length);
        await this.emit(this.shard, page.entries, true);
      }
    }
    await this.releaseHeld();
    if (this.closed) return;
    this.send({ t: "SYNCED", seq: this.delivery.lastSent });
    this.state = { type: "live" };
  }

  private async releaseHeld(): Promise<void> {
    while (!this.closed) {
      const next = this.delivery.nextHeld();
      if (next === undefined) return;
      if (next === "overflow") {
        // Too many pushes arrived while syncing: read the mailbox again instead of keeping them.
        await this.readAfterKnown();
        continue;
      }
      await this.deliver(next);
    }
  }

  private async readAfterKnown(until?: bigint): Promise<void> {
    for await (const page of this.p.mailbox.read(this.shard, this.user, this.delivery.lastKnown, until === undefined ? {} : { until })) {
      await this.emit(this.shard, page.entries, true);
    }
  }

  /** The registry changed this session's shard (epoch bump, split): rebase mid-session. */
  onShardChange(): void {
    if (this.state.type !== "live" && this.state.type !== "syncing") return;
    this.enqueue(async () => {
      const reg = this.p.registry.state;
      const cur = reg.shards.get(this.shard);
      const userShard = this.p.registry.shards.shardOf(this.user);
      if (cur === undefined || userShard === undefined) return;
      if (cur.epoch === this.epoch && cur.log === this.log && userShard === this.shard) return;
      const position: CursorIn = { shard: this.shard, epoch: this.epoch, log: this.log, seq: this.delivery.lastSent, sigValid: true };
      const g = await gatherAndDecide(this.p.registry, this.p.mailbox, this.user, position, { closed: () => this.closed });
      this.p.metrics.midSessionRebases.inc({ case: g.decision.case });
      if (g.decision.case === "invalid") {
        // The session's own position does not fit the registry (never expected): the device
        // reconnects with its cursor and gets a full AUTH answer.
        this.p.log.warn({ session: this.id, user: this.user, reason: g.decision.reason }, "mid-session rebase: position refused");
        throw new UnavailableError(`cursor rebase failed: ${g.decision.reason}`, 1000);
      }
      await this.answerAndDeliver(g, { kind: "rebase" });
    });
  }

  // ---- live ----------------------------------------------------------------------------------

  /**
   * Live pushes for this user (already checked against the registry's epoch by the hub), in order.
   * The common case (live, nothing on the chain, each push following the one before) goes out at
   * once as one MSGS frame, with no promise; a gap or a busy chain goes through the chain.
   */
  onPushes(pushes: readonly Push[]): void {
    if (this.closed || this.state.type === "awaiting_auth" || this.state.type === "authenticating") return;
    let i = 0;
    if (this.state.type === "live" && this.chainIdle) {
      let known = this.delivery.lastKnown;
      while (i < pushes.length) {
        const p = pushes[i]!;
        if (p.shard !== this.shard || p.epoch > this.epoch || p.entry.seq <= known || p.prevAll === null || p.prevAll > known) break;
        known = p.entry.seq;
        i++;
      }
      if (i > 0) this.emitLive(i === pushes.length ? pushes : pushes.slice(0, i));
    }
    for (; i < pushes.length; i++) {
      const push = pushes[i]!;
      if (push.shard !== this.shard) continue;
      // held pushes go out when the catch-up ends, before anything queued on the chain; one of a
      // newer epoch waits on the chain behind the rebase that the registry change queued, or the
      // device would get its seq under a token of the older epoch (a CURSOR_INVALID at its next AUTH)
      if (this.state.type === "syncing" && push.epoch <= this.epoch) this.delivery.hold(push);
      else this.enqueue(() => this.deliver(push));
    }
  }

  /** The next pushes of a live, idle session: one MSGS frame, the same bytes for every session of the user that sends them all. */
  private emitLive(pushes: readonly Push[]): void {
    const entries = pushes.length === 1 ? [pushes[0]!.entry] : pushes.map((p) => p.entry);
    const out = this.select(entries);
    if (out.length === 0) return;
    const bytes = out.length === entries.length ? sharedFrame(pushes, this.shard) : encodeMsgsFrame(this.shard, out.map(encodedOnce));
    this.sendBytes(bytes, "MSGS");
  }

  private async deliver(push: Push): Promise<void> {
    const kind = this.delivery.classify(push);
    if (kind === "duplicate") {
      this.p.metrics.duplicatesDropped.inc();
      return;
    }
    if (kind === "gap") {
      // A lost push (or one whose predecessor the worker could not know): fill from the mailbox first.
      this.p.metrics.gapFills.inc();
      const got = await this.p.mailbox.fill(this.shard, this.user, this.delivery.lastKnown, push.entry.seq);
      if (got === "too_many") await this.readAfterKnown(push.entry.seq - 1n);
      else await this.emit(this.shard, got, false);
    }
    await this.emit(this.shard, [push.entry], false);
  }

  /**
   * Anti-entropy for live sessions: a push lost with no later entry of the user (a NATS node dying
   * with it in flight) would otherwise wait for the device's next reconnect. Every
   * JETGATE_TAIL_CHECK_S the hub reads the heads of its sessions' users (the Redis watermark, which
   * the worker raises before it pushes, so a lost push shows there) in one round trip, and compares
   * each with `tailPosition`: undefined while the session is not live or has work in its chain.
   */
  tailPosition(): MailboxSeq | undefined {
    return this.state.type === "live" && this.chainIdle ? this.delivery.lastKnown : undefined;
  }

  /**
   * The hub saw the user's head past `tailPosition`, or Redis had no head for the user (its hash
   * vanished, with it the proof that nothing is missing): the rest is read and sent through the
   * chain. An unknown head asks the stream once per position: only the worker re-creates the hash,
   * and it does so with the next entry it processes, whose push then shows any gap.
   */
  fillTail(head: MailboxSeq | undefined): void {
    if (this.tailPosition() === undefined) return;
    if (head === undefined) {
      if (this.tailAskedAt === this.delivery.lastKnown) return;
      this.tailAskedAt = this.delivery.lastKnown;
    }
    this.enqueue(() => this.readToHead());
  }

  /**
   * The user's route was registered again (gateway/routes.ts) with `head` then: entries up to it
   * may not have been routed here. Whatever the session is doing, it reads them after its current
   * step (a session still syncing reads them in its catch-up; this finds nothing more).
   */
  catchUpTo(head: MailboxSeq | undefined): void {
    if (this.closed || (head !== undefined && head <= this.delivery.lastKnown)) return;
    this.enqueue(() => this.readToHead());
  }

  private async readToHead(): Promise<void> {
    if (this.state.type !== "live") return;
    const wm = await this.p.mailbox.watermarks(this.shard, this.user);
    // a push may have delivered it meanwhile
    if (wm.head <= this.delivery.lastKnown || this.closed) return;
    this.p.metrics.tailFills.inc();
    for await (const page of this.p.mailbox.read(this.shard, this.user, this.delivery.lastKnown, { wm })) {
      await this.emit(this.shard, page.entries, true);
    }
  }

  // ---- requests ------------------------------------------------------------------------------

  /** Cumulative ACK of what the device applied: only a seq it could have got is stored. */
  private ack(frame: AckFrame): void {
    if (!this.delivery.canAck(frame.seq)) {
      return this.refuse(ErrorCode.BAD_REQUEST, `ACK of seq ${frame.seq} is beyond anything sent to this session (${this.delivery.ackBound})`);
    }
    if (frame.seq > this.ackedSeq) this.ackedSeq = frame.seq;
    // Written at most once a second per session (and on close): ACKs are frequent, Redis is shared.
    this.ackTimer ??= setTimeout(() => {
      this.ackTimer = undefined;
      this.flushAck();
    }, 1000).unref();
  }

  private flushAck(): void {
    if (this.ackedSeq <= this.ackFlushed || this.user === "") return;
    this.ackFlushed = this.ackedSeq;
    void this.p.acks.store(this.user, this.device, this.ackedSeq).then(
      (evicted) => evicted > 0 && this.p.metrics.devicesEvicted.inc(evicted),
      () => undefined,
    );
  }

  /**
   * PULL: up to `limit` entries with seq above `after`, in whole seqs. `after` may be numbered by a
   * shard the user moved from (the last entry it had from a split's parent): the rest of that
   * shard's range comes first, as on AUTH. A reply answers a request; it does not move lastSent.
   */
  private async pull(frame: PullFrame): Promise<void> {
    const lane = frame.lane;
    if (lane !== undefined && !this.p.config.JETGATE_LANES.includes(lane)) {
      return this.refuse(ErrorCode.BAD_REQUEST, `lane ${lane} is not configured on this gateway`, frame.id);
    }
    const ranges = pullRanges(this.p.registry.state, this.user, this.shard, frame.after);
    if (ranges === undefined) return this.refuse(ErrorCode.BAD_REQUEST, `after=${frame.after} is not a position of this user's shards`, frame.id);
    const entries: Entry[] = [];
    let more = false;
    const lanes = this.delivery;
    const wanted = (e: Entry) => (lane === undefined || e.lane === lane) && lanes.wants(e.lane);
    // a read limit only when nothing is filtered out: limit + 1 entries, the extra one says `more`
    const unfiltered = lane === undefined && lanes.allLanes;
    for (const r of ranges) {
      const limit = unfiltered ? { limit: frame.limit + 1 - entries.length } : {};
      for await (const page of this.p.mailbox.read(r.shard, this.user, r.after, { ...(r.until !== undefined ? { until: r.until } : {}), ...limit })) {
        for (const e of page.entries) {
          if (!wanted(e)) continue;
          if (entries.length === frame.limit) more = true;
          else entries.push(e);
        }
        if (more) break;
      }
      if (more) break;
    }
    if (entries.length > 0) this.delivery.pulled(entries[entries.length - 1]!.seq);
    this.sendBytes(encodeMsgsFrame(this.shard, entries.map(encodeEntry), { id: frame.id, more }), "MSGS");
  }

  private async sendUpstream(frame: SendFrame): Promise<void> {
    const max = this.p.config.JETGATE_MAX_BODY_BYTES;
    if (frame.b.byteLength > max) return this.refuse(ErrorCode.TOO_LARGE, `body over ${max} bytes`, frame.id);
    try {
      const r = await this.p.ingress.publish(this.user, this.device, frame.cmid, frame.b);
      this.send({ t: "SEND_OK", id: frame.id, cmid: frame.cmid, dup: r.duplicate });
    } catch (err) {
      this.p.log.warn({ err: (err as Error).message, user: this.user }, "ingress publish failed");
      this.refuse(ErrorCode.INTERNAL, "could not accept the message; retry with the same cmid", frame.id);
    }
  }

  /** The device hears the reason; what each key said goes to the log only. */
  private tokenRefused(err: unknown): void {
    this.p.metrics.authOutcomes.inc({ case: "unauthorized" });
    const detail = (err as { detail?: unknown }).detail;
    if (typeof detail === "string") this.p.log.info({ session: this.id, why: (err as Error).message, detail }, "token refused");
  }

  private async refresh(frame: RefreshFrame): Promise<void> {
    let claims;
    try {
      claims = await this.p.tokens.verify(frame.token);
    } catch (err) {
      this.tokenRefused(err);
      return this.fail(Disconnect.UNAUTHORIZED, `refresh refused: ${(err as Error).message}`);
    }
    if (this.closed) return;
    if (claims.user !== this.user || (claims.device !== undefined && claims.device !== this.device)) {
      this.p.metrics.authOutcomes.inc({ case: "unauthorized" });
      return this.fail(Disconnect.UNAUTHORIZED, "refresh token is for another user or device");
    }
    if (this.p.revocations.revoked(this.user, this.device, claims.issuedAt, Date.now())) {
      this.p.metrics.authOutcomes.inc({ case: "revoked" });
      return this.fail(Disconnect.UNAUTHORIZED, "refresh refused: token revoked");
    }
    // Verification allows a few seconds of clock skew; a REFRESH must not set an expiry in the past
    // (it answered REFRESH_OK, then closed with 4401 a moment later)
    if (claims.expiresAt <= Date.now()) {
      this.p.metrics.authOutcomes.inc({ case: "unauthorized" });
      return this.fail(Disconnect.UNAUTHORIZED, "refresh refused: the token has expired");
    }
    this.armExpiry(claims.expiresAt);
    this.issuedAt = claims.issuedAt;
    this.send({ t: "REFRESH_OK", ...(frame.id !== undefined ? { id: frame.id } : {}), exp: claims.expiresAt });
  }

  /** The session closes (4401) when its token expires, unless a REFRESH moves the expiry. */
  private armExpiry(expiresAt: number): void {
    this.expiresAt = expiresAt;
  }

  /**
   * Closes the session if its token has expired by `now`. The hub calls it for every session once
   * a second: one timer per gateway instead of one per session (a Timeout, its closure and context
   * were a tenth of an idle connection's memory); a session outlives its token by under a second.
   */
  expireIfDue(now: number): void {
    if (now >= this.expiresAt && !this.closed) this.close(CloseCode.UNAUTHENTICATED, "token expired");
  }

  /**
   * Per-connection token bucket that may go into debt: a frame without a token is refused (the
   * first refusal of a stretch is told with a non-fatal RATE_LIMITED), and a connection whose debt
   * passes the burst is closed with 4429. A client that backs off pays the debt back and recovers;
   * one that keeps flooding is closed however its frames are spaced. The user's budget (all of the
   * user's connections on this gateway) refuses without debt.
   */
  private takeToken(): boolean {
    const now = Date.now();
    if (this.bucket.take(now) && (this.user === "" || this.p.hub.takeUserToken(this.user, now))) {
      this.limited = false;
      return true;
    }
    this.p.metrics.rateLimited.inc();
    if (this.bucket.exhausted) {
      this.fail(Disconnect.RATE_LIMITED, "rate limit exceeded");
    } else if (!this.limited) {
      this.limited = true;
      this.send({ t: "ERROR", code: ErrorCode.RATE_LIMITED, msg: "slow down", fatal: false });
    }
    return false;
  }
}
