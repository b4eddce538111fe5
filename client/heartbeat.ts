/**
 * The device's side of the heartbeat: PING every `hb` ms (from AUTH_OK); no frame from the server
 * for 2 x hb + 5 s means a dead link, and the client gives the socket up at once instead of waiting
 * on its close handshake (30 s in `ws`).
 */
import type { Clock, Timer } from "./clock.js";

export interface Heartbeat {
  /** AUTH_OK: ping every `hbMs` (at least a second), and watch for silence. */
  start(hbMs: number): void;
  /** A frame came from the server (or the socket opened). */
  heard(): void;
  stop(): void;
}

export class PingHeartbeat implements Heartbeat {
  private timer: Timer | undefined;
  private lastHeard = 0;

  constructor(
    private readonly clock: Clock,
    private readonly ping: () => void,
    private readonly missed: () => void,
  ) {}

  start(hbMs: number): void {
    this.clock.clearInterval(this.timer);
    const hb = Math.max(1000, hbMs);
    this.timer = this.clock.setInterval(() => {
      if (this.clock.monotonic() - this.lastHeard > hb * 2 + 5000) {
        this.missed();
        return;
      }
      this.ping();
    }, hb);
  }

  heard(): void {
    this.lastHeard = this.clock.monotonic();
  }

  stop(): void {
    this.clock.clearInterval(this.timer);
    this.timer = undefined;
  }
}
