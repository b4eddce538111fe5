/**
 * Keys (small integers: slots) by the time they expire, earliest first (a binary min-heap): what
 * lets a gateway forget expired revocations a few at a time, without a scan of every one it holds.
 * A key pushed again with a later time leaves its earlier entry behind; the caller skips those as
 * it pops them. Two arrays of numbers: no object per entry.
 */
export class ExpiryQueue {
  private readonly at: number[] = [];
  private readonly keys: number[] = [];

  get size(): number {
    return this.at.length;
  }

  push(at: number, key: number): void {
    let i = this.at.length;
    this.at.push(at);
    this.keys.push(key);
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (this.at[parent]! <= at) break;
      this.move(parent, i);
      i = parent;
    }
    this.at[i] = at;
    this.keys[i] = key;
  }

  /** The earliest entry's time, or undefined when empty. */
  peek(): number | undefined {
    return this.at[0];
  }

  /** Removes the earliest entry and returns its key (undefined when empty). */
  pop(): number | undefined {
    const n = this.at.length;
    if (n === 0) return undefined;
    const top = this.keys[0];
    const lastAt = this.at.pop()!;
    const lastKey = this.keys.pop()!;
    if (n > 1) this.sink(lastAt, lastKey);
    return top;
  }

  /** Puts (at, key) at the root's place and moves it down to where it belongs. */
  private sink(at: number, key: number): void {
    const n = this.at.length;
    let i = 0;
    for (;;) {
      let child = 2 * i + 1;
      if (child >= n) break;
      if (child + 1 < n && this.at[child + 1]! < this.at[child]!) child++;
      if (this.at[child]! >= at) break;
      this.move(child, i);
      i = child;
    }
    this.at[i] = at;
    this.keys[i] = key;
  }

  private move(from: number, to: number): void {
    this.at[to] = this.at[from]!;
    this.keys[to] = this.keys[from]!;
  }
}
