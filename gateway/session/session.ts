/**
 * One device connection, as one class in one file, so that every call a frame leads to can be
 * followed here: the frames in (routing, rate limits), AUTH, the serial chain and what it delivers
 * (catch-up, held and live pushes, gap and tail fills, rebases), the requests after AUTH (ACK,
 * PULL, SEND, REFRESH), the deadlines, and the frames out and the close. It talks to the world only
 * through ports (gateway/ports.ts): a write-only transport, the mailbox, the registry view,
 * presence, ingress, the ACK store, the clock. Its parts with decisions of their own are pure
 * modules beside it: `delivery.ts` (what may go out), `answer.ts` (the frames of a decision),
 * `clock.ts` (the deadlines on one timer), `encodings.ts` (bytes shared between sessions).
 *
 * Who the session is (user, device, AUTH time, token's `iat`) and where its entries are numbered
 * (shard, epoch, log) live in the states of `SessionState` that have them; a session has no
 * identity before its token is verified. One object per connection (every object is memory per
 * idle device): the state carries the identity, nothing is split into objects that point at each
 * other.
 *
 * A cursor is answered in four steps, the same on AUTH and on a mid-session rebase:
 * gather (gateway/mailbox/gather.ts) -> decide (gateway/mailbox/auth-decision.ts) -> answer
 * (answer.ts) -> deliver (`answerAndDeliver` below).
 *
 * Steps run one at a time on a serial chain (hocuspocus style): an async step (AUTH's catch-up, a
 * rebase, a gap or tail fill, a PULL) cannot be overtaken by the next frame or push. Every entry
 * goes out through `emit`, which sends only what `Delivery` selects: seqs above the last one sent
 * on this connection (anything else is dropped and counted as a regression).
 *
 * Requests: PULL on the chain (behind the catch-up it must not overtake); REFRESH on a chain of its
 * own (a token must not expire behind a catch-up, and the expiry is the last frame's, whichever
 * verification finishes first); SEND published at once (a publish must not wait behind a long
 * catch-up; one connection's publishes reach the stream in order) and answered in order on a chain
 * of its own (a SEND_OK never overtakes an earlier SEND's answer, however the acks return).
 */
import {
  Disconnect,
  ErrorCode,
  FrameError,
  decodeClientFrame,
  encodeEntry,
  encodeLiveMsgsFrame,
  encodeMsgsFrame,
  seqEpoch,
  withReason,
  encodeFrame,
  systemClock,
  type AckFrame,
  type AuthFrame,
  type Entry,
  type FatalDisconnect,
  type MailboxSeq,
  type PullFrame,
  type Push,
  type RefreshFrame,
  type RegistryState,
  type SendFrame,
  type ServerFrame,
} from "../../protocol/index.js";
import type { DeviceClaims } from "../jwt.js";
import type { CursorIn } from "../mailbox/auth-decision.js";
import { gatherAndDecide, RETRY_LATER_MS, ShardNotReadyError, UnavailableError, type Gathered } from "../mailbox/gather.js";
import { pullRanges } from "../mailbox/positions.js";
import type { HubMember, SessionPorts, TimerPort, Transport, Watermarks, Who } from "../ports.js";
import { TokenBucket } from "../rate-limit.js";
import { planAnswer, type AnswerFor } from "./answer.js";
import { SessionClock, type Deadline, type DeadlineOwner } from "./clock.js";
import { CoarseTimers } from "./coarse-timers.js";
import { Delivery } from "./delivery.js";
import { encodedOnce, liveFrame, sharedFrame } from "./encodings.js";

export type { Transport, Who } from "../ports.js";

/** Where a session's entries are numbered: set by each decision (AUTH's, a rebase's). */
export interface Where {
  readonly shard: number;
  readonly epoch: number;
  readonly log: string;
}

export type SessionState =
  | { type: "awaiting_auth" }
  /** AUTH arrived; its token is being verified. */
  | { type: "authenticating" }
  /** The token is good; presence, route and the cursor decision are under way. */
  | { type: "authorized"; who: Who }
  | { type: "syncing"; who: Who; where: Where }
  | { type: "live"; who: Who; where: Where }
  /** `who` and `where` as they were when it closed, if it had them: the cleanup releases what they hold. */
  | { type: "closed"; code: number; who?: Who; where?: Where };

