/**
 * Which of the Dispatcher's publishes nats-server has read. Every publish is numbered (its reply
 * token is the number in base 36); nats-server reads a connection in order, so an answer to
 * publish n, or a PING sent after it and answered (DispatchLink.flush), says that it has read
 * every publish up to n, or that they went with a connection that is gone: either way nats.js no
 * longer holds them. The flight publishes again, and gives back a window place, only for what has
 * been read (dispatch-flight.ts), so a stalled NATS never gets a second copy of anything.
 */
import type { DispatchLink } from "./dispatch-link.js";

export class PublishReads {
  /** The number of the last publish, and of the last one known to be read. */
  private published = 0;
  private upTo = 0;
  /** When `upTo` last moved, or nothing was unread (tick): a probe goes when it has not moved for `quietMs`. */
  private movedAt = 0;
  private seen = 0;
  private probing = false;

  constructor(
    private readonly link: DispatchLink,
    /** Called when more has been read. */
    private readonly onRead: () => void,
    private readonly quietMs: number,
  ) {}

  /** Numbers a publish. */
  next(): number {
    return ++this.published;
  }

  /** Whether publish `mark` has been read (0: nothing was published). */
  isRead(mark: number): boolean {
    return mark <= this.upTo;
  }

  /** nats-server has read every publish up to number `mark`. */
  readUpTo(mark: number): void {
    if (mark <= this.upTo) return;
    this.upTo = mark;
    this.onRead();
  }

  /**
   * Called by the flight's sweep: one PING at a time when publishes have gone unread for
   * `quietMs` (no answers: NATS stalled, or its answers lost); none while answers come.
   */
  tick(now: number): void {
    if (this.upTo !== this.seen || this.upTo === this.published) {
      this.seen = this.upTo;
      this.movedAt = now;
    } else if (!this.probing && now - this.movedAt >= this.quietMs) this.probe();
  }

  private probe(): void {
    this.probing = true;
    const mark = this.published;
    this.link.flush().then(
      () => {
        this.probing = false;
        this.readUpTo(mark);
      },
      // the connection was lost: what it carried is gone with it; the next tick asks again on the new one
      () => (this.probing = false),
    );
  }
}
