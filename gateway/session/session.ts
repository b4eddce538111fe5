/**
 * One device connection. It talks to the world only through ports (gateway/ports.ts): a
 * write-only transport, the mailbox, the registry view, presence, ingress, the ACK store, timers.
 *
 * A session is one class in layers, each in its own file:
 * - gateway/session/output.ts: identity, state, frames out, the close (only ever with a `Disconnect`);
 * - gateway/session/sync.ts: the serial chain, catch-up, held pushes, live pushes, gap and tail fills, rebases;
 * - gateway/session/requests.ts: ACK, PULL, SEND, REFRESH, and the clock (gateway/session/clock.ts);
 * - here: the frames in (routing, rate limits), AUTH, the deadlines and the cleanup.
 *
 * A cursor is answered in four steps, the same on AUTH and on a mid-session rebase:
 * gather (gateway/mailbox/gather.ts) -> decide (gateway/mailbox/auth-decision.ts) -> answer (answer.ts) -> deliver (gateway/session/sync.ts).
 */
import { Disconnect, ErrorCode, FrameError, decodeClientFrame, type AuthFrame, type RegistryState } from "../../protocol/index.js";
import type { CursorIn } from "../mailbox/auth-decision.js";
import { Delivery } from "./delivery.js";
import { gatherAndDecide, RETRY_LATER_MS } from "../mailbox/gather.js";
import type { SessionPorts, Transport } from "../ports.js";
import { TokenBucket } from "../rate-limit.js";
import type { Deadline } from "./clock.js";
import { SessionRequests } from "./requests.js";
import { MAX_HELD_PUSHES } from "./sync.js";

export type { Transport } from "../ports.js";
export type { SessionState } from "./output.js";

/** Whether the registry has seen the cursor's shard, its (epoch, log) and the epoch of its seq. */
function registryKnows(state: RegistryState, c: CursorIn): boolean {
  const s = state.shards.get(c.shard);
  if (s === undefined || c.epoch > s.epoch || Number(c.seq >> 48n) > s.epoch) return false;
  return s.boundaries.some((b) => b.epoch === c.epoch && b.log === c.log);
}

export class Session extends SessionRequests {
  /** This session holds its user's route on this gateway (released on close). */
  private routeHeld = false;
  private readonly bucket: TokenBucket;
  private limited = false;

  constructor(id: string, t: Transport, p: SessionPorts) {
    super(id, t, p);
    const c = p.config;
    this.bucket = new TokenBucket(c.JETGATE_RATE_BURST, c.JETGATE_RATE_FRAMES_PER_S, Date.now(), c.JETGATE_RATE_BURST);
    this.clock.set("auth", this.clock.now + c.JETGATE_AUTH_TIMEOUT_MS);
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
    this.state = { type: "closed", code };
    this.cleanup();
  }

  /** GOAWAY before a drain close. */
  goAway(retryMs: number): void {
    this.send({ t: "GOAWAY", reason: "server draining", retry_ms: retryMs });
  }

  onDeadline(kind: Deadline): void {
    if (this.closed) return;
    if (kind === "ack") return this.flushAck();
    if (kind === "expiry") return this.close(Disconnect.TOKEN_EXPIRED);
    if (this.state.type === "awaiting_auth" || this.state.type === "authenticating") {
      this.p.metrics.authOutcomes.inc({ case: "timeout" });
      this.close(Disconnect.AUTH_TIMEOUT);
    }
  }

  protected cleanup(): void {
    this.clock.stop();
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
    const claims = await this.verifyToken(frame.token);
    if (claims === undefined) return false;
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
    // the session closes (4401) when its token expires, unless a REFRESH moves the expiry
    this.clock.set("expiry", claims.expiresAt);
    this.issuedAt = claims.issuedAt;
    // The route is in Redis before the mailbox is read (gateway/hub/routes.ts): what the worker does
    // after it is routed here, what it did before is in the read. Beside the claim: one round trip.
    this.routeHeld = true;
    const [claimed] = await Promise.all([this.p.presence.claim(this.user, this.device, this.id, this.authAt), this.p.routes.acquire(this.user)]);
    if (claimed === "superseded") {
      this.close(Disconnect.REPLACED);
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
    this.clock.clear("auth");
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
