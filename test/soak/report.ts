/**
 * The soak's pure parts (test/soak/soak.ts runs it): the fault schedule from a seed, what is read
 * from /metrics and /proc, and the table and final line it prints. Unit-tested in
 * test/unit/soak-report.test.ts.
 */

/** The fault suite's faults that a long run can repeat (each leaves the stack as it found it, or bigger). */
export const FAULTS = ["worker-kill", "gateway-kill", "redis-restart", "nats-restart", "shard-split", "takeover", "redis-evict", "redis-oom"] as const;
export type FaultKind = (typeof FAULTS)[number];

/** mulberry32: a small seeded PRNG, so a schedule can be replayed from the printed seed. */
export function seededRandom(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * One fault per minute: the list shuffled afresh for every 6 minutes, so every kind comes once in
 * each 6 (5 times in 30 minutes) and a 3-minute run still gets 3 different ones.
 */
export function faultSchedule(seed: number, minutes: number, random = seededRandom(seed)): FaultKind[] {
  const out: FaultKind[] = [];
  while (out.length < minutes) {
    const bag: FaultKind[] = [...FAULTS];
    for (let i = bag.length - 1; i > 0; i--) {
      const j = Math.floor(random() * (i + 1));
      [bag[i], bag[j]] = [bag[j]!, bag[i]!];
    }
    out.push(...bag);
  }
  return out.slice(0, minutes);
}

/**
 * Sum of a metric over its label sets in Prometheus text format (undefined when absent).
 * JetgateProcess.metric's pattern allows no digits in names, and prom-client's `..._p99_seconds` has some.
 */
export function metricValue(text: string, name: string): number | undefined {
  let sum: number | undefined;
  for (const line of text.split("\n")) {
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (m?.[1] === name && !Number.isNaN(Number(m[3]))) sum = (sum ?? 0) + Number(m[3]);
  }
  return sum;
}

/** Resident set size in bytes from the text of /proc/<pid>/status. */
export function vmRssBytes(status: string): number | undefined {
  const m = /^VmRSS:\s+(\d+)\s+kB/m.exec(status);
  return m ? Number(m[1]) * 1024 : undefined;
}

/** One 10-second reading of one jetgate process. */
export interface Sample {
  t: number;
  /** Logical slot (gateway-1, worker-2): a SIGKILLed process's replacement takes its slot. */
  slot: string;
  pid: number;
  rss?: number;
  /** Event-loop delay p99 over the interval since the previous scrape, seconds. */
  loopP99?: number;
}

export const roleOf = (slot: string): string => slot.replace(/-\d+$/, "");

/** Largest value of `pick` among samples in [from, to) of slots of `role` (any role when undefined). */
export function maxIn(samples: readonly Sample[], from: number, to: number, pick: (s: Sample) => number | undefined, role?: string): number | undefined {
  let max: number | undefined;
  for (const s of samples) {
    if (s.t < from || s.t >= to || (role !== undefined && roleOf(s.slot) !== role)) continue;
    const v = pick(s);
    if (v !== undefined && (max === undefined || v > max)) max = v;
  }
  return max;
}

export interface Row {
  minute: number;
  fault: string;
  faultMs: number;
  /** Undefined when the probe entry never reached its user's devices. */
  recoverMs: number | undefined;
  dispatched: number;
  delivered: number;
  missing: number;
  duplicates: number;
  gatewayRss: number | undefined;
  workerRss: number | undefined;
  loopP99: number | undefined;
}

const mib = (b: number | undefined): string => (b === undefined ? "-" : (b / 2 ** 20).toFixed(1));
const ms = (s: number | undefined): string => (s === undefined ? "-" : (s * 1000).toFixed(1));

/** A markdown table, so a run's output can go into docs/operations.md as it is. */
export function formatTable(rows: readonly Row[]): string {
  const head = ["min", "fault", "fault ms", "recovery ms", "dispatched", "delivered", "missing", "duplicates", "gateway RSS max MiB", "worker RSS max MiB", "event-loop p99 max ms"];
  const lines = [`| ${head.join(" | ")} |`, `|${head.map(() => "---").join("|")}|`];
  for (const r of rows) {
    const cells = [r.minute, r.fault, r.faultMs, r.recoverMs ?? "TIMEOUT", r.dispatched, r.delivered, r.missing, r.duplicates, mib(r.gatewayRss), mib(r.workerRss), ms(r.loopP99)];
    lines.push(`| ${cells.join(" | ")} |`);
  }
  return lines.join("\n");
}

/**
 * RSS growth of each process of each slot, after warm-up: from its first sample taken both after
 * `warmupEnd` and a minute after its own first sample (a replacement warms up too) to its last.
 * A slot whose process was replaced lists every process, the later ones as "replaced at min N".
 */
export function rssGrowth(samples: readonly Sample[], t0: number, warmupEnd: number): string[] {
  const bySlot = new Map<string, Map<number, Sample[]>>();
  for (const s of samples) {
    if (s.rss === undefined) continue;
    const procs = bySlot.get(s.slot) ?? new Map<number, Sample[]>();
    bySlot.set(s.slot, procs);
    procs.set(s.pid, [...(procs.get(s.pid) ?? []), s]);
  }
  const out: string[] = [];
  for (const slot of [...bySlot.keys()].sort()) {
    const parts = [...bySlot.get(slot)!.values()].map((list, i) => {
      const since = Math.max(warmupEnd, list[0]!.t + 60_000);
      const base = list.find((s) => s.t >= since);
      const last = list[list.length - 1]!;
      const figure = base === undefined || base === last
        ? "n/a (lived under a minute after warm-up)"
        : `${last.rss! >= base.rss! ? "+" : "-"}${mib(Math.abs(last.rss! - base.rss!))} MiB over ${((last.t - base.t) / 60_000).toFixed(1)} min`;
      return i === 0 ? figure : `replaced at min ${Math.floor((list[0]!.t - t0) / 60_000)}: ${figure}`;
    });
    out.push(`${slot} ${parts.join(", ")}`);
  }
  return out;
}

export interface Totals {
  minutes: number;
  faults: number;
  dispatched: number;
  delivered: number;
  missing: number;
  duplicates: number;
  regressions: number;
  growth: string[];
}

export function finalLine(t: Totals): string {
  return `soak: ${t.minutes} min, ${t.faults} faults, dispatched ${t.dispatched} delivered ${t.delivered} missing ${t.missing} ` +
    `duplicates ${t.duplicates} regressions ${t.regressions}; RSS growth after warm-up: ${t.growth.join("; ")}`;
}
