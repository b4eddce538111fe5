/**
 * A scenario's world: a real stack (nats-server, Redis, a worker and gateways, started as the
 * tests start them), one device run by the client under test, and what the kit dispatched. The
 * operator's moves go through the `jetgate` CLI and the server API, as an operator makes them.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import { jetstreamManager } from "@nats-io/jetstream";
import { RedisKeys, halfRange, shardStream, userHash } from "../protocol/index.js";
import { loadConfig } from "../protocol/io/index.js";

type HashRange = { lo: number; hi: number };
import { redisClient, startStack, spawnGateway, type JetgateProcess, type Stack } from "../test/harness/stack.js";
import { deviceToken } from "../test/harness/device.js";
import { runCli } from "../test/harness/cli.js";
import { ClientProcess, DeviceLog } from "./client-process.js";
import { FrameProxy } from "./frame-proxy.js";
import type { Dispatched } from "./checks.js";

export const SERVICE_TOKEN = "conformance-kit-service-token";

export interface KitOptions {
  /** The client under test: a command run by `sh -c`. */
  client: string;
  /** Environment for the client's processes. */
  clientEnv?: Record<string, string>;
  /** Gateway settings for this scenario. */
  gateway?: Record<string, string>;
  /** How many gateways (GOAWAY needs a second to move to). */
  gateways?: number;
  /** The device reaches the first gateway through a relay that can lose a frame (frame-proxy.ts). */
  proxy?: boolean;
}

export class Kit {
  readonly dispatched: Dispatched[] = [];
  /** Ids the server declared gone (a retention that passed the device's cursor). */
  readonly gone = new Set<string>();
  readonly log = new DeviceLog();
  /** What the scenario reports besides pass or fail (the soak's counts). */
  readonly notes: string[] = [];
  readonly device = "dev-1";
  private life: ClientProcess | undefined;
  private readonly dir = mkdtempSync(join(tmpdir(), "jetgate-conformance-"));
  private seqNo = 0;
  proxy: FrameProxy | undefined;
  /** The token each `token` event gets; a scenario may change it (a short-lived one, a refused one). */
  tokenFor: () => Promise<string> = () => deviceToken(this.user, { device: this.device });

  private constructor(
    readonly stack: Stack,
    readonly gateways: JetgateProcess[],
    readonly user: string,
    private readonly opts: KitOptions,
  ) {}

  static async start(opts: KitOptions, user: (k: { shardOf: (u: string) => number; rangeOf: (shard: number) => HashRange }) => string): Promise<Kit> {
    // a drain of 1 s and leases of 1 s: a drained or rolled gateway's devices move on, and a
    // worker takes a shard again after a takeover, as they would with the defaults, sooner
    const stack = await startStack({ env: { JETGATE_SERVICE_TOKEN: SERVICE_TOKEN, JETGATE_HEARTBEAT_MS: "2000", JETGATE_DRAIN_MS: "1000", JETGATE_LEASE_MS: "1000" }, gateway: opts.gateway ?? {} });
    const gateways = [stack.gateway!];
    for (let i = 1; i < (opts.gateways ?? 1); i++) gateways.push(await spawnGateway(stack.infra.env, opts.gateway ?? {}));
    const view = { shardOf: (u: string) => stack.registry.shards.shardOf(u) ?? -1, rangeOf: (s: number) => stack.registry.state.shards.get(s)!.range };
    const kit = new Kit(stack, gateways, user(view), opts);
    if (opts.proxy === true) kit.proxy = await FrameProxy.start(kit.gatewayUrls[0]!);
    return kit;
  }

  private get gatewayUrls(): string[] {
    return this.gateways.map((g) => `ws://127.0.0.1:${g.httpPort}/v1/ws`);
  }

  /** Where the device connects: the gateways, or the relay in front of the first. */
  get urls(): string[] {
    return this.proxy !== undefined ? [this.proxy.url] : this.gatewayUrls;
  }

  get shard(): number {
    const s = this.stack.registry.shards.shardOf(this.user);
    if (s === undefined) throw new Error(`no shard owns user ${this.user}`);
    return s;
  }

  /** Starts a life of the device with the cursor store it always uses. */
  async startClient(): Promise<ClientProcess> {
    if (this.life !== undefined) throw new Error("a life of the device is running");
    this.life = await ClientProcess.start(this.opts.client, this.log, {
      urls: this.urls,
      device: this.device,
      store: join(this.dir, "cursor"),
      token: () => this.tokenFor(),
      ...(this.opts.clientEnv ? { env: this.opts.clientEnv } : {}),
    });
    return this.life;
  }

  get client(): ClientProcess {
    if (this.life === undefined) throw new Error("no life of the device is running");
    return this.life;
  }

  async stopClient(): Promise<void> {
    await this.life?.stop();
    this.life = undefined;
  }

