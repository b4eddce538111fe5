/**
 * A session's requests after AUTH: ACK, PULL, SEND, REFRESH, and the clock they set (the ACK
 * flush, the token's expiry). Each kind is answered in the order its frames came: PULL on the
 * session's chain (behind the catch-up it must not overtake), REFRESH on a chain of its own (a
 * token must not expire behind a catch-up, and the expiry is the last frame's, whichever
 * verification finishes first), SEND published at once (a publish must not wait behind a long
 * catch-up; one connection's publishes reach the stream in order) and answered in order on a
 * chain of its own (a SEND_OK never overtakes an earlier SEND's answer, however the acks return).
 */
import {
  Disconnect,
  ErrorCode,
  encodeEntry,
  encodeMsgsFrame,
  type AckFrame,
  type Entry,
  type PullFrame,
  type RefreshFrame,
  type SendFrame,
} from "../../protocol/index.js";
import { pullRanges } from "../mailbox/positions.js";
import type { SessionPorts, Transport } from "../ports.js";
import type { DeviceClaims } from "../jwt.js";
import { CoarseTimers } from "./coarse-timers.js";
import { SessionClock, systemTimers, type Deadline } from "./clock.js";
import { SessionSync } from "./sync.js";

/** ACKs are written at most once per this many ms per session (and on close): they are frequent, Redis is shared. */
const ACK_FLUSH_MS = 1000;
/** Every session's timers in this process (ports.timers absent): Node timers, and one wheel for far deadlines. */
const sessionTimers = new CoarseTimers(systemTimers);

export abstract class SessionRequests extends SessionSync {
  /** The AUTH deadline, the token's expiry and the next ACK flush, on one timer. */
  protected readonly clock: SessionClock;
  /** REFRESH frames, one after the other. */
  private refreshes: Promise<void> = Promise.resolve();
  private sends: Promise<void> = Promise.resolve();
  private ackedSeq = 0n;
  private ackFlushed = 0n;

  constructor(id: string, t: Transport, p: SessionPorts) {
    super(id, t, p);
    this.clock = new SessionClock(this, p.timers ?? sessionTimers);
  }

  /** A deadline of the session's clock passed. */
  abstract onDeadline(kind: Deadline): void;

  /** Cumulative ACK of what the device applied: only a seq it could have got is stored. */
  protected ack(frame: AckFrame): void {
    if (!this.delivery.canAck(frame.seq)) {
      return this.refuse(ErrorCode.BAD_REQUEST, `ACK of seq ${frame.seq} is beyond anything sent to this session (${this.delivery.ackBound})`);
    }
    if (frame.seq > this.ackedSeq) this.ackedSeq = frame.seq;
    if (!this.clock.isSet("ack")) this.clock.set("ack", this.clock.now + ACK_FLUSH_MS);
  }

  protected flushAck(): void {
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
  protected async pull(frame: PullFrame): Promise<void> {
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

  /** Publishes at once; the answer waits for the answers of the SENDs before it. */
  protected queueSend(frame: SendFrame): void {
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
    try {
      const r = await this.p.ingress.publish(this.user, this.device, cmid, frame.b);
      return () => this.send({ t: "SEND_OK", id, cmid, dup: r.duplicate });
    } catch (err) {
      this.p.log.warn({ err: (err as Error).message, user: this.user }, "ingress publish failed");
      return () => this.refuse(ErrorCode.INTERNAL, "could not accept the message; retry with the same cmid", id);
    }
  }

  /** Queues a REFRESH behind the ones before it. */
  protected queueRefresh(frame: RefreshFrame): void {
    this.refreshes = this.refreshes.then(() => this.refresh(frame)).catch((err: unknown) => {
      this.p.log.error({ err, session: this.id }, "refresh failed");
      this.fail(Disconnect.INTERNAL, "internal error");
    });
  }

  private async refresh(frame: RefreshFrame): Promise<void> {
    const claims = await this.verifyToken(frame.token, "refresh refused: ");
    if (claims === undefined) return;
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
    this.clock.set("expiry", claims.expiresAt);
    this.issuedAt = claims.issuedAt;
    this.send({ t: "REFRESH_OK", ...(frame.id !== undefined ? { id: frame.id } : {}), exp: claims.expiresAt });
  }

  /**
   * The token's claims (AUTH's and REFRESH's), or undefined when the session is closed: a token
   * refused is UNAUTHORIZED with `prefix` and the reason; what each key said goes to the log only.
   */
  protected async verifyToken(token: string, prefix = ""): Promise<DeviceClaims | undefined> {
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
}