/** Bytes per MSGS frame during catch-up. */
const FRAME_BYTES = 64 * 1024;
/** Catch-up waits for the socket to drain above this many buffered bytes (or less: see roomFor). */
const PACE_BYTES = 256 * 1024;
/** A paced wait looks at the socket again after this long without a drain, doubling up to the max. */
const PACE_RECHECK_MS = 10;
const PACE_RECHECK_MAX_MS = 1000;
/** Live pushes kept while syncing; beyond it the session re-reads the mailbox instead. */
const MAX_HELD_PUSHES = 10_000;
/** ACKs are written at most once per this many ms per session (and on close): they are frequent, Redis is shared. */
const ACK_FLUSH_MS = 1000;
/** Every session's timers in this process (ports.timers absent): Node timers, and one wheel for far deadlines. */
const sessionTimers = new CoarseTimers(systemClock);

/** Whether the registry has seen the cursor's shard, its (epoch, log) and the epoch of its seq. */
function registryKnows(state: RegistryState, c: CursorIn): boolean {
  const s = state.shards.get(c.shard);
  if (s === undefined || c.epoch > s.epoch || Number(c.seq >> 48n) > s.epoch) return false;
  return s.boundaries.some((b) => b.epoch === c.epoch && b.log === c.log);
}

export class Session implements HubMember, DeadlineOwner {
  state: SessionState = { type: "awaiting_auth" };
  /** The AUTH deadline, the token's expiry and the next ACK flush, on one timer. */
  private readonly clock: SessionClock;
  private readonly bucket: TokenBucket;
  private limited = false;
  /** This session holds its user's route on this gateway (released on close). */
  private routeHeld = false;
  private delivery = new Delivery(undefined, MAX_HELD_PUSHES);
  private chain: Promise<void> = Promise.resolve();
  private pendingSteps = 0;
  private drainWaiter: (() => void) | undefined;
  /** Where the session stood when a tail check last asked the stream for a head Redis lacked. */
  private tailAskedAt: MailboxSeq | undefined;
  /** REFRESH frames, one after the other. */
  private refreshes: Promise<void> = Promise.resolve();
  private sends: Promise<void> = Promise.resolve();
  private ackedSeq = 0n;
  private ackFlushed = 0n;

  constructor(
    readonly id: string,
    private readonly t: Transport,
    private readonly p: SessionPorts,
  ) {
    const c = p.config;
    this.clock = new SessionClock(this, this.timers);
    this.bucket = new TokenBucket(c.JETGATE_RATE_BURST, c.JETGATE_RATE_FRAMES_PER_S, this.clock.now, c.JETGATE_RATE_BURST);
    this.clock.set("auth", this.clock.now + c.JETGATE_AUTH_TIMEOUT_MS);
  }

  /** The session's clock and timers (a getter, not a field: memory per idle connection). */
  private get timers(): TimerPort {
    return this.p.timers ?? sessionTimers;
  }

  // ---- who and where ---------------------------------------------------------------------------

  get closed(): boolean {
    return this.state.type === "closed";
  }

  /** Who the session is; undefined until AUTH's token was verified. */
  get who(): Who | undefined {
    const s = this.state;
    return "who" in s ? s.who : undefined;
  }

  /** Where its entries are numbered; undefined until a decision placed it. */
  get where(): Where | undefined {
    const s = this.state;
    return "where" in s ? s.where : undefined;
  }

  get shard(): number | undefined {
    return this.where?.shard;
  }

  /** Who, for a step that only runs once AUTH's token was verified. */
  private known(): Who {
    const who = this.who;
    if (who === undefined) throw new Error(`session ${this.id}: no identity in state ${this.state.type}`);
    return who;
  }

  /** Where, for a step that only runs once a decision placed the session. */
  private placed(): Where {
    const where = this.where;
    if (where === undefined) throw new Error(`session ${this.id}: no shard in state ${this.state.type}`);
    return where;
  }

  /** Before AUTH's answer: only AUTH is taken, pushes are not sent. */
  private get beforeAnswer(): boolean {
    const t = this.state.type;
    return t === "awaiting_auth" || t === "authenticating" || t === "authorized";
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
    if (this.beforeAnswer) return this.fail(Disconnect.UNAUTHORIZED, `${frame.t} before AUTH`);
    switch (frame.t) {
      case "PING":
        return this.send({ t: "PONG", ...(frame.id !== undefined ? { id: frame.id } : {}) });
      case "ACK":
        return this.ack(frame);
      case "PULL":
        return this.enqueue(() => this.pull(frame));
      case "SEND":
        // not on the chain: a publish must not wait behind a long catch-up (answers keep their order)
        return this.queueSend(frame);
      case "REFRESH":
        // on a chain of its own: a token must not expire behind a catch-up
        return this.queueRefresh(frame);
      default: {
        // A frame type added to ClientFrame and routed nowhere fails to compile here; at run time
        // (the decoder's type list ahead of this switch) it is refused as an unknown type would be.
        const unhandled: never = frame;
        return this.fail(Disconnect.BAD_FRAME, `unknown frame type ${JSON.stringify((unhandled as { t: unknown }).t)}`);
      }
    }
  }

