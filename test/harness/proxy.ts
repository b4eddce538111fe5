/**
 * A TCP proxy between one process and a server, to cut that process alone off: `pass` forwards,
 * `blackhole` keeps every connection open and forwards nothing either way (a partition, or a server
 * that stopped answering: the client sees no error, only silence), `refuse` closes what is open and
 * every new connection at once (a server that is gone).
 */
import { createServer, connect, type Server, type Socket } from "node:net";
import type { AddressInfo } from "node:net";

export type ProxyMode = "pass" | "blackhole" | "refuse";

export class TcpProxy {
  mode: ProxyMode = "pass";
  private readonly pairs = new Set<[Socket, Socket]>();

  private constructor(
    private readonly server: Server,
    readonly port: number,
  ) {}

  static async start(targetPort: number, targetHost = "127.0.0.1"): Promise<TcpProxy> {
    const server = createServer();
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const proxy = new TcpProxy(server, (server.address() as AddressInfo).port);
    server.on("connection", (client) => proxy.accept(client, targetPort, targetHost));
    return proxy;
  }

  private accept(client: Socket, port: number, host: string): void {
    if (this.mode === "refuse") return void client.destroy();
    const upstream = connect(port, host);
    const pair: [Socket, Socket] = [client, upstream];
    this.pairs.add(pair);
    const end = () => {
      this.pairs.delete(pair);
      client.destroy();
      upstream.destroy();
    };
    for (const s of pair) {
      s.on("error", end);
      s.on("close", end);
    }
    // data is dropped, not buffered, while the proxy is a black hole
    client.on("data", (d) => void (this.mode === "pass" && upstream.write(d)));
    upstream.on("data", (d) => void (this.mode === "pass" && client.write(d)));
  }

  /** Forwards nothing from now on, keeping the connections open. */
  blackhole(): void {
    this.mode = "blackhole";
  }

  /** Closes every connection, and each new one at once. */
  refuse(): void {
    this.mode = "refuse";
    for (const [a, b] of this.pairs) {
      a.destroy();
      b.destroy();
    }
    this.pairs.clear();
  }

  /**
   * Forwards again. Connections that were black-holed lost bytes in both directions, so their
   * streams are broken: they are closed, and the client reconnects.
   */
  heal(): void {
    const broken = this.mode === "blackhole";
    this.mode = "pass";
    if (!broken) return;
    for (const [a, b] of this.pairs) {
      a.destroy();
      b.destroy();
    }
    this.pairs.clear();
  }

  async close(): Promise<void> {
    this.refuse();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}
