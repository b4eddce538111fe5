/**
 * What a session is and what it says: its identity, its state, and everything it sends on its
 * write-only transport (frames, refusals, fatal errors, the close). The base of a session's layers:
 * output (here) < synchronisation (gateway/session/sync.ts) < requests (gateway/session/requests.ts) < routing and
 * AUTH (session.ts). Layers of one class rather than objects that point at each other: a session
 * is per connection, and every object it holds is memory per idle device.
 */
import { Disconnect, encodeFrame, withReason, type ErrorCode, type FatalDisconnect, type ServerFrame } from "../../protocol/index.js";
import type { SessionPorts, Transport } from "../ports.js";

export type SessionState =
  | { type: "awaiting_auth" }
  | { type: "authenticating" }
  | { type: "syncing" }
  | { type: "live" }
  | { type: "closed"; code: number };

export abstract class SessionOutput {
  state: SessionState = { type: "awaiting_auth" };
  user = "";
  device = "";
  shard = -1;
  epoch = -1;
  log = "";
  /** When the AUTH frame arrived (ms): of two sessions of one device, the later AUTH wins. */
  authAt = 0;
  issuedAt: number | undefined;

  constructor(
    readonly id: string,
    protected readonly t: Transport,
    protected readonly p: SessionPorts,
  ) {}

  get closed(): boolean {
    return this.state.type === "closed";
  }

  /** Closes with `d`'s code and reason (idempotent). The only way a session ends from this side. */
  close(d: Disconnect): void {
    if (this.closed) return;
    this.p.metrics.closes.inc({ code: String(d.close) });
    this.state = { type: "closed", code: d.close };
    try {
      this.t.close(d);
    } finally {
      this.cleanup();
    }
  }

  /** Releases what the session holds (hub, route, presence, timer); once, after it closed. */
  protected abstract cleanup(): void;

  protected send(frame: ServerFrame): void {
    this.sendBytes(encodeFrame(frame), frame.t);
  }

  protected sendBytes(bytes: Uint8Array, type: string): void {
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
  protected fail(d: FatalDisconnect, msg: string, extra: { retry_ms?: number } = {}): void {
    this.send({ t: "ERROR", code: d.error, msg, fatal: true, ...extra });
    this.close(withReason(d, msg));
  }

  /** A request refused without closing (BAD_REQUEST, TOO_LARGE, ...), tied to its request id. */
  protected refuse(code: ErrorCode, msg: string, id?: number): void {
    this.send({ t: "ERROR", code, msg, fatal: false, ...(id !== undefined ? { id } : {}) });
  }
}
