/** A scripted device for tests: a real WebSocket (`ws`) speaking protocol v1 through protocol/'s codec. */
import WebSocket from "ws";
import { SignJWT } from "jose";
import { DEV_JWT_SECRET, decodeServerFrame, encodeFrame, type ClientFrame, type Entry, type ServerFrame } from "../../protocol/index.js";
import { waitFor } from "./wait.js";

/** `issuedAt`: the token's `iat` (unix s; default now), or null for a token without one. */
export async function deviceToken(user: string, opts: { secret?: string; expiresInS?: number; device?: string; alg?: string; issuedAt?: number | null } = {}): Promise<string> {
  const jwt = new SignJWT({ ...(opts.device ? { dev: opts.device } : {}) })
    .setProtectedHeader({ alg: opts.alg ?? "HS256" })
    .setSubject(user);
  if (opts.issuedAt !== null) jwt.setIssuedAt(opts.issuedAt);
  jwt.setExpirationTime(Math.floor(Date.now() / 1000) + (opts.expiresInS ?? 3600));
  return jwt.sign(new TextEncoder().encode(opts.secret ?? DEV_JWT_SECRET));
}

export class TestDevice {
  readonly frames: ServerFrame[] = [];
  readonly undecodable: unknown[] = [];
  /** When each entry (by message id) arrived, ms. */
  private readonly arrivals = new Map<string, number>();
  closed: { code: number; reason: string } | undefined;
  private constructor(readonly ws: WebSocket) {
    ws.on("message", (data: Buffer, isBinary: boolean) => {
      try {
        const f = decodeServerFrame(isBinary ? new Uint8Array(data) : data.toString());
        this.frames.push(f);
        if (f.t === "MSGS") for (const e of f.e) if (!this.arrivals.has(e.id)) this.arrivals.set(e.id, Date.now());
      } catch (err) {
        this.undecodable.push(err);
      }
    });
    ws.on("close", (code, reason) => (this.closed = { code, reason: reason.toString() }));
  }

  static async connect(port: number): Promise<TestDevice> {
    const ws = new WebSocket(`ws://127.0.0.1:${port}/v1/ws`);
    await new Promise<void>((resolve, reject) => {
      ws.once("open", () => resolve());
      ws.once("error", reject);
    });
    return new TestDevice(ws);
  }

  send(frame: ClientFrame): void {
    this.ws.send(encodeFrame(frame));
  }

  sendRaw(data: Uint8Array | string): void {
    this.ws.send(data, { binary: typeof data !== "string" });
  }

  async next<T extends ServerFrame["t"]>(t: T, timeoutMs = 10_000): Promise<Extract<ServerFrame, { t: T }>> {
    return waitFor(`a ${t} frame`, () => this.frames.find((f) => f.t === t) as Extract<ServerFrame, { t: T }> | undefined, { timeoutMs, intervalMs: 10 });
  }

  /** Entries of live and catch-up MSGS frames (not PULL replies), in arrival order. */
  entries(): Entry[] {
    return this.frames.flatMap((f) => (f.t === "MSGS" && f.id === undefined ? f.e : []));
  }

  arrivedAt(id: string): number | undefined {
    return this.arrivals.get(id);
  }

  /**
   * A marker for "nothing else happened": sends a PING and waits for its PONG, or for the
   * connection to close. The gateway answers PING inline, so every frame it sent before reading
   * the PING (and a close it sent before) is here by the time this returns; true when the PONG
   * came, false when the connection closed instead.
   */
  async roundTrip(timeoutMs = 10_000): Promise<boolean> {
    const id = this.nextPingId++;
    this.send({ t: "PING", id });
    const pong = (f: ServerFrame) => f.t === "PONG" && f.id === id;
    return waitFor(`the PONG of PING ${id} (or the connection closing)`, () => (this.frames.some(pong) ? true : this.closed !== undefined ? "closed" : undefined), {
      timeoutMs,
      intervalMs: 10,
    }).then((v) => v === true);
  }

  /** PING ids of roundTrip(), far from the small ids tests send themselves. */
  private nextPingId = 3_000_000_000;

  async waitClosed(timeoutMs = 10_000): Promise<{ code: number; reason: string }> {
    return waitFor("the connection to close", () => this.closed, { timeoutMs, intervalMs: 10 });
  }

  close(): void {
    this.ws.close();
  }
}
