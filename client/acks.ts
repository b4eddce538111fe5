/** Cumulative ACKs: one after `every.entries` applied entries or `every.ms`, whichever comes first. */
import type { Clock, Timer } from "./clock.js";

export class Acks {
  private unacked = 0;
  private timer: Timer | undefined;

  constructor(
    private readonly clock: Clock,
    private readonly every: { entries: number; ms: number },
    /** Sends ACK of the last applied seq. */
    private readonly send: () => void,
  ) {}

  /** One more entry applied. */
  count(): void {
    if (++this.unacked >= this.every.entries) this.flush();
    else this.timer ??= this.clock.setTimeout(() => this.flush(), this.every.ms);
  }

  flush(): void {
    this.clock.clearTimeout(this.timer);
    this.timer = undefined;
    if (this.unacked === 0) return;
    this.unacked = 0;
    this.send();
  }
}
