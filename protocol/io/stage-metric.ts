/**
 * A process's StageTimes (protocol/stages.ts) as a Prometheus histogram in its registry: read at
 * each scrape, nothing done per observation but counting.
 */
import type { Registry } from "prom-client";
import type { StageTimes } from "../stages.js";

export function registerStageMetric(registry: Registry, name: string, help: string, times: StageTimes): void {
  registry.registerMetric({
    name,
    help,
    type: "histogram",
    aggregator: "sum",
    get: () => Promise.resolve({ name, help, type: "histogram", aggregator: "sum", values: times.samples(name) }),
  } as unknown as Parameters<Registry["registerMetric"]>[0]);
}
