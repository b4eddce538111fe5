/**
 * The worker's view of which gateways stopped: every gateway beats into a sorted set scored by
 * Redis's clock (gateway/hub/routes.ts); a gateway whose last beat is older than `silentAfterS` is
 * silent, and the router neither sends to it nor keeps it in users' routes. A gateway missing from
 * the set is not silent: the set is a cache too (evicted, flushed), and sending to a gateway that is
 * gone costs a message, while skipping one that is there would cost its devices their pushes.
 * A view older than STALE_AFTER_MS (Redis away) calls nobody silent.
 */
import { GATEWAY_LIVENESS } from "../protocol/index.js";
import type { GatewayLiveness } from "./push-router.js";

const STALE_AFTER_MS = 30_000;

/** Reads the beats: `[now, gateway, score, gateway, score, ...]` (GATEWAYS_SEEN_LUA). */
export type ReadBeats = () => Promise<string[]>;

export class GatewayBeats implements GatewayLiveness {
  private silent = new Set<string>();
  private readAt = -Infinity;
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly read: ReadBeats,
    private readonly onChange: () => void,
    private readonly clock: () => number = () => performance.now(),
  ) {}

  isSilent(gateway: string): boolean {
    return this.clock() - this.readAt < STALE_AFTER_MS && this.silent.has(gateway);
  }

  /** Reads the beats once; a failed read keeps the last view (until it is stale). */
  async refresh(): Promise<void> {
    let reply: string[];
    try {
      reply = await this.read();
    } catch {
      return;
    }
    this.readAt = this.clock();
    const now = Number(reply[0]);
    const silent = new Set<string>();
    for (let i = 1; i + 1 < reply.length; i += 2) if (Number(reply[i + 1]) < now - GATEWAY_LIVENESS.silentAfterS) silent.add(reply[i]!);
    const changed = silent.size !== this.silent.size || [...silent].some((g) => !this.silent.has(g));
    this.silent = silent;
    if (changed) this.onChange();
  }

  start(everyMs = 5000): void {
    void this.refresh();
    this.timer = setInterval(() => void this.refresh(), everyMs);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
  }
}
