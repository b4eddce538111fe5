/**
 * A WebSocket relay between the client under test and a gateway that can lose one live MSGS
 * frame, as a lost push would leave a gap: the client must see the entry's `prev` above what it
 * applied and fill the gap (PULL) before applying the later entries.
 */
import { WebSocketServer, WebSocket, type RawData } from "ws";
import { decodeClientFrame, decodeServerFrame } from "../protocol/index.js";

/** Close codes a relay may pass on (1005, 1006 and 1015 are never sent on the wire). */
const sendable = (code: number) => code === 1000 || code === 1001 || (code >= 3000 && code <= 4999);

export class FrameProxy {
  private readonly wss: WebSocketServer;
  private armed = false;
  dropped = 0;
  pulls = 0;

  private constructor(
    wss: WebSocketServer,
    private readonly upstream: string,
  ) {
    this.wss = wss;
    wss.on("connection", (device, req) => this.relay(device, req.url ?? "/v1/ws"));
  }

  static async start(upstream: string): Promise<FrameProxy> {
    const wss = new WebSocketServer({ host: "127.0.0.1", port: 0 });
    await new Promise<void>((r) => wss.once("listening", () => r()));
    return new FrameProxy(wss, upstream);
  }

  get url(): string {
    const a = this.wss.address();
    if (a === null || typeof a === "string") throw new Error("the proxy does not listen on a TCP port");
    return `ws://127.0.0.1:${a.port}/v1/ws`;
  }

  /** The next live MSGS frame (one not answering a PULL) is dropped. */
  dropNextLiveMsgs(): void {
    this.armed = true;
  }

  private relay(device: WebSocket, path: string): void {
    const gateway = new WebSocket(`${this.upstream}${path.replace(/^\/v1\/ws/, "")}`);
    const early: RawData[] = [];
    device.on("message", (data: RawData) => {
      try {
        if (decodeClientFrame(new Uint8Array(data as Buffer)).t === "PULL") this.pulls++;
      } catch {
        // not ours to judge: the gateway answers it
      }
      if (gateway.readyState === WebSocket.OPEN) gateway.send(data, { binary: true });
      else early.push(data);
    });
    gateway.on("open", () => {
      for (const d of early.splice(0)) gateway.send(d, { binary: true });
    });
    gateway.on("message", (data: RawData) => {
      if (this.armed) {
        try {
          const f = decodeServerFrame(new Uint8Array(data as Buffer));
          if (f.t === "MSGS" && f.id === undefined && f.e.length > 0) {
            this.armed = false;
            this.dropped++;
            return;
          }
        } catch {
          // passed on as it came
        }
      }
      if (device.readyState === WebSocket.OPEN) device.send(data, { binary: true });
    });
    gateway.on("close", (code, reason) => device.close(sendable(code) ? code : 1000, reason.toString()));
    device.on("close", (code, reason) => gateway.close(sendable(code) ? code : 1000, reason.toString()));
    gateway.on("error", () => device.terminate());
    device.on("error", () => gateway.terminate());
  }

  async close(): Promise<void> {
    for (const c of this.wss.clients) c.terminate();
    await new Promise<void>((r) => this.wss.close(() => r()));
  }
}
