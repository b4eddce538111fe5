/**
 * Between the push source and the sessions: push batches received in one event-loop turn are
 * handed over together, once per turn, so that a user's sessions send one frame for all of them.
 *
 * Why: nats.js parses what its socket has read in one run of microtasks. Handing each batch over at
 * once made every batch a frame per session, and a gateway behind by a few seconds (the `hot`
 * benchmark above ~90k deliveries/s: 20 users of 50 devices) spent runs of 5-8 s in uWebSockets.js
 * `send` with no turn for its sockets to drain, so every send went to a growing backpressure buffer
 * and the next run was longer. Handed over per turn, a backlog costs one frame per session per
 * handover instead of one per batch, and the sockets get a turn between handovers.
 */
import type { Push } from "../../protocol/index.js";

/**
 * Most pushes, and entry bytes, merged into one handover: a session's MSGS frame holds at most
 * these of its user's. The bytes stay well under a socket's send limit (JETGATE_MAX_BACKPRESSURE,
 * 1 MiB by default): a frame above twice it is refused by uWebSockets.js, which closes the socket
 * without the 4408 that tells a device to resume by cursor. A batch larger on its own (a worker's
 * push message, under 512 KiB) goes over alone, as it came.
 */
export const MAX_HANDOVER_PUSHES = 1024;
export const MAX_HANDOVER_BYTES = 256 * 1024;

const bytesOf = (pushes: readonly Push[]) => pushes.reduce((n, p) => n + p.entry.b.byteLength, 0);

export class PushHandover {
  /** Batches not handed over yet, in arrival order; consecutive ones of the same kind merged. */
  private readonly queued: { pushes: Push[]; bytes: number; broadcast: boolean }[] = [];
  private scheduled = false;

  constructor(
    private readonly onPushes: (pushes: readonly Push[], broadcast: boolean) => void,
    /** Runs `fn` at the next turn of the event loop (setImmediate), after the I/O already read. */
    private readonly later: (fn: () => void) => void = (fn) => void setImmediate(fn),
  ) {}

  /** Takes a batch (the caller gives up the array); handed over at the next turn. */
  take(pushes: Push[], broadcast: boolean): void {
    if (pushes.length === 0) return;
    const bytes = bytesOf(pushes);
    const last = this.queued[this.queued.length - 1];
    if (last !== undefined && last.broadcast === broadcast && last.pushes.length + pushes.length <= MAX_HANDOVER_PUSHES && last.bytes + bytes <= MAX_HANDOVER_BYTES) {
      for (const p of pushes) last.pushes.push(p);
      last.bytes += bytes;
    } else this.queued.push({ pushes, bytes, broadcast });
    this.schedule();
  }

  /** Drops what is queued (the source stopped). */
  clear(): void {
    this.queued.length = 0;
  }

  private schedule(): void {
    if (this.scheduled) return;
    this.scheduled = true;
    this.later(() => this.handOver());
  }

  /** One merged batch per turn: the sockets get a turn between two. */
  private handOver(): void {
    this.scheduled = false;
    const next = this.queued.shift();
    if (this.queued.length > 0) this.schedule();
    if (next !== undefined) this.onPushes(next.pushes, next.broadcast);
  }
}