  /** The socket is gone (any reason). Never touch the transport after this. */
  onClosed(code: number): void {
    if (this.closed) return;
    this.state = { ...this.identity(), type: "closed", code };
    this.cleanup();
  }

  /** The socket drained: a paced catch-up goes on. */
  onDrain(): void {
    const w = this.drainWaiter;
    this.drainWaiter = undefined;
    w?.();
  }

  /** GOAWAY before a drain close. */
  goAway(retryMs: number): void {
    this.send({ t: "GOAWAY", reason: "server draining", retry_ms: retryMs });
  }

  /** A deadline of the session's clock passed. */
  onDeadline(kind: Deadline): void {
    if (this.closed) return;
    if (kind === "ack") return this.flushAck();
    if (kind === "expiry") return this.close(Disconnect.TOKEN_EXPIRED);
    if (this.beforeAnswer) {
      this.p.metrics.authOutcomes.inc({ case: "timeout" });
      this.close(Disconnect.AUTH_TIMEOUT);
    }
  }

  // ---- AUTH: gather, decide, answer, deliver --------------------------------------------------

  private async auth(frame: AuthFrame): Promise<void> {
    // whole ms: it is compared across gateways (presence) and reported (the users API)
    const who = await this.authenticate(frame, Math.floor(this.clock.now));
    if (who === undefined) return;
    const cursor: CursorIn | undefined = frame.cursor && { ...frame.cursor, sigValid: this.p.cursors.verify(who.user, frame.cursor) };
    if (!(await this.registryCovers(cursor))) return;
    const g = await gatherAndDecide(this.p.registry, this.p.mailbox, who.user, cursor, { closed: () => this.closed, pauseMs: this.p.config.JETGATE_FAULT_AUTH_PAUSE_MS, clock: this.timers });
    this.p.metrics.authOutcomes.inc({ case: g.decision.case });
    if (this.closed) return;
    await this.answerAndDeliver(g, {
      kind: "auth", session: this.id, user: who.user, head: g.wm.head, trim: g.input.bounds.get(g.decision.shard)!.trim,
      lanes: g.wm.lanes, hb: this.p.config.JETGATE_HEARTBEAT_MS, hadCursor: cursor !== undefined,
    });
  }

