/**
 * A jetgate process's V8, through the inspector protocol (the process started with
 * `--inspect=127.0.0.1:0`): a full garbage collection, and the heap it leaves. What a process still
 * holds after a full collection is what a leak grows; its RSS, or V8's committed heap, also grows
 * with the heap V8 keeps for later, and no test can tell the two apart on them.
 */
import WebSocket from "ws";
import type { JetgateProcess } from "./stack.js";
import { waitFor } from "./wait.js";

export class Inspector {
  private nextId = 1;
  private readonly pending = new Map<number, (r: { result?: Record<string, unknown>; error?: { message: string } }) => void>();

  private constructor(private readonly ws: WebSocket) {
    ws.on("message", (data: Buffer) => {
      const m = JSON.parse(data.toString()) as { id?: number; result?: Record<string, unknown>; error?: { message: string } };
      if (m.id !== undefined) this.pending.get(m.id)?.(m);
    });
  }

  /** Connects to the inspector `proc` announced on its stderr. */
  static async of(proc: JetgateProcess): Promise<Inspector> {
    const url = await waitFor("the inspector's address", () => proc.output.map((l) => /Debugger listening on (ws:\/\/\S+)/.exec(l)?.[1]).find((u) => u !== undefined));
    const ws = new WebSocket(url);
    await new Promise<void>((resolve, reject) => {
      ws.once("open", () => resolve());
      ws.once("error", reject);
    });
    return new Inspector(ws);
  }

  private call(method: string, params: Record<string, unknown> = {}): Promise<Record<string, unknown>> {
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, (r) => {
        this.pending.delete(id);
        if (r.error !== undefined) reject(new Error(`${method}: ${r.error.message}`));
        else resolve(r.result ?? {});
      });
      this.ws.send(JSON.stringify({ id, method, params }));
    });
  }

  /** MiB the heap holds after a full garbage collection: what is alive. */
  async liveHeapMb(): Promise<number> {
    await this.call("HeapProfiler.collectGarbage");
    const usage = await this.call("Runtime.getHeapUsage");
    return (usage.usedSize as number) / 2 ** 20;
  }

  /** Runs `expression` in the process (a test planting a leak). */
  async evaluate(expression: string): Promise<void> {
    await this.call("Runtime.evaluate", { expression });
  }

  close(): void {
    this.ws.close();
  }
}
