/**
 * The gateway's connections against its file limit, wired up (the decisions:
 * gateway/http/capacity.ts): the soft limit raised to the hard one at start and both logged, the
 * plan made once everything but devices is open, the guard that pauses the listener, and what
 * readiness and metrics say of it.
 */
import type { Logger } from "pino";
import { systemClock, type Config } from "../protocol/index.js";
import { openFiles, raiseFileLimit } from "./files.js";
import { AcceptGuard } from "./http/accept-guard.js";
import { capacityPlan, type CapacityPlan } from "./http/capacity.js";
import type { GatewayServer } from "./http/server.js";
import type { GatewayMetrics } from "./metrics.js";

export class ConnectionCapacity {
  private guard: AcceptGuard | undefined;
  private server: GatewayServer | undefined;
  readonly plan: CapacityPlan;

  /** Raises the soft file limit (log: before and after) and makes the plan from the files open now: call it once all but devices is open. */
  constructor(
    config: Config,
    private readonly log: Logger,
    private readonly metrics: GatewayMetrics,
  ) {
    const raised = raiseFileLimit();
    const limit = raised.after.soft;
    const fields = { soft: raised.after.soft, hard: raised.after.hard, softBefore: raised.before.soft };
    if (raised.failed !== undefined) log.warn({ ...fields, why: raised.failed }, "open files limit: the soft limit could not be raised to the hard one");
    else log.info(fields, "open files limit");
    this.plan = capacityPlan(limit, openFiles() ?? 0, config.JETGATE_MAX_CONNECTIONS);
    if (this.plan.clamped !== undefined) log.warn({ ...this.plan }, this.plan.clamped);
    else log.info({ ...this.plan }, "devices taken at once");
    metrics.fileLimit.set(limit);
    metrics.maxConnections.set(this.plan.maxConnections);
    metrics.openFilesNow = () => this.guard?.lastOpen ?? openFiles() ?? limit;
  }

  /** Starts watching the files of `server` (its listener is paused when they run out). */
  watch(server: GatewayServer): void {
    this.server = server;
    this.guard = new AcceptGuard(this.plan, {
      openFiles,
      pause: () => server.pauseAccepting(),
      resume: () => server.resumeAccepting(),
      changed: (paused, open) => {
        if (paused) {
          this.metrics.acceptPauses.inc();
          this.log.warn({ open, limit: this.plan.limit, connections: server.connections() }, "out of files: not accepting connections until some are free (new ones are refused)");
        } else this.log.info({ open, limit: this.plan.limit }, "files free again: accepting connections");
      },
    }, systemClock).start();
  }

  stop(): void {
    this.guard?.stop();
  }

  /** For readiness: `capacity` while no more devices are taken here (so new ones go to another gateway). */
  problem(): string | undefined {
    if (this.server === undefined) return undefined;
    return this.server.connections() >= this.plan.maxConnections || this.guard?.accepting === false ? "capacity" : undefined;
  }

  /** Why, in words, for /readyz's detail. */
  detail(): string {
    if (this.guard?.accepting === false) return `out of files: ${this.guard.lastOpen ?? "all"} of ${this.plan.limit} open; not accepting connections`;
    return `${this.server?.connections() ?? 0} of ${this.plan.maxConnections} connections (JETGATE_MAX_CONNECTIONS; open files limit ${this.plan.limit})`;
  }
}
