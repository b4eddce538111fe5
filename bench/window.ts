/**
 * At most `size` promises in flight, counted, with one waiter. The benchmarks used to await a
 * Promise.race over every promise in flight once the window was full: that subscribes to all of
 * them (5,000 at a time) on every send, and was most of the producer's CPU in its profile.
 */
export class Window {
  private inFlight = 0;
  private wake: (() => void) | undefined;
  private error: unknown;

  constructor(private readonly size: number) {}

  private readonly settled = () => {
    this.inFlight--;
    const w = this.wake;
    this.wake = undefined;
    w?.();
  };

  /** Tracks `p` without waiting (paced senders). A rejection is rethrown by `drained`. */
  track(p: Promise<unknown>): void {
    this.inFlight++;
    p.then(this.settled, (err: unknown) => {
      this.error ??= err;
      this.settled();
    });
  }

  /** Tracks `p`; resolves once there is room for the next one (one caller at a time). */
  async add(p: Promise<unknown>): Promise<void> {
    this.track(p);
    while (this.inFlight >= this.size) await new Promise<void>((r) => (this.wake = r));
  }

  /** Resolves when nothing is in flight; rejects with the first rejection seen. */
  async drained(): Promise<void> {
    while (this.inFlight > 0) await new Promise<void>((r) => (this.wake = r));
    if (this.error !== undefined) throw this.error;
  }
}
