/**
 * What every producer of `npm run bench` and the device generators agree on: an entry body carries
 * the producer's wall-clock time (float64 ms, for latency across processes on one machine) and a
 * number unique over the run (float64: the producer's index times 2^32 plus its count), so devices
 * spread over several generator processes can count entries delivered twice; latencies are kept in
 * a histogram that merges across generators.
 */
import { pace } from "./pace.js";
import { Window } from "../window.js";

export const BODY_BYTES = 64;

/** A body stamped now with `id` (unique over the run; 0 is never used). */
export function stampedBody(id: number): Uint8Array<ArrayBuffer> {
  const b = new Uint8Array(BODY_BYTES);
  const v = new DataView(b.buffer);
  v.setFloat64(0, performance.timeOrigin + performance.now());
  v.setFloat64(8, id);
  return b;
}

/** Ids of producer `index` (0, 1, ...): index * 2^32 + 1, + 2, ... */
export function idSource(index: number): () => number {
  let n = 0;
  return () => index * 2 ** 32 + ++n;
}

/** The stamp and id of a body, or undefined for one too short to carry them. */
export function readStamp(b: Uint8Array): { sentAt: number; id: number } | undefined {
  if (b.byteLength < 16) return undefined;
  const v = new DataView(b.buffer, b.byteOffset, 16);
  return { sentAt: v.getFloat64(0), id: v.getFloat64(8) };
}

/**
 * Sends `one()` for `seconds`, as fast as it is taken (at most `window` in flight), or at
 * `rate`/s (bench/compare/pace.ts); resolves to how many were sent once all are acknowledged.
 */
export async function paced(seconds: number, rate: number | undefined, window: number, one: () => Promise<unknown>): Promise<number> {
  const until = performance.now() + seconds * 1000;
  const w = new Window(window);
  let sent = 0;
  if (rate === undefined) {
    while (performance.now() < until) {
      sent++;
      await w.add(one());
    }
  } else {
    sent = await pace(seconds, rate, (n) => {
      for (let i = 0; i < n; i++) w.track(one());
    });
  }
  await w.drained();
  return sent;
}

/** Bucket i holds latencies up to 1.02^i - 1 ms: 2% resolution, sparse, summed across processes. */
const GROWTH = Math.log(1.02);
export type Histogram = Record<string, number>;

export function record(h: Histogram, ms: number): void {
  const i = Math.max(0, Math.ceil(Math.log(Math.max(0, ms) + 1) / GROWTH));
  h[i] = (h[i] ?? 0) + 1;
}

export function merge(into: Histogram, h: Histogram): Histogram {
  for (const [i, n] of Object.entries(h)) into[i] = (into[i] ?? 0) + n;
  return into;
}

/** The latency (ms, upper bound of its bucket) at quantile q; 0 for an empty histogram. */
export function quantile(h: Histogram, q: number): number {
  const buckets = Object.entries(h).map(([i, n]) => [Number(i), n] as const).sort((a, b) => a[0] - b[0]);
  const total = buckets.reduce((s, [, n]) => s + n, 0);
  if (total === 0) return 0;
  const rank = Math.min(total, Math.max(1, Math.ceil(q * total)));
  let seen = 0;
  for (const [i, n] of buckets) {
    seen += n;
    if (seen >= rank) return Number((Math.exp(i * GROWTH) - 1).toFixed(2));
  }
  return 0;
}

/**
 * The ids one device has received, to count an entry it gets twice. Kept per producer as a sorted
 * Float64Array: ids arrive mostly in each producer's order, so an add is nearly always an append,
 * and a run's millions of ids cost 8 bytes each and nothing for the GC to trace, where a Set of
 * them grew the generator's heap with every delivery of the run.
 */
export class SeenIds {
  private readonly byProducer = new Map<number, { ids: Float64Array; n: number }>();

  /** False when `id` was added before (a duplicate). */
  add(id: number): boolean {
    const producer = Math.floor(id / 2 ** 32);
    let p = this.byProducer.get(producer);
    if (p === undefined) this.byProducer.set(producer, (p = { ids: new Float64Array(64), n: 0 }));
    const { ids, n } = p;
    let at = n;
    if (n > 0 && id <= ids[n - 1]!) {
      // out of order: where it belongs, or a duplicate
      let lo = 0;
      let hi = n - 1;
      while (lo < hi) {
        const mid = (lo + hi) >>> 1;
        if (ids[mid]! < id) lo = mid + 1;
        else hi = mid;
      }
      if (ids[lo] === id) return false;
      at = lo;
    }
    if (n === ids.length) {
      const grown = new Float64Array(n * 2);
      grown.set(ids);
      p.ids = grown;
    }
    p.ids.copyWithin(at + 1, at, n);
    p.ids[at] = id;
    p.n = n + 1;
    return true;
  }
}
