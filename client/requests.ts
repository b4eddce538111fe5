/** The requests the client waits on an answer for: PULLs (a gap's entries) and SENDs. */
import type { Entry } from "../protocol/device.js";

/** A PULL's answer: its entries, or nothing because the connection ended first. */
export type PullReply = { type: "entries"; entries: Entry[]; more: boolean } | { type: "lost" };

export class PendingPulls {
  private readonly waiting = new Map<number, (r: PullReply) => void>();

  /** Waits for the answer to PULL `id`; `send` writes the PULL once the answer can be taken. */
  request(id: number, send: () => void): Promise<PullReply> {
    return new Promise((resolve) => {
      this.waiting.set(id, resolve);
      send();
    });
  }

  has(id: number): boolean {
    return this.waiting.has(id);
  }

  answer(id: number, reply: PullReply): void {
    this.waiting.get(id)?.(reply);
    this.waiting.delete(id);
  }

  /** The connection ended: no answer will come. */
  loseAll(): void {
    for (const resolve of this.waiting.values()) resolve({ type: "lost" });
    this.waiting.clear();
  }
}

interface PendingSend {
  cmid: string;
  b: Uint8Array<ArrayBuffer>;
  resolve: (r: { dup: boolean }) => void;
  reject: (e: Error) => void;
}

/** SENDs until SEND_OK: each is written again (same cmid) on every new connection. */
export class PendingSends {
  private readonly pending = new Map<number, PendingSend>();

  add(id: number, s: PendingSend): void {
    this.pending.set(id, s);
  }

  get(id: number): PendingSend | undefined {
    return this.pending.get(id);
  }

  all(): IterableIterator<[number, PendingSend]> {
    return this.pending.entries();
  }

  resolve(id: number, r: { dup: boolean }): void {
    const s = this.pending.get(id);
    this.pending.delete(id);
    s?.resolve(r);
  }

  reject(id: number, error: Error): void {
    const s = this.pending.get(id);
    this.pending.delete(id);
    s?.reject(error);
  }

  rejectAll(error: () => Error): void {
    for (const s of this.pending.values()) s.reject(error());
    this.pending.clear();
  }
}
