/**
 * The fault suite's scenario runner: a whole stack (workers and gateways as real processes), SDK
 * devices that keep being disconnected, continuous dispatch load, and one fault in the middle.
 * Afterwards every device must have every acknowledged entry of its user, with no regression in
 * worker, gateway or SDK, and duplicates only where the scenario's epoch change allows them.
 */
import assert from "node:assert/strict";
import WebSocket from "ws";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { jetstream } from "@nats-io/jetstream";
import { decodeStoredEntry, shardStream, type Entry } from "../../protocol/index.js";
import { Dispatcher, RegistryClient } from "../../protocol/io/index.js";
import { JetgateClient, MemoryCursorStore, type WebSocketFactory } from "../../client/index.js";
import { initStack, spawnGateway, spawnWorker, freePortForTest, startInfra, type Infra, type JetgateProcess, type Placement } from "./stack.js";
import { deviceToken } from "./device.js";
import { sleep, waitFor } from "./wait.js";

export interface Device {
  user: string;
  name: string;
  store: MemoryCursorStore;
  client: JetgateClient;
  /** What the app kept: entries in the order applied, each message id once. */
  applied: Entry[];
  ids: Set<string>;
  /** Entries an SDK instance delivered that an earlier instance (before an app restart) had applied. */
  appDuplicates: number;
  /** Duplicates dropped, and regressions counted, by SDK instances that are gone. */
  pastSdkDuplicates: number;
  pastSdkRegressions: number;
}

/** A process on a host of its own (test/harness/netns.ts): how to start it there, and its env there. */
export interface HostPlacement extends Placement {
  /** Overrides of the run's env on that host: NATS and Redis at the host's links' addresses. */
  env: Record<string, string>;
}

/** What a scenario's fault can reach. */
export class FaultRun {
  readonly workers: JetgateProcess[] = [];
  readonly gateways: JetgateProcess[] = [];
  readonly devices: Device[] = [];
  readonly sent = new Map<string, string[]>();
  /** Dispatches whose result was an error: the backend was told, so they are not owed. */
  failed = 0;
  nc!: NatsConnection;
  registry!: RegistryClient;
  dispatcher!: Dispatcher;
  gatewayPorts: number[] = [];
  /** Gateways (by port) and workers (by index) that run on hosts of their own. */
  readonly gatewayPlaces = new Map<number, HostPlacement>();
  workerPlaces: (HostPlacement | undefined)[] = [];
  private n = 0;
  private paused: Promise<void> | undefined;
  private unpause: (() => void) | undefined;

  constructor(
    /** Environment of jetgate processes; a scenario may change it (failover) and restart them. */
    public env: Record<string, string>,
    readonly users: string[],
  ) {}

  get shardCount(): number {
    return [...this.registry.state.shards.values()].filter((s) => s.status === "active").length;
  }

  async connectControl(): Promise<void> {
    this.nc = await connect({ servers: this.env.JETGATE_NATS_URL!.split(",") , maxReconnectAttempts: -1, reconnectTimeWait: 250 });
    this.registry = await RegistryClient.open(this.nc);
    this.dispatcher = new Dispatcher(this.nc, () => this.registry.shards, { lanes: ["default"], attempts: 40, ackTimeoutMs: 1000 });
  }

  async closeControl(): Promise<void> {
    this.dispatcher?.close();
    await this.registry?.close().catch(() => undefined);
    await this.nc?.close().catch(() => undefined);
  }

  async spawnWorker(place: HostPlacement | undefined = this.workerPlaces[this.workers.length]): Promise<JetgateProcess> {
    const w = await spawnWorker({ ...this.env, ...place?.env }, {}, [], place);
    this.workers.push(w);
    return w;
  }

  async spawnGateway(port: number): Promise<JetgateProcess> {
    const place = this.gatewayPlaces.get(port);
    const g = await spawnGateway({ ...this.env, ...place?.env }, { JETGATE_GATEWAY_PORT: String(port) }, [], place);
    this.gateways.push(g);
    return g;
  }

  /** The devices' URL of the gateway on `port`. */
  gatewayUrl(port: number): string {
    return `ws://${this.gatewayPlaces.get(port)?.host ?? "127.0.0.1"}:${port}/v1/ws`;
  }

  /**
   * Points every jetgate process and the control connection at a new environment (a failover's
   * NATS), restarting workers and gateways on the gateways' same ports.
   */
  async moveTo(env: Record<string, string>): Promise<void> {
    this.env = env;
    const workers = this.live(this.workers).length;
    for (const p of [...this.live(this.gateways), ...this.live(this.workers)]) await p.kill("SIGKILL");
    await this.closeControl();
    await this.connectControl();
    for (let i = 0; i < workers; i++) await this.spawnWorker();
    for (const port of this.gatewayPorts) await this.spawnGateway(port);
  }