  /** Token, device binding, per-user limit, presence, the hub. Who the session is, or undefined when it was refused. */
  private async authenticate(frame: AuthFrame, authAt: number): Promise<Who | undefined> {
    const claims = await this.verifyToken(frame.token);
    if (claims === undefined) return undefined;
    if (claims.device !== undefined && claims.device !== frame.device) {
      this.p.metrics.authOutcomes.inc({ case: "unauthorized" });
      this.fail(Disconnect.UNAUTHORIZED, "token is bound to another device");
      return undefined;
    }
    if (!this.p.revocations.ready()) {
      this.p.metrics.authOutcomes.inc({ case: "revocations_unavailable" });
      this.fail(Disconnect.UNAVAILABLE, "token revocations not loaded yet: reconnect");
      return undefined;
    }
    if (this.p.revocations.revoked(claims.user, frame.device, claims.issuedAt, this.clock.now)) {
      this.p.metrics.authOutcomes.inc({ case: "revoked" });
      this.fail(Disconnect.UNAUTHORIZED, "token revoked");
      return undefined;
    }
    if (this.p.hub.countForUser(claims.user) >= this.p.config.JETGATE_MAX_CONNS_PER_USER) {
      this.p.metrics.authOutcomes.inc({ case: "too_many_connections" });
      this.fail(Disconnect.RATE_LIMITED, "too many connections for this user");
      return undefined;
    }
    const who: Who = { user: claims.user, device: frame.device, authAt, issuedAt: claims.issuedAt };
    this.state = { type: "authorized", who };
    this.delivery = new Delivery(frame.lanes ? new Set(frame.lanes) : undefined, MAX_HELD_PUSHES);
    // the session closes (4401) when its token expires, unless a REFRESH moves the expiry
    this.clock.set("expiry", claims.expiresAt);
    // The route is in Redis before the mailbox is read (gateway/hub/routes.ts): what the worker does
    // after it is routed here, what it did before is in the read. Beside the claim: one round trip.
    this.routeHeld = true;
    const [claimed] = await Promise.all([this.p.presence.claim(who.user, who.device, this.id, authAt), this.p.routes.acquire(who.user)]);
    if (claimed === "superseded") {
      this.close(Disconnect.REPLACED);
      return undefined;
    }
    if (this.closed) return undefined;
    this.p.hub.add(this);
    if (this.closed) return undefined; // a newer session of the device is here already
    // a revocation that came in while this AUTH claimed its presence found no session to end
    if (this.p.revocations.revoked(who.user, who.device, who.issuedAt, this.clock.now)) {
      this.p.metrics.authOutcomes.inc({ case: "revoked" });
      this.fail(Disconnect.UNAUTHORIZED, "token revoked");
      return undefined;
    }
    this.clock.clear("auth");
    return who;
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

  // ---- the chain -------------------------------------------------------------------------------

  private enqueue(step: () => Promise<void>): void {
    this.pendingSteps++;
    this.chain = this.chain
      // a closed session sends nothing more: the steps queued behind its close would only read
      // (a gap fill per queued push, each from the stream: bench/RESULTS.md, "hot --cluster")
      .then(() => (this.closed ? undefined : step()))
      .catch((err: unknown) => {
        if (this.closed) return;
        // A dependency that did not answer, or a live read of a shard whose stream is not there
        // yet: the device resumes by cursor and loses nothing (4500 would name a server fault).
        if (err instanceof UnavailableError || err instanceof ShardNotReadyError) {
          this.p.log.warn({ err: err.message, session: this.id, user: this.who?.user }, "session step: not ready");
          const retryMs = err instanceof UnavailableError ? err.retryMs : RETRY_LATER_MS;
          this.fail(Disconnect.UNAVAILABLE, err.message, { retry_ms: retryMs });
          return;
        }
        this.p.log.error({ err, session: this.id, user: this.who?.user }, "session step failed");
        this.fail(Disconnect.INTERNAL, "internal error");
      })
      .finally(() => this.pendingSteps--);
  }

  private get chainIdle(): boolean {
    return this.pendingSteps === 0;
  }

  // ---- a decision delivered: AUTH's or a rebase's -----------------------------------------------

  /** Answers a decision inline: the ERROR frame if any, AUTH_OK (on AUTH), old ranges, catch-up, SYNCED, live. */
  private async answerAndDeliver(g: Gathered & { decision: Parameters<typeof planAnswer>[0] }, to: AnswerFor): Promise<void> {
    if (this.closed) return;
    const d = g.decision;
    const who = this.known();
    this.state = { type: "syncing", who, where: { shard: d.shard, epoch: d.epoch, log: d.log } };
    this.p.hub.watch(this);
    // A registry change between the decision's view and `watch` reached no session of this one's
    // shard: look again after this step (a split landing mid-AUTH left a moved user's session on
    // the parent for good; the split fault scenario found it).
    if (this.p.registry.state !== g.view) this.onShardChange();
    const answer = planAnswer(d, g.view, (s, e, l) => this.p.cursors.sign(who.user, s, e, l), to);
    for (const f of answer.frames) this.send(f);
    // Old ranges of a split: their seqs (older shards' numbering) are all below the new shard's.
    for (const r of answer.ranges) {
      this.delivery.moveTo(r.after);
      for await (const page of this.p.mailbox.read(r.shard, who.user, r.after, { until: r.until })) {
        this.p.metrics.catchupEntries.inc({ source: page.source }, page.entries.length);
        await this.emit(r.shard, page.entries, true);
      }
    }
    this.delivery.moveTo(d.from);
    await this.catchUp(g.wm);
  }

  /** Everything after lastSent in the current shard, then the pushes held meanwhile, then live. */
  private async catchUp(wm: Watermarks): Promise<void> {
    const who = this.known();
    const { shard } = this.placed();
    if (wm.head > this.delivery.lastSent || wm.from === "stream") {
      for await (const page of this.p.mailbox.read(shard, who.user, this.delivery.lastSent, { wm })) {
        if (this.closed) return;
        this.p.metrics.catchupEntries.inc({ source: page.source }, page.entries.length);
        await this.emit(shard, page.entries, true);
      }
    }
    await this.releaseHeld();
    if (this.closed) return;
    this.send({ t: "SYNCED", seq: this.delivery.lastSent });
    this.state = { type: "live", who, where: this.placed() };
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
    const { shard } = this.placed();
    for await (const page of this.p.mailbox.read(shard, this.known().user, this.delivery.lastKnown, until === undefined ? {} : { until })) {
      await this.emit(shard, page.entries, true);
    }
  }

  /** The registry changed this session's shard (epoch bump, split): rebase mid-session. */
  onShardChange(): void {
    if (this.state.type !== "live" && this.state.type !== "syncing") return;
    this.enqueue(async () => {
      if (this.closed) return;
      const who = this.known();
      const at = this.placed();
      const reg = this.p.registry.state;
      const cur = reg.shards.get(at.shard);
      const userShard = this.p.registry.shards.shardOf(who.user);
      if (cur === undefined || userShard === undefined) return;
      if (cur.epoch === at.epoch && cur.log === at.log && userShard === at.shard) return;
      const position: CursorIn = { shard: at.shard, epoch: at.epoch, log: at.log, seq: this.delivery.lastSent, sigValid: true };
      const g = await gatherAndDecide(this.p.registry, this.p.mailbox, who.user, position, { closed: () => this.closed, clock: this.timers });
      this.p.metrics.midSessionRebases.inc({ case: g.decision.case });
      if (g.decision.case === "invalid") {
        // The session's own position does not fit the registry (never expected): the device
        // reconnects with its cursor and gets a full AUTH answer.
        this.p.log.warn({ session: this.id, user: who.user, reason: g.decision.reason }, "mid-session rebase: position refused");
        throw new UnavailableError(`cursor rebase failed: ${g.decision.reason}`, 1000);
      }
      await this.answerAndDeliver(g, { kind: "rebase" });
    });
  }

  // ---- output of entries -----------------------------------------------------------------------

  /** Sends what `Delivery` selects of `entries` (of `shard`), in MSGS frames; `paced` waits for the socket. */
  private async emit(shard: number, entries: readonly Entry[], paced: boolean): Promise<void> {
    if (this.closed) return;
    // Entries numbered by an epoch this session's token does not have: a step queued before the
    // rebase read them on a registry view that has moved on since (a gap fill after a rebuild).
    // Sent now, they would reach the device under the older epoch's token (CURSOR_INVALID at its
    // next AUTH); the rebase reads them again from what was sent.
    // entries ascend: only when the last is beyond is any (no scan per entry otherwise)
    const { epoch } = this.placed();
    const last = entries[entries.length - 1];
    const beyond = last !== undefined && seqEpoch(last.seq) > epoch ? entries.findIndex((e) => seqEpoch(e.seq) > epoch) : -1;
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
      const msgs = encodeMsgsFrame(shard, frame);
      frame = [];
      bytes = 0;
      if (paced) await this.roomFor(msgs.byteLength);
      if (this.closed) return;
      this.sendBytes(msgs, "MSGS");
    }
  }

