/**
 * The revocations a gateway holds, by field (`u:<user>`, `d:<user>:<device>`), with no JavaScript
 * object per revocation: a million field strings in Maps made every major garbage collection of a
 * gateway copy and re-point them (Mark-Compact pauses of 52 ms with 200,000 here, and one Map of a
 * million rehashed in one go as it grew: 46 ms). A field is known by two 32-bit hashes: the first
 * picks one of SHARDS Maps and its key there (a small integer, stored inline), the second is kept
 * in a typed array and told apart when the first collides (chained slots). Times live in typed
 * arrays at the field's slot.
 *
 * Two fields whose 64 bits of hash both agree would share a slot (about 1 in 10^7 for a whole
 * list of a million): their revocations merge to the later of each time, so both are refused
 * more, never less. Ids come from the backend's tokens and calls, not from the devices.
 */

const SHARDS = 64;
const NONE = -1;

/** The field's two hashes: FNV-1a and a murmur-style mix, each finished with an avalanche step. */
export function fieldHashes(field: string): [number, number] {
  let a = 0x811c9dc5;
  let b = 0x9747b28c;
  for (let i = 0; i < field.length; i++) {
    const c = field.charCodeAt(i);
    a = Math.imul(a ^ c, 16777619);
    b = Math.imul(b ^ c, 0x5bd1e995);
    b ^= b >>> 15;
  }
  return [fmix(a), fmix(b ^ field.length)];
}

function fmix(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  return (h ^ (h >>> 16)) | 0;
}

export class RevocationTable {
  /** Per shard: the first hash's upper bits -> the first slot of its chain. */
  private readonly heads = Array.from({ length: SHARDS }, () => new Map<number, number>());
  private hash1 = new Int32Array(1024);
  private hash2 = new Int32Array(1024);
  private next = new Int32Array(1024);
  /** `issued_before` (s) and expiry (ms) at each slot. */
  before = new Float64Array(1024);
  expires = new Float64Array(1024);
  private readonly free: number[] = [];
  private used = 0;
  private count = 0;

  get size(): number {
    return this.count;
  }

  /** The field's slot, or -1 when it holds none. */
  find(field: string): number {
    const [h1, h2] = fieldHashes(field);
    for (let s = this.heads[h1 & (SHARDS - 1)]!.get(h1 >> 6) ?? NONE; s !== NONE; s = this.next[s]!) if (this.hash2[s] === h2) return s;
    return NONE;
  }

  /** The field's slot, made (its times -1, below any time) when it had none. */
  slot(field: string): number {
    const [h1, h2] = fieldHashes(field);
    const heads = this.heads[h1 & (SHARDS - 1)]!;
    const first = heads.get(h1 >> 6) ?? NONE;
    for (let s = first; s !== NONE; s = this.next[s]!) if (this.hash2[s] === h2) return s;
    const s = this.free.pop() ?? this.grow();
    [this.hash1[s], this.hash2[s], this.next[s], this.before[s], this.expires[s]] = [h1, h2, first, -1, -1];
    heads.set(h1 >> 6, s);
    this.count++;
    return s;
  }

  /** Forgets what `slot` holds (its times read NaN until it is used again). */
  remove(slot: number): void {
    const h1 = this.hash1[slot]!;
    const heads = this.heads[h1 & (SHARDS - 1)]!;
    const first = heads.get(h1 >> 6)!;
    if (first === slot) {
      if (this.next[slot] === NONE) heads.delete(h1 >> 6);
      else heads.set(h1 >> 6, this.next[slot]!);
    } else {
      let s = first;
      while (this.next[s] !== slot) s = this.next[s]!;
      this.next[s] = this.next[slot]!;
    }
    this.before[slot] = this.expires[slot] = NaN;
    this.free.push(slot);
    this.count--;
  }

  private grow(): number {
    if (this.used === this.before.length) {
      const n = this.used * 2;
      const more = <T extends Int32Array | Float64Array>(a: T, make: new (n: number) => T): T => {
        const b = new make(n);
        b.set(a);
        return b;
      };
      this.hash1 = more(this.hash1, Int32Array);
      this.hash2 = more(this.hash2, Int32Array);
      this.next = more(this.next, Int32Array);
      this.before = more(this.before, Float64Array);
      this.expires = more(this.expires, Float64Array);
    }
    return this.used++;
  }
}