  /** Waits until every shard is held, none by a live worker above its fair share. */
  async spread(): Promise<void> {
    await waitFor("every shard owned, spread over the workers", async () => {
      const workers = this.live(this.workers);
      const fair = Math.ceil(this.shardCount / Math.max(1, workers.length));
      let held = 0;
      for (const w of workers) {
        const mine = await w.metric("jetgate_worker_lease_held");
        if (mine > fair) return false;
        held += mine;
      }
      return held === this.shardCount;
    }, { timeoutMs: 20_000, intervalMs: 100 });
  }

  live(procs: JetgateProcess[]): JetgateProcess[] {
    return procs.filter((p) => p.proc.exitCode === null && p.proc.signalCode === null);
  }

  /** Holds the dispatch load (in-flight dispatches finish) until `resume`. */
  pauseLoad(): void {
    this.paused ??= new Promise((r) => (this.unpause = r));
  }

  resumeLoad(): void {
    this.unpause?.();
    this.paused = undefined;
  }

  /** One dispatch to one user; records the id when acknowledged. */
  async dispatch(user: string, id = `e${this.n++}`): Promise<boolean> {
    const [r] = await this.dispatcher.dispatch({ dispatch_id: id, message_id: id, lane: "default", recipients: [user], body: new Uint8Array(16) });
    if (r === undefined || "error" in r) {
      this.failed++;
      return false;
    }
    this.sent.set(user, [...(this.sent.get(user) ?? []), id]);
    return true;
  }

  /**
   * For a failure message: where each id is in the shard streams (every shard the user was ever
   * in), read with an ordered consumer; "nowhere" when no stream holds it.
   */
  async whereIs(user: string, ids: string[]): Promise<string> {
    const found = new Map<string, string>();
    const js = jetstream(this.nc);
    for (const shard of this.registry.state.shards.keys()) {
      try {
        // the whole stream (filter_subjects needs nats-server 2.10): test streams are small
        const c = await js.consumers.get(shardStream(shard));
        for (;;) {
          const m = await c.next({ expires: 1000 });
          if (m === null) break;
          const id = decodeStoredEntry(m.data).id;
          if (ids.includes(id)) found.set(id, `${m.subject} at MBX_${shard}#${m.seq}`);
          if (m.info.pending === 0) break;
        }
      } catch (err) {
        found.set(`(shard ${shard})`, `unreadable: ${(err as Error).message}`);
      }
    }
    return ids.map((id) => `${id} in ${found.get(id) ?? "nowhere"}`).concat([...found].filter(([k]) => k.startsWith("(")).map(([k, v]) => `${k} ${v}`)).join(", ");
  }

  /** Continuous load until `stop()`: `perTick` entries to random users every `everyMs`. */
  load(perTick: number, everyMs: number): { stop: () => Promise<void> } {
    let running = true;
    const loop = (async () => {
      while (running) {
        if (this.paused) await this.paused;
        const batch: Promise<boolean>[] = [];
        for (let i = 0; i < perTick; i++) batch.push(this.dispatch(this.users[Math.floor(Math.random() * this.users.length)]!).catch(() => false));
        await Promise.all(batch);
        await sleep(everyMs);
      }
    })();
    return {
      stop: async () => {
        running = false;
        this.resumeLoad();
        await loop;
      },
    };
  }

  /** Random device disconnects until stopped: the SDK reconnects with its cursor each time. */
  chaos(perTick: number, everyMs: number): { stop: () => Promise<void> } {
    let running = true;
    const loop = (async () => {
      while (running) {
        for (let i = 0; i < perTick; i++) this.devices[Math.floor(Math.random() * this.devices.length)]!.client.disconnect();
        await sleep(everyMs);
      }
    })();
    return {
      stop: async () => {
        running = false;
        await loop;
      },
    };
  }

  private newClient(d: Omit<Device, "client">): JetgateClient {
    // `d` is the device object itself: counts land on it
    const urls = this.gatewayPorts.map((p) => this.gatewayUrl(p));
    const instance = new Set<string>();
    return new JetgateClient({
      url: urls, device: d.name, token: () => deviceToken(d.user), store: d.store,
      onEntry: (e) => {
        assert.ok(!instance.has(e.id), `${d.user}/${d.name}: one SDK instance applied ${e.id} twice`);
        instance.add(e.id);
        // the app's own store dedups by message id across restarts (the last line: docs/design.md, "Nothing is lost")
        if (d.ids.has(e.id)) d.appDuplicates++;
        else {
          d.ids.add(e.id);
          d.applied.push(e);
        }
      },
      WebSocket: WebSocket as unknown as WebSocketFactory, backoff: { baseMs: 50, capMs: 400 }, connectTimeoutMs: 3000,
    });
  }

