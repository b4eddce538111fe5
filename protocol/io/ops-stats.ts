/**
 * What each gateway and worker says about itself to the operator console: every process answers
 * a request on `jetgate.ops.stats` with its counts, and the console collects the answers that come
 * within a short wait. No process keeps a list of the others, and none writes stats anywhere.
 */
import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import { z } from "zod";
import type { DependencyHealth } from "./health.js";

export const OPS_STATS_SUBJECT = "jetgate.ops.stats";

export const ProcessStatsSchema = z.object({
  kind: z.enum(["gateway", "worker"]),
  id: z.string().max(128),
  /** Wall-clock ms when the process started. */
  startedAt: z.number().int().min(0),
  /** jetgate_mailbox_seq_regression_total of this process (must stay 0). */
  regressions: z.number().int().min(0),
  /** Whether NATS and Redis answer its probes (protocol/io/health.ts). */
  dependencies: z.object({ nats: z.boolean(), redis: z.boolean() }),
  /** Gateways: open device connections. */
  connections: z.number().int().min(0).optional(),
  /** Workers: the shards they run, with the last offset done and the lag behind the stream. */
  shards: z.array(z.object({ shard: z.number().int().min(0), epoch: z.number().int().min(0).optional(), offset: z.number().int().min(0), lag: z.number().int().min(0).optional() })).optional(),
});
export type ProcessStats = z.output<typeof ProcessStatsSchema>;

export interface StatsSource {
  kind: ProcessStats["kind"];
  id: string;
  /** The process's jetgate_mailbox_seq_regression_total (a prom-client counter). */
  regressions: { get(): Promise<{ values: { value: number }[] }> };
  health: Pick<DependencyHealth, "answering">;
  /** What only this kind of process says. */
  extra: () => Pick<ProcessStats, "connections" | "shards">;
}

/** Answers every stats request with what the process says now. */
export function answerStats(nc: NatsConnection, src: StatsSource): Subscription {
  const startedAt = Date.now();
  const stats = async (): Promise<ProcessStats> => ({
    kind: src.kind,
    id: src.id,
    startedAt,
    regressions: (await src.regressions.get()).values.reduce((n, v) => n + v.value, 0),
    dependencies: { nats: src.health.answering("nats"), redis: src.health.answering("redis") },
    ...src.extra(),
  });
  return nc.subscribe(OPS_STATS_SUBJECT, {
    callback: (err, msg) => {
      if (err !== null) return;
      stats().then(
        (s) => msg.respond(JSON.stringify(s)),
        () => undefined,
      );
    },
  });
}

/** Every process's answer that arrives within `waitMs`; answers that do not parse are dropped. */
export async function collectStats(nc: NatsConnection, waitMs: number): Promise<ProcessStats[]> {
  const out: ProcessStats[] = [];
  const replies = await nc.requestMany(OPS_STATS_SUBJECT, "", { maxWait: waitMs });
  for await (const m of replies) {
    const parsed = ProcessStatsSchema.safeParse(m.json());
    if (parsed.success) out.push(parsed.data);
  }
  return out.sort((a, b) => a.kind.localeCompare(b.kind) || a.id.localeCompare(b.id));
}
