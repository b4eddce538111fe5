/**
 * The message ids a device applied most recently: the last line of dedup (docs/design.md, "Nothing is lost") after a rebase
 * replays entries it already has. Bounded: the oldest ids are forgotten past `capacity`; a
 * duplicate older than the window is applied again (the app's handler should then be idempotent
 * too, which it must be anyway for entries replayed after a crash before the cursor was saved).
 */
export class RecentIds {
  private readonly ids = new Set<string>();

  constructor(readonly capacity = 10_000) {}

  has(id: string): boolean {
    return this.ids.has(id);
  }

  add(id: string): void {
    if (this.ids.has(id)) return;
    this.ids.add(id);
    if (this.ids.size > this.capacity) {
      const oldest = this.ids.values().next().value as string;
      this.ids.delete(oldest);
    }
  }

  get size(): number {
    return this.ids.size;
  }
}