  /**
   * Paced output waits for the socket to drain until `n` more bytes fit: under PACE_BYTES, and under
   * the slow-consumer limit (JETGATE_MAX_BACKPRESSURE), so that a device that reads, however slowly,
   * is never closed 4408 by its own catch-up (a frame is FRAME_BYTES and more; the limit may be as
   * low as 64 KiB). An empty buffer takes any frame.
   */
  private async roomFor(n: number): Promise<void> {
    const limit = this.p.config.JETGATE_MAX_BACKPRESSURE;
    let recheckMs = PACE_RECHECK_MS;
    for (let b = this.t.buffered(); b > 0 && (b > PACE_BYTES || b + n > limit); b = this.t.buffered()) {
      await this.drainOr(recheckMs);
      if (this.closed) return;
      recheckMs = Math.min(recheckMs * 2, PACE_RECHECK_MAX_MS);
    }
  }

  /**
   * The socket's next drain, or `ms`, whichever comes first. The timer is what makes a wait end for
   * sure: uWebSockets does not always call `drain` (backpressure that another send flushes first,
   * while uncorking, drains without the event: uNetworking/uWebSockets#1047), and a catch-up that
   * waited on the event alone stood still for good (the TypeScript SDK's slow_consumer scenario, once
   * the wait began below the 4408 limit).
   */
  private drainOr(ms: number): Promise<void> {
    return new Promise<void>((resolve) => {
      const done = () => {
        this.timers.clearTimeout(timer);
        if (this.drainWaiter === done) this.drainWaiter = undefined;
        resolve();
      };
      const timer = this.timers.setTimeout(done, ms);
      this.drainWaiter = done;
    });
  }

