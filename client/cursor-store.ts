/**
 * Where a device keeps its cursor between sessions: the signed token of the gateway plus the last
 * applied seq. Three stores: memory, localStorage (browsers), and a file (client/node.ts).
 */
import type { DeviceCursor } from "../protocol/device.js";

export interface CursorStore {
  load(): Promise<DeviceCursor | undefined>;
  save(cursor: DeviceCursor): Promise<void>;
  clear(): Promise<void>;
}

/** JSON form: seq as a decimal string (JSON numbers lose integers above 2^53), sig as hex. */
export function serializeCursor(c: DeviceCursor): string {
  const sig = Array.from(c.sig, (b) => b.toString(16).padStart(2, "0")).join("");
  return JSON.stringify({ shard: c.shard, epoch: c.epoch, log: c.log, seq: c.seq.toString(), sig });
}

/** Parses a stored cursor; undefined for anything unreadable (the device then starts fresh). */
export function deserializeCursor(text: string | null | undefined): DeviceCursor | undefined {
  if (!text) return undefined;
  try {
    const o = JSON.parse(text) as { shard?: unknown; epoch?: unknown; log?: unknown; seq?: unknown; sig?: unknown };
    if (typeof o.shard !== "number" || typeof o.epoch !== "number" || typeof o.log !== "string") return undefined;
    if (typeof o.seq !== "string" || !/^\d{1,20}$/.test(o.seq) || typeof o.sig !== "string" || !/^([0-9a-f]{2})+$/.test(o.sig)) return undefined;
    const sig = new Uint8Array(o.sig.length / 2);
    for (let i = 0; i < sig.length; i++) sig[i] = parseInt(o.sig.slice(i * 2, i * 2 + 2), 16);
    return { shard: o.shard, epoch: o.epoch, log: o.log, seq: BigInt(o.seq), sig };
  } catch {
    return undefined;
  }
}

export class MemoryCursorStore implements CursorStore {
  private value: string | undefined;
  async load() {
    return deserializeCursor(this.value);
  }
  async save(c: DeviceCursor) {
    this.value = serializeCursor(c);
  }
  async clear() {
    this.value = undefined;
  }
}

/** Browser store on `localStorage` (or any object with its three methods). */
export class LocalStorageCursorStore implements CursorStore {
  constructor(
    private readonly key: string,
    private readonly storage: Pick<Storage, "getItem" | "setItem" | "removeItem"> = globalThis.localStorage,
  ) {}
  async load() {
    return deserializeCursor(this.storage.getItem(this.key));
  }
  async save(c: DeviceCursor) {
    this.storage.setItem(this.key, serializeCursor(c));
  }
  async clear() {
    this.storage.removeItem(this.key);
  }
}