  /** The app is closed (offline); `reopen` starts it again from its stored cursor. */
  async closeApp(d: Device): Promise<void> {
    await d.client.close();
    d.pastSdkDuplicates += d.client.stats.duplicatesDropped;
    d.pastSdkRegressions += d.client.stats.mailboxSeqRegressionCount;
  }

  async reopen(d: Device): Promise<void> {
    d.client = this.newClient(d);
    await d.client.start();
  }

  async startDevices(devicesPerUser: number): Promise<void> {
    for (const user of this.users) {
      for (let i = 0; i < devicesPerUser; i++) {
        const d: Omit<Device, "client"> & { client?: JetgateClient } = {
          user, name: `d${i}`, store: new MemoryCursorStore(), applied: [], ids: new Set<string>(), appDuplicates: 0, pastSdkDuplicates: 0, pastSdkRegressions: 0,
        };
        d.client = this.newClient(d);
        this.devices.push(d as Device);
        await d.client.start();
      }
    }
    await waitFor("every device live", () => this.devices.every((d) => d.client.state.type === "live"), { timeoutMs: 30_000 });
  }
}

export interface ScenarioOptions {
  name: string;
  /** Environment pointing at the scenario's servers. */
  env: Record<string, string>;
  users?: number;
  devicesPerUser?: number;
  workers?: number;
  gateways?: number;
  /** "none" where no epoch changes: a device must never see an entry twice. */
  duplicates: "allowed" | "none";
  /** Before any process starts (copies on a second deployment, ...). */
  prepare?: (run: FaultRun) => Promise<void>;
  /** The fault. Returns when the operation is done (not when devices have recovered). */
  fault: (run: FaultRun) => Promise<void>;
  /** After every device has been checked, before the processes stop: the scenario's own assertions on them. */
  check?: (run: FaultRun) => Promise<void>;
  /** The user whose probe entry measures recovery (default: one on the highest shard, the one faults hit). */
  probeUser?: (run: FaultRun) => string;
  /** Gateways and workers (by index) that run on hosts of their own; the rest run here. */
  hosts?: { gateways?: (HostPlacement | undefined)[]; workers?: (HostPlacement | undefined)[] };
}

export interface ScenarioResult {
  name: string;
  dispatched: number;
  delivered: number;
  duplicates: number;
  regressions: number;
  failedDispatches: number;
  recoverMs: number;
  /** How long the fault itself took (kill, wait, restart): part of recoverMs. */
  faultMs: number;
  /** Epochs spent by the shards that existed at the start, from the load's start to the end. */
  epochChanges: number;
}

/**
 * Runs one scenario and asserts its promises. Recovery time: from the fault's start until an entry
 * dispatched after the fault returned has reached every device of its user.
 */
