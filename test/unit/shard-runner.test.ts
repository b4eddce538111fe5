// ShardRunner with its four ports in memory (worker/shard-ports.ts): takeover, holes, fencing around
// the Redis step, a split's forwards, release and resume, without NATS or Redis. The same code runs
// against the real ones in test/integration/worker.test.ts, takeover.test.ts and worker-stall.test.ts.
import { test } from "node:test";
import assert from "node:assert/strict";
import { pino } from "pino";
import {
  EMPTY_REGISTRY,
  ShardMap,
  applyRecord,
  bumpEpoch,
  composeSeq,
  encodeStoredEntry,
  entrySubject,
  halfRange,
  initialShards,
  isWorkerConsumer,
  floorRecordEpochs,
  processingFloor,
  registryRecord,
  seqKey,
  splitShard,
  userHash,
  workerConsumerName,
  type Push,
  type RegistryRecord,
  type RegistryState,
  type ShardState,
  type FloorRecord,
} from "../../protocol/index.js";
import type { ApplyEntryResult, BatchEntry, BatchShared } from "../../worker/mailbox-script.js";
import { WorkerMetrics } from "../../worker/metrics.js";
import { ManualClock } from "../harness/manual-clock.js";
import type { DeliveredMsg, Deliveries, LogMsg, MailboxStore, PushSink, RegistryView, ShardLog } from "../../worker/shard-ports.js";
import type { RunnerConfig } from "../../worker/shard-ports.js";
import { ShardRunner } from "../../worker/shard-runner.js";
import { writeRelease } from "../../worker/release.js";

const SHARD = 0;
const LOG = "logA";

// ---- the ports, in memory ----------------------------------------------------------------------

/** The registry: records this process applied (`write`), and records only on the server until a sync (`writeRemote`). */
class MemRegistry implements RegistryView {
  state: RegistryState;
  syncs = 0;
  /** Set: update() never answers (NATS away). */
  silent = false;
  /** Set: sync() answers once it resolves (a slow read of the head). */
  syncGate: Promise<void> | undefined;
  private readonly remote: RegistryRecord[] = [];
  private readonly listeners = new Set<(s: RegistryState) => void>();

  constructor(shards: ShardState[]) {
    this.state = applyRecord(EMPTY_REGISTRY, 1, registryRecord("init", "test", shards));
  }

  get shards(): ShardMap {
    return new ShardMap(this.state);
  }

  shard(id = SHARD): ShardState {
    return this.state.shards.get(id)!;
  }

  /** A record this process has applied (its follower got it). */
  write(record: RegistryRecord): void {
    this.state = applyRecord(this.state, this.state.seq + 1, record);
    for (const l of this.listeners) l(this.state);
  }

  /** A record on the server that this process sees at its next sync (or write conflict). */
  writeRemote(record: RegistryRecord): void {
    this.remote.push(record);
  }

  async sync(): Promise<void> {
    this.syncs++;
    await (this.syncGate ?? Promise.resolve());
    this.catchUp();
  }

  private catchUp(): void {
    for (let r = this.remote.shift(); r !== undefined; r = this.remote.shift()) this.write(r);
  }

  onChange(listener: (s: RegistryState) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  async update(mutate: (s: RegistryState) => RegistryRecord | null): Promise<{ state: RegistryState } | null> {
    if (this.silent) return new Promise(() => undefined);
    for (;;) {
      const record = mutate(this.state);
      if (record === null) return null;
      await Promise.resolve();
      // a write conflict: apply what the server has, ask again
      if (this.remote.length > 0) {
        this.catchUp();
        continue;
      }
      this.write(record);
      return { state: this.state };
    }
  }
}

/** Deliveries the test pushes by hand. Like a NATS consumer, a stopped one still yields what it holds. */
class Feed implements Deliveries {
  private readonly items: DeliveredMsg[] = [];
  private waiter: ((r: IteratorResult<DeliveredMsg>) => void) | undefined;
  stopped = false;

  push(m: DeliveredMsg): void {
    const w = this.waiter;
    this.waiter = undefined;
    if (w !== undefined) w({ value: m, done: false });
    else this.items.push(m);
  }

  stop(): void {
    this.stopped = true;
    this.waiter?.({ value: undefined, done: true });
    this.waiter = undefined;
  }

  [Symbol.asyncIterator](): AsyncIterator<DeliveredMsg> {
    return {
      next: () => {
        const m = this.items.shift();
        if (m !== undefined) return Promise.resolve({ value: m, done: false });
        if (this.stopped) return Promise.resolve({ value: undefined, done: true });
        return new Promise((r) => (this.waiter = r));
      },
    };
  }
}

/** The shard stream: stored messages by offset, worker consumers with their ack floors, one feed. */
class MemLog implements ShardLog {
  readonly stored = new Map<number, LogMsg>();
  readonly consumers = new Map<string, { start: number; floor: number }>();
  readonly acks: number[] = [];
  readonly reads: number[] = [];
  readonly forwarded: { subject: string; msgId: string | undefined }[] = [];
  readonly calls: string[] = [];
  first = 1;
  last = 0;
  feed: Feed | undefined;

