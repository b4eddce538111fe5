/**
 * The stages of an entry's live path, each timed where it happens (docs/performance.md, "Where an
 * entry's time goes"): the Dispatcher's queue and the append's ack (the backend's process), the
 * worker's wait for the consumer, its Redis step, its confirmation of the epoch and its push, and
 * the gateway's hand-off from push to frame. One bucket list for all, so the bench can read them
 * side by side. Pure: the processes export them as Prometheus histograms, the bench's producer as
 * counts.
 */

export const STAGES = [
  /** Dispatcher: an entry taken to its first publish (waiting behind its user's entry in flight, or for the window). */
  "dispatch_queue",
  /** Dispatcher: first publish to its ack (nats-server storing it, and the answer's way back). */
  "dispatch_ack",
  /** Worker: stored in the stream to the worker's batch taking it (the consumer's delivery, the worker's queue). */
  "worker_fetch_wait",
  /** Worker: the batch's Redis step (one script call per Redis node). */
  "worker_redis",
  /** Worker: the epoch confirmed against the registry's head (a read only when the last one is older than CONFIRM_FRESH_MS). */
  "worker_confirm",
  /** Worker: the pushes routed and published, to the batch's ack. */
  "worker_push",
  /** Gateway: a push received to its frame handed to the socket, once per session (the chain's waits included). */
  "gateway_chain",
] as const;
export type Stage = (typeof STAGES)[number];

/** Bucket bounds (seconds): 100 µs .. 10 s. */
export const STAGE_BUCKETS_S = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10] as const;

/** Observations per bucket (the last: above 10 s), as a histogram's non-cumulative counts. */
export type StageCounts = number[];

export const emptyStageCounts = (): StageCounts => new Array<number>(STAGE_BUCKETS_S.length + 1).fill(0);

/** Counts `n` observations of `seconds` into `counts`. */
export function observeStage(counts: StageCounts, seconds: number, n = 1): void {
  let i = 0;
  while (i < STAGE_BUCKETS_S.length && seconds > STAGE_BUCKETS_S[i]!) i++;
  counts[i]! += n;
}

/**
 * Prometheus's cumulative bucket counts (one per bound, then +Inf) to per-bucket counts; `before`,
 * when given, is subtracted first (the counts between two scrapes).
 */
export function stageCountsOf(cumulative: readonly number[], before?: readonly number[]): StageCounts {
  const out = emptyStageCounts();
  let prev = 0;
  for (let i = 0; i < out.length; i++) {
    const c = (cumulative[i] ?? 0) - (before?.[i] ?? 0);
    out[i] = Math.max(0, c - prev);
    prev = c;
  }
  return out;
}

/**
 * The `q` quantile of `counts` as the upper bound of its bucket, in ms (Infinity: above the last
 * bound); undefined when nothing was observed.
 */
export function stageQuantileMs(counts: readonly number[], q: number): number | undefined {
  const total = counts.reduce((a, b) => a + b, 0);
  if (total === 0) return undefined;
  let seen = 0;
  for (let i = 0; i < counts.length; i++) {
    seen += counts[i]!;
    if (seen >= q * total) return i < STAGE_BUCKETS_S.length ? STAGE_BUCKETS_S[i]! * 1000 : Infinity;
  }
  return Infinity;
}

/**
 * Stage times of one process: counts per bucket and the sum per stage. `observe` takes a count, so
 * a batch's step is one call for all its entries (a Prometheus Histogram takes one observation a
 * call: on the worker's hot path, that was 5% of its CPU).
 */
export class StageTimes {
  private readonly stages = new Map<Stage, { counts: StageCounts; sum: number }>();

  observe(stage: Stage, seconds: number, n = 1): void {
    let s = this.stages.get(stage);
    if (s === undefined) this.stages.set(stage, (s = { counts: emptyStageCounts(), sum: 0 }));
    observeStage(s.counts, seconds, n);
    s.sum += seconds * n;
  }

  /**
   * As a Prometheus histogram's samples (`<name>_bucket{stage,le}` cumulative, `_sum`, `_count`),
   * in the shape prom-client's registry prints (protocol/io/stage-metric.ts registers it).
   */
  samples(name: string): { metricName: string; labels: Record<string, string | number>; value: number }[] {
    const out: { metricName: string; labels: Record<string, string | number>; value: number }[] = [];
    for (const stage of STAGES) {
      const s = this.stages.get(stage);
      if (s === undefined) continue;
      let cumulative = 0;
      for (let i = 0; i < s.counts.length; i++) {
        cumulative += s.counts[i]!;
        out.push({ metricName: `${name}_bucket`, labels: { stage, le: i < STAGE_BUCKETS_S.length ? STAGE_BUCKETS_S[i]! : "+Inf" }, value: cumulative });
      }
      out.push({ metricName: `${name}_sum`, labels: { stage }, value: s.sum });
      out.push({ metricName: `${name}_count`, labels: { stage }, value: cumulative });
    }
    return out;
  }
}