export async function runScenario(opts: ScenarioOptions): Promise<ScenarioResult> {
  const users = Array.from({ length: opts.users ?? 40 }, (_, i) => `fu${i}`);
  const run = new FaultRun({ JETGATE_LEASE_MS: "1000", JETGATE_RATE_USER_FRAMES_PER_S: "100000", JETGATE_SHARDS: "2", JETGATE_TAIL_CHECK_S: "5", ...opts.env }, users);
  let load: { stop: () => Promise<void> } | undefined;
  let chaos: { stop: () => Promise<void> } | undefined;
  try {
    await initStack(run.env);
    await opts.prepare?.(run);
    await run.connectControl();
    run.gatewayPorts = await Promise.all(Array.from({ length: opts.gateways ?? 2 }, () => freePortForTest()));
    run.gatewayPorts.forEach((port, i) => {
      const place = opts.hosts?.gateways?.[i];
      if (place !== undefined) run.gatewayPlaces.set(port, place);
    });
    run.workerPlaces = opts.hosts?.workers ?? [];
    for (let i = 0; i < (opts.workers ?? 2); i++) await run.spawnWorker();
    for (const p of run.gatewayPorts) await run.spawnGateway(p);
    // owned and spread: the first worker takes every shard while it is alone and releases the
    // surplus when the others join (they resume its epochs); that must happen before the load, or
    // the scenario's epoch count would include a crash's fence of a shard still moving
    await run.spread();
    await run.startDevices(opts.devicesPerUser ?? 2);

    const epochsAtStart = new Map([...run.registry.state.shards].map(([id, sh]) => [id, sh.epoch]));
    load = run.load(10, 40);
    chaos = run.chaos(3, 200);
    await sleep(1500);
    const t0 = Date.now();
    await opts.fault(run);
    const faultMs = Date.now() - t0;
    // the first entry dispatched after the fault, to a user with devices, marks recovery
    const probeUser = opts.probeUser?.(run) ?? users[0]!;
    const probeId = `probe-${t0}`;
    await waitFor("the probe entry acknowledged", () => run.dispatch(probeUser, probeId), { timeoutMs: 60_000, intervalMs: 200 });
    await waitFor("the probe entry on every device of its user", () =>
      run.devices.filter((d) => d.user === probeUser).every((d) => d.applied.some((e) => e.id === probeId)), { timeoutMs: 60_000, intervalMs: 50 });
    const recoverMs = Date.now() - t0;
    await sleep(1500);
    await load.stop();
    load = undefined;
    await chaos.stop();
    chaos = undefined;

    // on timeout the assertions below name what is missing
    await waitFor("every device has every entry of its user", () =>
      run.devices.every((d) => (run.sent.get(d.user) ?? []).every((id) => d.ids.has(id))), { timeoutMs: 60_000, intervalMs: 250 }).catch(() => undefined);
    await sleep(300);

    let delivered = 0;
    let duplicates = 0;
    let sdkRegressions = 0;
    for (const d of run.devices) {
      const want = new Set(run.sent.get(d.user) ?? []);
      const got = d.applied.map((e) => e.id);
      const missing = [...want].filter((id) => !d.ids.has(id));
      if (missing.length > 0) {
        const seqOf = (id: string) => run.devices.flatMap((x) => x.applied).find((e) => e.id === id)?.seq;
        const seqs = missing.map((id) => `${id}@${seqOf(id)?.toString(16)}`);
        const near = d.applied.map((e) => `${e.id}@${e.seq.toString(16)}`).join(" ");
        const where = await run.whereIs(d.user, missing.slice(0, 20)).catch((err: unknown) => `unknown: ${(err as Error).message}`);
        assert.fail(`${d.user}/${d.name}: ${missing.length} entries missing: ${seqs.join(" ")}; in the streams: ${where}; applied: ${near}; stats ${JSON.stringify(d.client.stats)} state ${JSON.stringify(d.client.state)}`);
      }
      for (let i = 1; i < d.applied.length; i++) {
        const [a, b] = [d.applied[i - 1]!, d.applied[i]!];
        assert.ok(b.seq > a.seq, `${d.user}/${d.name}: seqs increase, but ${a.id}@${a.seq.toString(16)} came before ${b.id}@${b.seq.toString(16)}; stats ${JSON.stringify(d.client.stats)}`);
      }
      delivered += got.filter((id) => want.has(id)).length;
      duplicates += d.client.stats.duplicatesDropped + d.pastSdkDuplicates + d.appDuplicates;
      sdkRegressions += d.client.stats.mailboxSeqRegressionCount + d.pastSdkRegressions;
    }
    let regressions = sdkRegressions;
    for (const p of [...run.live(run.workers), ...run.live(run.gateways)]) regressions += await p.metric("jetgate_mailbox_seq_regression_total");
    const dispatched = [...run.sent.values()].reduce((n, ids) => n + ids.length, 0);
    let epochChanges = 0;
    for (const [id, e] of epochsAtStart) epochChanges += (run.registry.state.shards.get(id)?.epoch ?? e) - e;
    const result: ScenarioResult = { name: opts.name, dispatched, delivered, duplicates, regressions, failedDispatches: run.failed, recoverMs, faultMs, epochChanges };
    console.log(
      `fault ${opts.name.padEnd(28)} dispatched ${dispatched} delivered ${delivered} (to ${run.devices.length} devices) duplicates ${duplicates} ` +
        `regressions ${regressions} failed-dispatches ${run.failed} epoch-changes ${epochChanges} recover ${recoverMs} ms (the fault itself ${faultMs} ms)`,
    );
    assert.equal(regressions, 0, "mailbox_seq regressions (worker + gateway + SDK)");
    if (opts.duplicates === "none") assert.equal(duplicates, 0, "no epoch changed: no device may get an entry twice");
    await opts.check?.(run);
    return result;
  } catch (err) {
    // what the processes logged (warn and up) is often the only clue to a failure seen once in CI
    for (const p of [...run.workers, ...run.gateways]) console.log(`--- ${p.name} (pid ${p.pid}), last lines:\n${p.output.slice(-40).join("\n")}`);
    throw err;
  } finally {
    await load?.stop();
    await chaos?.stop();
    for (const d of run.devices) await d.client.close();
    await run.closeControl();
    for (const p of [...run.gateways, ...run.workers]) await p.kill();
  }
}

/** A scenario on its own nats-server and redis-server, disposed afterwards. */
export async function scenarioOnInfra(build: (infra: Infra) => ScenarioOptions, servers: Parameters<typeof startInfra>[1] = {}): Promise<ScenarioResult> {
  const infra = await startInfra({}, servers);
  try {
    return await runScenario(build(infra));
  } finally {
    await infra.dispose();
  }
}