  constructor(public log = LOG) {}

  /** Appends an entry of `user` (dispatch and message id `id`); returns its offset. */
  append(user: string, id: string, lane = "default"): number {
    const seq = ++this.last;
    const data = encodeStoredEntry({ id, d: id, ts: Date.now(), b: new Uint8Array([seq]) });
    const msgId = `${id}:${user}`;
    this.stored.set(seq, { subject: entrySubject(SHARD, user, lane), seq, data, headers: { get: (k) => (k === "Nats-Msg-Id" ? msgId : "") } });
    return seq;
  }

  /** The consumer delivers these offsets, in this order. */
  deliver(...offsets: number[]): void {
    const feed = this.feed!;
    const c = this.consumers.get(this.consuming!)!;
    for (const o of offsets) {
      feed.push({ ...this.stored.get(o)!, ack: () => {
        this.acks.push(o);
        c.floor = Math.max(c.floor, o);
      } });
    }
  }

  private consuming: string | undefined;

  async logId(): Promise<string | undefined> {
    return this.log;
  }

  /** The floor records by epoch, as JETGATE_FLOORS keeps the last of each. */
  readonly floors = new Map<number, number>();

  /** As readAckFloor: the record of an epoch newer than every consumer listed stands for its consumer. */
  async ackFloor(epoch: number): Promise<{ floor: number; consumers: string[] }> {
    const names = [...this.consumers.keys()].filter(isWorkerConsumer);
    let record: FloorRecord | undefined;
    for (const e of floorRecordEpochs(names, epoch)) {
      const offset = this.floors.get(e);
      if (offset !== undefined) {
        record = { epoch: e, offset };
        break;
      }
    }
    return { floor: processingFloor(names.map((name) => ({ name, ack_floor: { stream_seq: this.consumers.get(name)!.floor } })), record), consumers: names };
  }

  async recordFloor(epoch: number, offset: number): Promise<void> {
    this.calls.push(`record ${workerConsumerName(epoch)}@${offset}`);
    this.floors.set(epoch, offset);
  }

  /** The consumer lost with its NATS node (R1): gone, with its ack floor. */
  lose(epoch: number): void {
    this.consumers.delete(workerConsumerName(epoch));
    this.feed?.stop();
  }

  async openConsumer(epoch: number, startOffset: number): Promise<void> {
    const name = workerConsumerName(epoch);
    this.calls.push(`open ${name}@${startOffset}`);
    if (this.consumers.has(name)) throw new Error(`consumer ${name} exists`);
    this.consumers.set(name, { start: startOffset, floor: startOffset - 1 });
  }

  async deleteConsumer(name: string): Promise<void> {
    this.calls.push(`delete ${name}`);
    if (!this.consumers.delete(name)) throw new Error(`no consumer ${name}`);
  }

  async consume(epoch: number): Promise<Deliveries> {
    const name = workerConsumerName(epoch);
    if (!this.consumers.has(name)) throw new Error(`no consumer ${name}`);
    this.consuming = name;
    return (this.feed = new Feed());
  }

  async firstOffset(): Promise<number> {
    return this.first;
  }

  async read(offset: number): Promise<LogMsg | null> {
    this.reads.push(offset);
    return this.stored.get(offset) ?? null;
  }

  async forward(subject: string, _data: Uint8Array, msgId: string | undefined): Promise<void> {
    this.forwarded.push({ subject, msgId });
  }

  async progress(epoch: number): Promise<{ pending: number; delivered: number }> {
    const c = this.consumers.get(workerConsumerName(epoch))!;
    return { pending: this.last - c.floor, delivered: c.floor };
  }
}

/** Redis: dedup by `dispatch:user` and offset, lane and user watermarks; every user routed to gateway g1. */
class MemStore implements MailboxStore {
  readonly applied: BatchEntry[][] = [];
  attempts = 0;
  /** While true every call fails, as a Redis that is away. */
  down = false;
  /** Runs inside each call, before it answers (after the failure when down). */
  during: ((attempt: number) => void) | undefined;
  private readonly dedup = new Map<string, string>();
  private readonly marks = new Map<string, bigint>();

  async apply(shared: BatchShared, entries: readonly BatchEntry[]): Promise<ApplyEntryResult[]> {
    const attempt = ++this.attempts;
    await Promise.resolve();
    this.during?.(attempt);
    if (this.down) throw new Error("connect ECONNREFUSED 127.0.0.1:6379");
    this.applied.push([...entries]);
    return entries.map((e) => {
      const at = `${shared.log}:${e.offset}`;
      const key = `${e.dispatch}:${e.user}`;
      const first = (this.dedup.get(key) ?? at) === at;
      this.dedup.set(key, this.dedup.get(key) ?? at);
      const prev = this.mark(`${e.user}/${e.lane}`, e.seq);
      const prevAll = this.mark(e.user, e.seq);
      return { first, prev, prevAll, routes: ["g1"] };
    });
  }