  /** What `Delivery` lets out of `entries`, counted. */
  private select(entries: readonly Entry[]): Entry[] {
    const before = this.delivery.regressions;
    const out = this.delivery.select(entries);
    if (this.delivery.regressions > before) this.p.metrics.regressions.inc({ component: "gateway" }, this.delivery.regressions - before);
    if (out.length > 0) this.p.metrics.entriesSent.inc(out.length);
    return out;
  }

  // ---- live ------------------------------------------------------------------------------------

  /**
   * Live pushes for this user (already checked against the registry's epoch by the hub), in order.
   * The common case (live, nothing on the chain, each push following the one before) goes out at
   * once as one MSGS frame, with no promise; a gap or a busy chain goes through the chain.
   */
  onPushes(pushes: readonly Push[], shared = false): void {
    const s = this.state;
    if (s.type !== "live" && s.type !== "syncing") return;
    const { shard, epoch } = s.where;
    let i = 0;
    if (s.type === "live" && this.chainIdle) {
      let known = this.delivery.lastKnown;
      while (i < pushes.length) {
        const p = pushes[i]!;
        if (p.shard !== shard || p.epoch > epoch || p.entry.seq <= known || p.prevAll === null || p.prevAll > known) break;
        known = p.entry.seq;
        i++;
      }
      if (i > 0) this.emitLive(i === pushes.length ? pushes : pushes.slice(0, i), shard, shared && i === pushes.length);
    }
    for (; i < pushes.length; i++) {
      const push = pushes[i]!;
      if (push.shard !== shard) continue;
      // held pushes go out when the catch-up ends, before anything queued on the chain; one of a
      // newer epoch waits on the chain behind the rebase that the registry change queued, or the
      // device would get its seq under a token of the older epoch (a CURSOR_INVALID at its next AUTH)
      if (s.type === "syncing" && push.epoch <= epoch) this.delivery.hold(push);
      else {
        const at = this.timers.monotonic();
        this.enqueue(() => this.deliver(push, at));
      }
    }
  }

  /**
   * The next pushes of a live, idle session: one MSGS frame, the same bytes for every session of
   * the user that sends them all (`shared`: the user has other sessions here, given the same array).
   */
  private emitLive(pushes: readonly Push[], shard: number, shared: boolean): void {
    if (this.delivery.takeAll(pushes)) {
      this.p.metrics.entriesSent.inc(pushes.length);
      this.sendBytes(shared ? sharedFrame(pushes, shard) : liveFrame(pushes, shard), "MSGS");
      return;
    }
    // some are not for this device (its lanes) or refused: what is left, in one pass as well
    const out = this.select(pushes.map((p) => p.entry));
    if (out.length > 0) this.sendBytes(encodeLiveMsgsFrame(shard, out.length, (i) => out[i]!), "MSGS");
  }

  /** A push through the chain; `at`: when it was received, for the gateway_chain stage. */
  private async deliver(push: Push, at?: number): Promise<void> {
    const kind = this.delivery.classify(push);
    if (kind === "duplicate") {
      this.p.metrics.duplicatesDropped.inc();
      return;
    }
    const { shard } = this.placed();
    if (kind === "gap") {
      // A lost push (or one whose predecessor the worker could not know): fill from the mailbox first.
      this.p.metrics.gapFills.inc();
      const got = await this.p.mailbox.fill(shard, this.known().user, this.delivery.lastKnown, push.entry.seq);
      if (got === "too_many") await this.readAfterKnown(push.entry.seq - 1n);
      else await this.emit(shard, got, false);
    }
    await this.emit(shard, [push.entry], false);
    if (at !== undefined) this.p.metrics.stages.observe("gateway_chain", (this.timers.monotonic() - at) / 1000);
  }

  // ---- tail and route repairs ------------------------------------------------------------------

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
   * The user's route was registered again (gateway/hub/routes.ts) with `head` then: entries up to it
   * may not have been routed here. Whatever the session is doing, it reads them after its current
   * step (a session still syncing reads them in its catch-up; this finds nothing more).
   */
  catchUpTo(head: MailboxSeq | undefined): void {
    if (this.closed || (head !== undefined && head <= this.delivery.lastKnown)) return;
    this.enqueue(() => this.readToHead());
  }