  async crashClient(): Promise<void> {
    await this.life?.kill();
    this.life = undefined;
  }

  note(text: string): void {
    this.notes.push(text);
  }

  /** Dispatches `n` entries to the device's user (one message id each), as a backend does. */
  async dispatch(n: number, opts: { bodyBytes?: number; id?: string } = {}): Promise<Dispatched[]> {
    const out: Dispatched[] = [];
    for (let i = 0; i < n; i++) {
      const id = opts.id ?? `m${++this.seqNo}`;
      const [r] = await this.stack.dispatcher.dispatch({ dispatch_id: `d-${id}-${randomBytes(3).toString("hex")}`, message_id: id, lane: "default", recipients: [this.user], body: randomBytes(opts.bodyBytes ?? 16) });
      if (r === undefined || !("seq" in r)) throw new Error(`dispatch of ${id} failed: ${JSON.stringify(r)}`);
      // a backend's retry of the same message id is one entry for the device
      if (!this.dispatched.some((d) => d.id === id)) out.push({ id, shard: r.shard, seq: r.seq });
    }
    this.dispatched.push(...out);
    return out;
  }

  /** Resolves once every dispatched entry not declared gone has an `entry` event (in any life). */
  async allApplied(timeoutMs = 30_000): Promise<void> {
    await this.log.until("every dispatched entry applied", () => {
      const seen = new Set(this.log.of("entry").map((e) => String(e.id)));
      return this.dispatched.every((d) => seen.has(d.id) || this.gone.has(d.id));
    }, timeoutMs);
  }

  async live(timeoutMs = 20_000): Promise<void> {
    const life = this.client.life;
    await this.log.until(`the device live (life ${life})`, () => this.log.events.some((e) => e.life === life && e.ev === "state" && e.state === "live"), timeoutMs);
  }

  /** The operator CLI against this stack; throws on a non-zero exit. */
  async cli(...args: string[]): Promise<string> {
    const r = await runCli(this.stack.infra.env, args);
    if (r.code !== 0) throw new Error(`jetgate ${args.join(" ")} exited ${r.code}: ${r.text}`);
    await this.stack.registry.sync();
    return r.text;
  }

  /** The server API of the first gateway. */
  async serverApi(method: string, path: string, body?: unknown): Promise<Response> {
    return fetch(`http://127.0.0.1:${this.gateways[0]!.httpPort}${path}`, {
      method,
      headers: { authorization: `Bearer ${SERVICE_TOKEN}`, ...(body !== undefined ? { "content-type": "application/json" } : {}) },
      ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
    });
  }

  /** The device's last cumulative ACK as the gateway stored it (0 before any). */
  async ackedSeq(): Promise<bigint> {
    const redis = await redisClient(this.stack.infra.redis.url);
    try {
      const v = await redis.get(new RedisKeys(loadConfig(this.stack.infra.env).JETGATE_REDIS_PREFIX).deviceAck(this.user, this.device));
      return v === null ? 0n : BigInt(v);
    } finally {
      redis.disconnect();
    }
  }

  /** Drops all but the newest `keep` entries of the user's shard stream, as retention would. */
  async trim(keep: number): Promise<void> {
    const jsm = await jetstreamManager(this.stack.nc);
    await jsm.streams.purge(shardStream(this.shard), { keep });
  }

  /** Replaces gateway `i` by one with `extra` settings on the same port (what a rollout does). */
  async restartGateway(i: number, extra: Record<string, string>): Promise<void> {
    const old = this.gateways[i]!;
    await old.kill("SIGTERM");
    this.gateways[i] = await spawnGateway(this.stack.infra.env, { ...this.opts.gateway, ...extra, JETGATE_GATEWAY_PORT: String(old.httpPort) });
    if (i === 0) this.stack.gateway = this.gateways[0];
  }

  async dispose(): Promise<void> {
    await this.life?.kill();
    await this.proxy?.close();
    await Promise.all(this.gateways.slice(1).map((g) => g.kill()));
    await this.stack.dispose();
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** A user of shard `shard` (the first of u0, u1, ...). */
export function userOn(shard: number): (k: { shardOf: (u: string) => number }) => string {
  return (k) => {
    for (let i = 0; ; i++) if (k.shardOf(`u${i}`) === shard) return `u${i}`;
  };
}

/** A user of `shard` whom two splits of the upper half both move (its hash in the top quarter of the range). */
export function userMovedTwice(shard: number): (k: { rangeOf: (s: number) => HashRange }) => string {
  return (k) => {
    const upper = halfRange(halfRange(k.rangeOf(shard), true), true);
    for (let i = 0; ; i++) {
      const h = userHash(`u${i}`);
      if (h >= upper.lo && h <= upper.hi) return `u${i}`;
    }
  };
}