  private mark(key: string, seq: bigint): string | null {
    const prev = this.marks.get(key);
    if (prev === undefined || seq > prev) this.marks.set(key, seq);
    return prev === undefined ? null : seqKey(prev);
  }
}

/** The pushes: queued by route, sent by flush. */
class MemPushes implements PushSink {
  readonly sent: Push[] = [];
  private queued: Push[] = [];

  route(push: Push): void {
    this.queued.push(push);
  }

  flush(): void {
    this.sent.push(...this.queued);
    this.queued = [];
  }
}

// ---- a runner over them -------------------------------------------------------------------------

const CONFIG: RunnerConfig = {
  JETGATE_WORKER_BATCH: 100,
  JETGATE_WORKER_ACK_WAIT_S: 60,
  JETGATE_HOT_CACHE_MAXLEN: 1000,
  JETGATE_HOT_CACHE_TTL_S: 86_400,
  JETGATE_DEDUP_TTL_S: 0,
  JETGATE_STREAM_MAX_AGE_S: 604_800,
  JETGATE_STREAM_REPLICAS: 1,
  JETGATE_FAULT_EXIT_AFTER: "",
};

interface Rig {
  registry: MemRegistry;
  log: MemLog;
  store: MemStore;
  pushes: MemPushes;
  metrics: WorkerMetrics;
  runner: ShardRunner;
}

/**
 * The runners' clock unless a test brings its own: `until` steps it, so a Redis retry's backoff or
 * the guard's freshness passes by steps, never by waiting.
 */
const shared = new ManualClock();

/**
 * `batch`: JETGATE_WORKER_BATCH; 1 makes every batch one delivery, whatever the timing. `clock`: the
 * runner's (default: `shared`, which `until` steps).
 */
function rig(opts: { registry?: MemRegistry; log?: MemLog; worker?: string; batch?: number; clock?: ManualClock } = {}): Rig {
  const registry = opts.registry ?? new MemRegistry(initialShards(1, [LOG]));
  const log = opts.log ?? new MemLog();
  const store = new MemStore();
  const pushes = new MemPushes();
  const metrics = new WorkerMetrics();
  const runner = new ShardRunner(SHARD, {
    shardLog: log, mailboxes: store, pushes, registry, metrics, log: pino({ level: "silent" }), workerId: opts.worker ?? "w1", config: { ...CONFIG, JETGATE_WORKER_BATCH: opts.batch ?? CONFIG.JETGATE_WORKER_BATCH }, clock: opts.clock ?? shared,
  });
  return { registry, log, store, pushes, metrics, runner };
}

/**
 * Until `probe` gives a value: a turn of the event loop, then 5 ms of the shared clock, at most
 * `steps` times (3 s of the runner's time by default). Never the wall clock.
 */
async function until<T>(what: string, probe: () => T | undefined | false, steps = 600): Promise<T> {
  for (let i = 0; ; i++) {
    const v = probe();
    if (v !== undefined && v !== false) return v;
    if (i >= steps) throw new Error(`still waiting for ${what} after ${steps} steps`);
    await new Promise((r) => setImmediate(r));
    shared.advance(5);
  }
}

/** Awaits `p` while stepping the shared clock (a stop waits for a retry's backoff to end). */
async function stepping<T>(what: string, p: Promise<T>): Promise<T> {
  let done = false;
  void p.then(() => (done = true), () => (done = true));
  await until(what, () => done);
  return p;
}

const offsetsOf = (pushes: Push[]) => pushes.map((p) => p.entry.seq & ((1n << 48n) - 1n)).map(Number);
const counter = async (m: WorkerMetrics, name: string, labels: Record<string, string> = { shard: String(SHARD) }) => {
  const metric = (await m.registry.getMetricsAsJSON()).find((x) => x.name === name)!;
  const v = metric.values.find((x) => Object.entries(labels).every(([k, want]) => String(x.labels[k]) === want));
  return v?.value ?? 0;
};
/** An operator's `jetgate shard takeover`: a new, unclaimed epoch that fences the owner. */
const operatorBump = (s: ShardState, from: number) => registryRecord("takeover", "op", [bumpEpoch(s, { cause: "takeover", start_offset: from, owner: null })]);

// ---- takeover -----------------------------------------------------------------------------------

test("shard runner - takeover: claim, bump or resume, as planTakeover says, and the consumer made after the record", async (t) => {
  const cases: {
    name: string;
    shard: (s: ShardState) => ShardState;
    consumers: [string, number][];
    want: { mode: string; epoch: number; start: number; calls: string[]; owner: string };
  }[] = [
    {
      name: "an unclaimed epoch (init) is claimed: no epoch spent, from the boundary's start",
      shard: (s) => s,
      consumers: [],
      want: { mode: "claim", epoch: 0, start: 1, calls: ["record w_0@0", "open w_0@1"], owner: "w1" },
    },
    {
      name: "a claimed epoch is bumped from the ack floor; the older consumer goes",
      shard: (s) => ({ ...s, owner: "w0" }),
      consumers: [["w_0", 7]],
      want: { mode: "bump", epoch: 1, start: 8, calls: ["record w_1@7", "open w_1@8", "delete w_0"], owner: "w1" },
    },
    {
      name: "a released epoch is resumed after the released offset; its consumer made again",
      shard: (s) => ({ ...s, owner: null, released_offset: 5 }),
      consumers: [["w_0", 4]],
      want: { mode: "resume", epoch: 0, start: 6, calls: ["delete w_0", "record w_0@5", "open w_0@6"], owner: "w1" },
    },
  ];
  for (const c of cases) {
    await t.test(c.name, async () => {
      const [s0] = initialShards(1, [LOG]) as [ShardState];
      const log = new MemLog();
      for (let i = 0; i < 10; i++) log.append("ann", `m${i}`);
      for (const [name, floor] of c.consumers) log.consumers.set(name, { start: 1, floor });
      const r = rig({ registry: new MemRegistry([c.shard(s0)]), log });
      await r.runner.start();
      assert.deepEqual(r.runner.state, { type: "running", epoch: c.want.epoch });
      assert.deepEqual(r.log.calls, c.want.calls);
      assert.equal(r.runner.offset, c.want.start - 1, "everything below the start counts as done");
      assert.equal(r.registry.shard().owner, c.want.owner);
      assert.equal(r.registry.shard().epoch, c.want.epoch);
      assert.equal(await counter(r.metrics, "jetgate_worker_takeovers_total", { shard: "0", mode: c.want.mode }), 1);
      r.log.deliver(c.want.start);
      await until("the first entry pushed", () => r.pushes.sent.length === 1);
      assert.equal(r.pushes.sent[0]!.entry.seq, composeSeq(c.want.epoch, c.want.start));
      await r.runner.stop("test over");
    });
  }
});

test("shard runner - a consumer lost with its NATS node: the next takeover starts from the epoch's floor record, at most a second behind", async () => {
  const a = rig();
  for (let i = 1; i <= 6; i++) a.log.append(`u${i}`, `m${i}`);
  await a.runner.start();
  assert.deepEqual(a.log.floors, new Map([[0, 0]]), "recorded at the takeover, before the consumer");
  a.log.deliver(1, 2);
  await until("offset 2 done", () => a.runner.offset === 2);
  assert.equal(a.log.floors.get(0), 0, "not again within a second");
  shared.advance(1000);
  a.log.deliver(3);
  await until("offset 3 recorded", () => a.log.floors.get(0) === 3);
  a.log.deliver(4);
  await until("offset 4 done", () => a.runner.offset === 4);
  assert.equal(a.log.floors.get(0), 3, "offset 4 within the second: not recorded");
  a.log.lose(0);
  await until("the runner stopped with its consumer", () => a.runner.state.type === "stopped");

  const b = rig({ registry: a.registry, log: a.log, worker: "w2" });
  a.log.calls.length = 0;
  await b.runner.start();
  assert.deepEqual(b.runner.state, { type: "running", epoch: 1 }, "a bump: the lost consumer's worker is fenced");
  assert.deepEqual(b.log.calls, ["record w_1@3", "open w_1@4"], "from the record, not from the boundary's start (offset 1)");
  b.log.deliver(4, 5, 6);
  await until("offset 6 done", () => b.runner.offset === 6);
  assert.deepEqual(offsetsOf(b.pushes.sent), [4, 5, 6], "only what followed the record again");
  await b.runner.stop("test over");
});

test("shard runner - takeover refused: the runner stops, nothing is consumed", async (t) => {
  const cases: { name: string; setup: (r: Rig) => void; reason: RegExp }[] = [
    { name: "the stream is another log than the registry's", setup: (r) => (r.log.log = "logB"), reason: /stream MBX_0 is not log logA of the registry/ },
    { name: "the shard is not active", setup: (r) => r.registry.write(registryRecord("split", "op", [{ ...r.registry.shard(), status: "retired" }])), reason: /not active/ },
    {
      name: "another worker claimed it first (the write conflicts, then finds it claimed)",
      setup: (r) => {
        const sync = r.registry.sync.bind(r.registry);
        // the rival's claim lands between this worker's read and its write
        r.registry.sync = async () => {
          await sync();
          r.registry.writeRemote(registryRecord("takeover", "w2", [{ ...r.registry.shard(), owner: "w2" }]));
        };
      },
      reason: /lost the takeover race/,
    },
  ];
  for (const c of cases) {
    await t.test(c.name, async () => {
      const r = rig();
      c.setup(r);
      await r.runner.start();
      assert.equal(r.runner.state.type, "stopped");
      assert.match((r.runner.state as { reason: string }).reason, c.reason);
      assert.equal(r.log.feed, undefined, "no consumer read");
      assert.deepEqual(r.log.calls, [], "no consumer made or deleted");
    });
  }
});

// ---- batches ------------------------------------------------------------------------------------

test("shard runner - holes in the offsets: what the consumer skipped is read from the stream, seqs follow the offsets, nothing is stuck", async (t) => {
  const cases: { name: string; first: number; missing: number[]; deliver: number[]; reads: number[]; pushed: number[] }[] = [
    { name: "a delivery lost in flight is read from the stream", first: 1, missing: [], deliver: [1, 2, 4, 5], reads: [3], pushed: [1, 2, 3, 4, 5] },
    { name: "an offset the stream does not hold (deleted) is skipped", first: 1, missing: [3], deliver: [1, 2, 4, 5], reads: [3], pushed: [1, 2, 4, 5] },
    { name: "offsets below the stream's first (retention) are not read", first: 4, missing: [1, 2, 3], deliver: [5], reads: [4], pushed: [4, 5] },
    { name: "a redelivery of what is done is skipped", first: 1, missing: [], deliver: [1, 2, 1, 3, 2, 4, 5], reads: [], pushed: [1, 2, 3, 4, 5] },
  ];
  for (const c of cases) {
    await t.test(c.name, async () => {
      const r = rig();
      for (let i = 1; i <= 5; i++) r.log.append(`u${i}`, `m${i}`);
      for (const o of c.missing) r.log.stored.delete(o);
      r.log.first = c.first;
      await r.runner.start();
      r.log.deliver(...c.deliver);
      await until("offset 5 done", () => r.runner.offset === 5);
      assert.deepEqual(r.log.reads, c.reads);
      assert.deepEqual(offsetsOf(r.pushes.sent), c.pushed);
      assert.deepEqual(r.pushes.sent.map((p) => p.entry.seq), c.pushed.map((o) => composeSeq(0, o)), "seq = epoch 0 over the offset");
      assert.equal(r.log.acks.at(-1), 5, "acked up to the highest offset");
      assert.equal(await counter(r.metrics, "jetgate_worker_delivery_gaps_total"), c.reads.length - c.missing.filter((o) => o >= c.first).length);
      // nothing stuck: the next entry goes through
      r.log.deliver(r.log.append("u6", "m6"));
      await until("offset 6 done", () => r.runner.offset === 6);
      assert.equal(r.pushes.sent.at(-1)!.entry.seq, composeSeq(0, 6));
      assert.equal(await counter(r.metrics, "jetgate_mailbox_seq_regression_total", { component: "worker" }), 0);
      await r.runner.stop("test over");
    });
  }
});

test("shard runner - a fence between the Redis step and the push: nothing of the batch is pushed or acked, the runner stops", async (t) => {
  const cases: { name: string; fence: (r: Rig) => void; syncs: number }[] = [
    // the registry follower applied the newer epoch while Redis worked: the listener fences at once
    { name: "the newer epoch applied locally", fence: (r) => r.registry.write(operatorBump(r.registry.shard(), 3)), syncs: 2 },
    // only on the server: the confirmation before the push reads the head and finds it
    { name: "the newer epoch only on the registry's head", fence: (r) => r.registry.writeRemote(operatorBump(r.registry.shard(), 3)), syncs: 3 },
  ];
  for (const c of cases) {
    await t.test(c.name, async () => {
      const clock = new ManualClock();
      const r = rig({ batch: 1, clock });
      r.log.append("ann", "m1");
      r.log.append("bob", "m2");
      await r.runner.start();
      r.log.deliver(1);
      await until("the first batch done", () => r.runner.offset === 1);
      // past the 50 ms a confirmation of the head stands for (within it, a push under the old epoch
      // may slip out: docs/registry-and-worker.md, "A batch", step 3)
      clock.advance(50);
      r.store.during = () => c.fence(r);
      r.log.append("cy", "m3");
      r.log.deliver(2, 3);
      await until("the runner stopped", () => r.runner.state.type === "stopped");
      await stepping("the stop", r.runner.stop("test over"));
      assert.deepEqual(r.runner.state, { type: "stopped", reason: "fenced by epoch 1" });
      assert.deepEqual(r.store.applied.map((b) => b.map((e) => e.offset)), [[1], [2]], "the Redis step of the fenced batch ran; nothing after it");
      assert.deepEqual(offsetsOf(r.pushes.sent), [1], "no push of the fenced batch");
      assert.deepEqual(r.log.acks, [1], "no ack of the fenced batch");
      assert.equal(r.runner.offset, 1);
      assert.equal(r.registry.syncs, c.syncs, "at the takeover, at the first batch's confirmation, and at the fenced batch's when it read the head");
      assert.equal(r.log.feed!.stopped, true, "the consumer stopped");
      assert.equal(await counter(r.metrics, "jetgate_worker_fenced_total"), 1);
    });
  }
});

test("shard runner - batches overlap: the next Redis step runs while the last batch's confirmation is in flight; pushes and acks keep the offsets' order", async (t) => {
  const cases: { name: string; fenceAtHead: boolean; pushed: number[]; acks: number[]; offset: number }[] = [
    { name: "the head still shows the epoch: both batches go out, in order", fenceAtHead: false, pushed: [1, 2, 3], acks: [1, 2, 3], offset: 3 },
    // the second batch went through Redis before the first one's confirmation found the fence: it
    // is neither pushed nor acked, as a fenced batch never is; its Redis writes are a fenced batch's
    { name: "the head shows a newer epoch: neither the confirmed-late batch nor the one behind it goes out", fenceAtHead: true, pushed: [1], acks: [1], offset: 1 },
  ];
  for (const c of cases) {
    await t.test(c.name, async () => {
      const clock = new ManualClock();
      const r = rig({ batch: 1, clock });
      for (let i = 1; i <= 3; i++) r.log.append(`u${i}`, `m${i}`);
      await r.runner.start();
      r.log.deliver(1);
      await until("the first batch done", () => r.runner.offset === 1);
      // past the 50 ms a confirmation stands for: the next batch reads the head
      clock.advance(50);
      let answer!: () => void;
      r.registry.syncGate = new Promise<void>((resolve) => (answer = resolve));
      if (c.fenceAtHead) r.registry.writeRemote(operatorBump(r.registry.shard(), 2));
      r.log.deliver(2, 3);
      await until("the third offset's Redis step ran while the second's confirmation waits", () => r.store.applied.length === 3);
      assert.deepEqual(r.store.applied.map((b) => b.map((e) => e.offset)), [[1], [2], [3]]);
      assert.deepEqual(offsetsOf(r.pushes.sent), [1], "nothing of batch 2 or 3 out before batch 2 is confirmed");
      assert.deepEqual(r.log.acks, [1]);
      assert.equal(r.runner.offset, 1, "the offset done moves with the acks, not with the Redis steps");
      answer();
      r.registry.syncGate = undefined;
      if (c.fenceAtHead) await until("the runner stopped", () => r.runner.state.type === "stopped");
      else await until("offset 3 done", () => r.runner.offset === 3);
      await r.runner.stop("test over");
      assert.deepEqual(offsetsOf(r.pushes.sent), c.pushed);
      assert.deepEqual(r.log.acks, c.acks);
      assert.equal(r.runner.offset, c.offset);
      assert.equal(await counter(r.metrics, "jetgate_worker_fenced_total"), c.fenceAtHead ? 1 : 0);
    });
  }
});

test("shard runner - fenced with deliveries queued beyond the limit: the runner stops all the same", async () => {
  // JETGATE_WORKER_BATCH 1: the queue holds 2, the consumer holds the rest when the fence comes
  const r = rig({ batch: 1 });
  for (let i = 1; i <= 8; i++) r.log.append(`u${i}`, `m${i}`);
  await r.runner.start();
  r.store.during = () => r.registry.write(operatorBump(r.registry.shard(), 1));
  r.log.deliver(1, 2, 3, 4, 5, 6, 7, 8);
  await until("the runner stopped", () => r.runner.state.type === "stopped");
  let stopped = false;
  const stopping = r.runner.stop("test over").then(() => (stopped = true));
  await until("the stop resolved", () => stopped, 200);
  await stopping;
  assert.deepEqual(r.runner.state, { type: "stopped", reason: "fenced by epoch 1" });
  assert.deepEqual(r.pushes.sent, []);
  assert.deepEqual(r.log.acks, []);
});

test("shard runner - Redis down, then fenced: retried while away, stopped by the fence, nothing acked beyond what was applied", async (t) => {
  const cases: { name: string; fence: (r: Rig) => void; backAt: number | undefined; applied: number[][]; syncs: number }[] = [
    // a retry checks the registry as applied locally: the fence ends the retries
    { name: "the fence applied locally while Redis is away", fence: (r) => r.registry.write(operatorBump(r.registry.shard(), 3)), backAt: undefined, applied: [[1], [2]], syncs: 2 },
    // a fence only on the head is found once Redis is back, by the confirmation before the push
    { name: "the fence only on the head; Redis back at the third try", fence: (r) => r.registry.writeRemote(operatorBump(r.registry.shard(), 3)), backAt: 3, applied: [[1], [2], [3]], syncs: 3 },
  ];
  for (const c of cases) {
    await t.test(c.name, async () => {
      const r = rig({ batch: 1 });
      for (let i = 1; i <= 4; i++) r.log.append(`u${i}`, `m${i}`);
      await r.runner.start();
      r.log.deliver(1, 2);
      await until("the first batch done", () => r.runner.offset === 2);
      const base = r.store.attempts;
      r.store.down = true;
      r.store.during = (attempt) => {
        const n = attempt - base;
        if (n === 2) c.fence(r);
        if (n === c.backAt) r.store.down = false;
      };
      r.log.deliver(3, 4);
      await until("the runner stopped", () => r.runner.state.type === "stopped");
      await stepping("the stop", r.runner.stop("test over"));
      assert.deepEqual(r.runner.state, { type: "stopped", reason: "fenced by epoch 1" });
      assert.deepEqual(r.store.applied.map((b) => b.map((e) => e.offset)), c.applied);
      assert.equal(await counter(r.metrics, "jetgate_worker_redis_retries_total"), c.backAt === undefined ? 2 : c.backAt - 1);
      assert.deepEqual(offsetsOf(r.pushes.sent), [1, 2], "nothing of the batch Redis failed on is pushed");
      assert.deepEqual(r.log.acks, [1, 2], "acked up to what was done only");
      assert.equal(r.runner.offset, 2);
      assert.equal(r.registry.syncs, c.syncs);
      const released = await stepping("the release", r.runner.release("after the fence", 1000));
      assert.deepEqual(released, { outcome: "fenced", offset: 2 }, "a fenced runner writes no release");
      assert.equal(r.registry.shard().owner, null, "the operator's epoch stays unclaimed");
    });
  }
});

test("shard runner - after a split: a moved user's entries past the cut are forwarded with their Nats-Msg-Id, the rest processed under the parent", async () => {
  const [s0] = initialShards(1, [LOG]) as [ShardState];
  const moved = halfRange(s0.range, true);
  const names = Array.from({ length: 40 }, (_, i) => `user${i}`);
  const goes = names.find((u) => userHash(u) >= moved.lo)!;
  const stays = names.find((u) => userHash(u) < moved.lo)!;
  const log = new MemLog();
  log.append(goes, "a1");
  log.append(stays, "b1");
  // the operator's cut: offset 2; the parent's epoch 0 is owned by a worker that is gone
  const [parent, child] = splitShard({ ...s0, owner: "w0" }, { child: 1, childLog: "logC", moved, cutOffset: 2 });
  log.append(goes, "a2");
  log.append(stays, "b2");
  const r = rig({ registry: new MemRegistry([parent, child]), log });
  await r.runner.start();
  assert.deepEqual(r.runner.state, { type: "running", epoch: 1 }, "the split's epoch is claimed");
  r.log.deliver(1, 2, 3, 4);
  await until("offset 4 done", () => r.runner.offset === 4);
  assert.deepEqual(r.log.forwarded, [{ subject: entrySubject(1, goes, "default"), msgId: `a2:${goes}` }]);
  assert.deepEqual(
    r.pushes.sent.map((p) => [p.user, p.entry.seq]),
    [[goes, composeSeq(0, 1)], [stays, composeSeq(0, 2)], [stays, composeSeq(1, 4)]],
    "below the cut: numbered by the parent's older epoch, a moved user's too; past it the split's epoch",
  );
  assert.deepEqual(r.store.applied.flat().map((e) => e.offset), [1, 2, 4], "a forwarded entry has no Redis step here");
  assert.equal(r.log.acks.at(-1), 4, "acked up to the forwarded and the processed");
  assert.equal(await counter(r.metrics, "jetgate_worker_forwarded_total"), 1);
  assert.equal(await counter(r.metrics, "jetgate_worker_entries_processed_total"), 4);
  await r.runner.stop("test over");
});

// ---- release and resume -------------------------------------------------------------------------

test("shard runner - a planned release records the last offset done, and the next worker resumes the same epoch after it", async (t) => {
  const cases: { name: string; during: boolean; pushed: number[]; released: number }[] = [
    { name: "released while idle", during: false, pushed: [1, 2, 3], released: 3 },
    // today's behaviour: a batch whose Redis step is in hand when the release stops the runner is
    // not confirmed, pushed or acked; the release ends at the offset before it and the next owner
    // processes it again (Redis's dedup counts the same offset as the first copy)
    { name: "released while a batch is in the Redis step: that batch is left to the next owner", during: true, pushed: [1], released: 1 },
  ];
  for (const c of cases) {
    await t.test(c.name, async () => {
      const a = rig();
      for (let i = 1; i <= 4; i++) a.log.append(`u${i}`, `m${i}`);
      await a.runner.start();
      a.log.deliver(1);
      await until("offset 1 done", () => a.runner.offset === 1);
      let releasing: Promise<unknown> | undefined;
      if (c.during) {
        a.store.during = () => {
          a.store.during = undefined;
          releasing = a.runner.release("rebalancing", 1000);
        };
        a.log.deliver(2, 3);
      } else {
        a.log.deliver(2, 3);
        await until("offset 3 done", () => a.runner.offset === 3);
        releasing = a.runner.release("rebalancing", 1000);
      }
      const released = await until("the release asked", () => releasing);
      assert.deepEqual(await released, { outcome: "released", epoch: 0, offset: c.released });
      assert.deepEqual(offsetsOf(a.pushes.sent), c.pushed);
      assert.equal(a.log.acks.at(-1), c.released, "acked up to the released offset");
      assert.equal(a.runner.state.type, "stopped");
      assert.equal(a.log.feed!.stopped, true);
      const s = a.registry.shard();
      assert.deepEqual({ owner: s.owner, released: s.released_offset, epoch: s.epoch }, { owner: null, released: c.released, epoch: 0 });

      // the next worker, on the same stream and registry
      const b = rig({ registry: a.registry, log: a.log, worker: "w2" });
      a.log.calls.length = 0;
      await b.runner.start();
      assert.deepEqual(b.runner.state, { type: "running", epoch: 0 }, "no epoch spent");
      assert.deepEqual(b.log.calls, ["delete w_0", `record w_0@${c.released}`, `open w_0@${c.released + 1}`], "the epoch's consumer made again after the released offset");
      assert.equal(b.registry.shard().owner, "w2");
      assert.equal(b.runner.offset, c.released);
      assert.equal(await counter(b.metrics, "jetgate_worker_takeovers_total", { shard: "0", mode: "resume" }), 1);
      b.log.deliver(...[2, 3, 4].filter((o) => o > c.released));
      await until("offset 4 done", () => b.runner.offset === 4);
      const rest = [2, 3, 4].filter((o) => o > c.released);
      assert.deepEqual(b.pushes.sent.map((p) => p.entry.seq), rest.map((o) => composeSeq(0, o)), "same numbering; every offset pushed by one of the two");
      assert.equal(await counter(b.metrics, "jetgate_mailbox_seq_regression_total", { component: "worker" }), 0);
      await b.runner.stop("test over");
    });
  }
});

test("shard runner - release outcomes: fenced when the epoch is no longer this worker's, failed when the registry does not answer", async (t) => {
  const cases: { name: string; before: (r: Rig) => void; want: { outcome: string; error?: RegExp } }[] = [
    { name: "a newer epoch came first: nothing written", before: (r) => r.registry.writeRemote(operatorBump(r.registry.shard(), 2)), want: { outcome: "fenced" } },
    { name: "the registry does not answer in time: failed, the epoch stays claimed", before: (r) => (r.registry.silent = true), want: { outcome: "failed", error: /no answer from the registry within 30 ms/ } },
  ];
  for (const c of cases) {
    await t.test(c.name, async () => {
      const r = rig();
      r.log.append("ann", "m1");
      await r.runner.start();
      r.log.deliver(1);
      await until("offset 1 done", () => r.runner.offset === 1);
      const epochBefore = r.registry.shard().epoch;
      c.before(r);
      const got = await r.runner.release("worker stopping", 30);
      assert.equal(got.outcome, c.want.outcome);
      if (c.want.error !== undefined) assert.match(got.error ?? "", c.want.error);
      assert.equal(got.offset, 1);
      assert.equal(r.runner.state.type, "stopped");
      assert.equal(r.registry.shard().released_offset, undefined, "no release recorded");
      assert.ok(r.registry.shard().epoch >= epochBefore);
    });
  }
});

test("worker release - shards given back at once go in one record: each released at its offset; one fenced meanwhile is left out; no answer fails them all", async (t) => {
  const owned = () => initialShards(3, ["l0", "l1", "l2"]).map((s) => ({ ...s, owner: "w1" }));
  await t.test("one record for all, a fenced one left out", async () => {
    const reg = new MemRegistry(owned());
    const seqBefore = reg.state.seq;
    reg.writeRemote(operatorBump(reg.shard(2), 7));
    const got = await writeRelease(reg, "w1", [{ shard: 0, epoch: 0, offset: 5 }, { shard: 1, epoch: 0, offset: 9 }, { shard: 2, epoch: 0, offset: 6 }], 1000);
    assert.deepEqual(Object.fromEntries(got), {
      0: { outcome: "released", epoch: 0, offset: 5 },
      1: { outcome: "released", epoch: 0, offset: 9 },
      2: { outcome: "fenced", epoch: 0, offset: 6 },
    });
    assert.equal(reg.state.seq, seqBefore + 2, "the operator's bump, then one release record");
    assert.deepEqual([0, 1].map((s) => [reg.shard(s).owner, reg.shard(s).released_offset]), [[null, 5], [null, 9]]);
    assert.equal(reg.shard(2).epoch, 1);
  });
  await t.test("a runner that never ran is fenced; nothing of this worker's: nothing written", async () => {
    const reg = new MemRegistry(owned());
    const seqBefore = reg.state.seq;
    const got = await writeRelease(reg, "w2", [{ shard: 0, epoch: 0, offset: 5 }, { shard: 1, epoch: undefined, offset: 0 }], 1000);
    assert.deepEqual([...got.values()].map((o) => o.outcome), ["fenced", "fenced"]);
    assert.equal(reg.state.seq, seqBefore);
  });
  await t.test("the registry does not answer: every one failed, the epochs stay claimed", async () => {
    const reg = new MemRegistry(owned());
    reg.silent = true;
    const got = await writeRelease(reg, "w1", [{ shard: 0, epoch: 0, offset: 5 }, { shard: 1, epoch: 0, offset: 9 }], 30);
    for (const o of got.values()) {
      assert.equal(o.outcome, "failed");
      assert.match(o.error ?? "", /no answer from the registry within 30 ms/);
    }
    assert.equal(reg.shard(0).owner, "w1");
  });
});