  private async readToHead(): Promise<void> {
    const s = this.state;
    if (s.type !== "live") return;
    const { user } = s.who;
    const { shard } = s.where;
    const wm = await this.p.mailbox.watermarks(shard, user);
    // a push may have delivered it meanwhile
    if (wm.head <= this.delivery.lastKnown || this.closed) return;
    this.p.metrics.tailFills.inc();
    for await (const page of this.p.mailbox.read(shard, user, this.delivery.lastKnown, { wm })) {
      await this.emit(shard, page.entries, true);
    }
  }

  // ---- requests after AUTH: ACK, PULL, SEND, REFRESH -----------------------------------------

  /** Cumulative ACK of what the device applied: only a seq it could have got is stored. */
  private ack(frame: AckFrame): void {
    if (!this.delivery.canAck(frame.seq)) {
      return this.refuse(ErrorCode.BAD_REQUEST, `ACK of seq ${frame.seq} is beyond anything sent to this session (${this.delivery.ackBound})`);
    }
    if (frame.seq > this.ackedSeq) this.ackedSeq = frame.seq;
    if (!this.clock.isSet("ack")) this.clock.set("ack", this.clock.now + ACK_FLUSH_MS);
  }

  private flushAck(): void {
    const who = this.who;
    if (this.ackedSeq <= this.ackFlushed || who === undefined) return;
    this.ackFlushed = this.ackedSeq;
    void this.p.acks.store(who.user, who.device, this.ackedSeq).then(
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
    const { user } = this.known();
    const { shard } = this.placed();
    const ranges = pullRanges(this.p.registry.state, user, shard, frame.after);
    if (ranges === undefined) return this.refuse(ErrorCode.BAD_REQUEST, `after=${frame.after} is not a position of this user's shards`, frame.id);
    const entries: Entry[] = [];
    let more = false;
    const lanes = this.delivery;
    const wanted = (e: Entry) => (lane === undefined || e.lane === lane) && lanes.wants(e.lane);
    // a read limit only when nothing is filtered out: limit + 1 entries, the extra one says `more`
    const unfiltered = lane === undefined && lanes.allLanes;
    for (const r of ranges) {
      const limit = unfiltered ? { limit: frame.limit + 1 - entries.length } : {};
      for await (const page of this.p.mailbox.read(r.shard, user, r.after, { ...(r.until !== undefined ? { until: r.until } : {}), ...limit })) {
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
    this.sendBytes(encodeMsgsFrame(shard, entries.map(encodeEntry), { id: frame.id, more }), "MSGS");
  }

  /** Publishes at once; the answer waits for the answers of the SENDs before it. */
  private queueSend(frame: SendFrame): void {
    const answer = this.publishUpstream(frame);
    this.sends = this.sends
      .then(() => answer)
      .then((tell) => tell())
      .catch((err: unknown) => {
        this.p.log.error({ err, session: this.id }, "send answer failed");
        this.fail(Disconnect.INTERNAL, "internal error");
      });
  }

  /** The publish; resolves to how to answer it (never rejects). The answer keeps the frame's id and cmid, not its body. */
  private async publishUpstream(frame: SendFrame): Promise<() => void> {
    const { id, cmid } = frame;
    const max = this.p.config.JETGATE_MAX_BODY_BYTES;
    if (frame.b.byteLength > max) return () => this.refuse(ErrorCode.TOO_LARGE, `body over ${max} bytes`, id);
    const who = this.known();
    try {
      const r = await this.p.ingress.publish(who.user, who.device, cmid, frame.b);
      return () => this.send({ t: "SEND_OK", id, cmid, dup: r.duplicate });
    } catch (err) {
      this.p.log.warn({ err: (err as Error).message, user: who.user }, "ingress publish failed");
      return () => this.refuse(ErrorCode.INTERNAL, "could not accept the message; retry with the same cmid", id);
    }
  }

  /** Queues a REFRESH behind the ones before it. */
  private queueRefresh(frame: RefreshFrame): void {
    this.refreshes = this.refreshes.then(() => this.refresh(frame)).catch((err: unknown) => {
      this.p.log.error({ err, session: this.id }, "refresh failed");
      this.fail(Disconnect.INTERNAL, "internal error");
    });
  }

  private async refresh(frame: RefreshFrame): Promise<void> {
    const claims = await this.verifyToken(frame.token, "refresh refused: ");
    if (claims === undefined) return;
    const who = this.known();
    if (claims.user !== who.user || (claims.device !== undefined && claims.device !== who.device)) {
      this.p.metrics.authOutcomes.inc({ case: "unauthorized" });
      return this.fail(Disconnect.UNAUTHORIZED, "refresh token is for another user or device");
    }
    if (this.p.revocations.revoked(who.user, who.device, claims.issuedAt, this.clock.now)) {
      this.p.metrics.authOutcomes.inc({ case: "revoked" });
      return this.fail(Disconnect.UNAUTHORIZED, "refresh refused: token revoked");
    }
    // Verification allows a few seconds of clock skew; a REFRESH must not set an expiry in the past
    // (it answered REFRESH_OK, then closed with 4401 a moment later)
    if (claims.expiresAt <= this.clock.now) {
      this.p.metrics.authOutcomes.inc({ case: "unauthorized" });
      return this.fail(Disconnect.UNAUTHORIZED, "refresh refused: the token has expired");
    }
    this.clock.set("expiry", claims.expiresAt);
    who.issuedAt = claims.issuedAt;
    this.send({ t: "REFRESH_OK", ...(frame.id !== undefined ? { id: frame.id } : {}), exp: claims.expiresAt });
  }

  /**
   * The token's claims (AUTH's and REFRESH's), or undefined when the session is closed: a token
   * refused is UNAUTHORIZED with `prefix` and the reason; what each key said goes to the log only.
   */
  private async verifyToken(token: string, prefix = ""): Promise<DeviceClaims | undefined> {
    try {
      const claims = await this.p.tokens.verify(token);
      return this.closed ? undefined : claims;
    } catch (err) {
      this.p.metrics.authOutcomes.inc({ case: "unauthorized" });
      const detail = (err as { detail?: unknown }).detail;
      if (typeof detail === "string") this.p.log.info({ session: this.id, why: (err as Error).message, detail }, "token refused");
      this.fail(Disconnect.UNAUTHORIZED, `${prefix}${(err as Error).message}`);
      return undefined;
    }
  }

  // ---- frames out, limits and the close --------------------------------------------------------

  /** Closes with `d`'s code and reason (idempotent). The only way a session ends from this side. */
  close(d: Disconnect): void {
    if (this.closed) return;
    this.p.metrics.closes.inc({ code: String(d.close) });
    this.state = { ...this.identity(), type: "closed", code: d.close };
    try {
      this.t.close(d);
    } finally {
      this.cleanup();
    }
  }

  /** Who and where the session is now, to keep in its closed state. */
  private identity(): { who?: Who; where?: Where } {
    const who = this.who;
    const where = this.where;
    return { ...(who !== undefined ? { who } : {}), ...(where !== undefined ? { where } : {}) };
  }

  /** Releases what the session holds (hub, route, presence, timer); once, after it closed. */
  private cleanup(): void {
    this.clock.stop();
    this.onDrain();
    this.delivery.clearHeld();
    // every connection, authenticated or not (one that never sent AUTH used to stay in the set)
    this.p.hub.remove(this);
    const who = this.who;
    if (who === undefined) return;
    if (this.routeHeld) {
      this.routeHeld = false;
      this.p.routes.release(who.user);
    }
    this.flushAck();
    void this.p.presence.release(who.user, who.device, this.id, who.authAt).catch(() => undefined);
  }

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
      this.close(Disconnect.SLOW_CONSUMER);
    }
  }

  /** A fatal ERROR, then the close its code pairs with; `msg` is told in both. */
  private fail(d: FatalDisconnect, msg: string, extra: { retry_ms?: number } = {}): void {
    this.send({ t: "ERROR", code: d.error, msg, fatal: true, ...extra });
    this.close(withReason(d, msg));
  }

  /** A request refused without closing (BAD_REQUEST, TOO_LARGE, ...), tied to its request id. */
  private refuse(code: ErrorCode, msg: string, id?: number): void {
    this.send({ t: "ERROR", code, msg, fatal: false, ...(id !== undefined ? { id } : {}) });
  }

  /**
   * Per-connection token bucket that may go into debt: a frame without a token is refused (the
   * first refusal of a stretch is told with a non-fatal RATE_LIMITED), and a connection whose debt
   * passes the burst is closed with 4429. A client that backs off pays the debt back and recovers;
   * one that keeps flooding is closed however its frames are spaced. The user's budget (all of the
   * user's connections on this gateway) refuses without debt; it applies once the user is known.
   */
  private takeToken(): boolean {
    const now = this.clock.now;
    const who = this.who;
    if (this.bucket.take(now) && (who === undefined || this.p.hub.takeUserToken(who.user, now))) {
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
