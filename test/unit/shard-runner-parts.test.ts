// The runner's parts on their own: the bounded queue between the consumer and the batches
// (worker/shard-pump.ts) and the epoch guard (worker/epoch-guard.ts).
import { test } from "node:test";
import assert from "node:assert/strict";
import { pino } from "pino";
import { EMPTY_REGISTRY, applyRecord, bumpEpoch, initialShards, registryRecord, type RegistryState, type ShardState } from "../../protocol/index.js";
import { BatchQueue, pump } from "../../worker/shard-pump.js";
import { EpochGuard, superseded } from "../../worker/epoch-guard.js";
import type { DeliveredMsg, RegistryView } from "../../worker/shard-ports.js";
import { ManualClock } from "../harness/manual-clock.js";

/** An async source the test feeds; counts how many items the reader has pulled. */
function source<T>() {
  const items: T[] = [];
  let waiter: ((r: IteratorResult<T>) => void) | undefined;
  let ended = false;
  let pulled = 0;
  const it: AsyncIterable<T> = {
    [Symbol.asyncIterator]: () => ({
      next: () => {
        pulled++;
        const v = items.shift();
        if (v !== undefined) return Promise.resolve({ value: v, done: false });
        if (ended) return Promise.resolve({ value: undefined, done: true });
        return new Promise((r) => (waiter = r));
      },
    }),
  };
  const wakeWith = (r: IteratorResult<T>) => {
    const w = waiter;
    waiter = undefined;
    w?.(r);
    return w !== undefined;
  };
  return {
    it,
    push: (...vs: T[]) => {
      for (const v of vs) if (!wakeWith({ value: v, done: false })) items.push(v);
    },
    end: () => {
      ended = true;
      wakeWith({ value: undefined, done: true });
    },
    get pulled() {
      return pulled;
    },
  };
}

/** A few turns of the event loop: the pump's reader and processor move on promises, not on time. */
const settle = async () => {
  for (let i = 0; i < 20; i++) await new Promise((r) => setImmediate(r));
};

test("batch queue - takes what is queued up to a batch, never waits to fill one, and the reader pauses at the limit", async () => {
  const src = source<number>();
  const q = new BatchQueue(src.it, 4, () => assert.fail("no error expected"));
  src.push(1, 2, 3, 4, 5, 6);
  await settle();
  assert.equal(src.pulled, 4, "the reader paused with 4 queued (the limit)");
  assert.deepEqual(await q.take(3), [1, 2, 3], "at most a batch");
  await settle();
  assert.deepEqual(await q.take(3), [4, 5, 6], "the reader went on once there was room");
  const waiting = q.take(3);
  let got: number[] | undefined;
  void waiting.then((b) => (got = b));
  await settle();
  assert.equal(got, undefined, "an empty queue waits");
  src.push(7);
  assert.deepEqual(await waiting, [7], "one queued item is a batch: no waiting to fill it");
  src.end();
  assert.equal(await q.take(3), undefined, "ended and empty");
  await q.close();
});

test("batch queue - a failing source is reported once, ends the queue after what it delivered", async () => {
  const errors: unknown[] = [];
  const failing: AsyncIterable<number> = {
    async *[Symbol.asyncIterator]() {
      yield 1;
      throw new Error("consumer deleted");
    },
  };
  const q = new BatchQueue(failing, 10, (err) => errors.push(err));
  assert.deepEqual(await q.take(10), [1]);
  assert.equal(await q.take(10), undefined);
  await q.close();
  assert.deepEqual(errors.map((e) => (e as Error).message), ["consumer deleted"]);
});

test("batch queue - close lets a reader paused at the limit end once its source stops", async () => {
  const src = source<number>();
  const q = new BatchQueue(src.it, 2, () => undefined);
  src.push(1, 2, 3);
  await settle();
  src.end();
  await q.close();
  assert.equal(src.pulled, 4, "the reader went on after close: 3, then the end");
});

test("pump - one batch prepared ahead of the one being emitted; emits in order; a failed or refused emit stops every batch behind it", async (t) => {
  const cases: { name: string; failAt: number | undefined; how: "throw" | "refuse"; emitted: number[]; errors: string[] }[] = [
    { name: "every emit succeeds", failAt: undefined, how: "refuse", emitted: [1, 2, 3], errors: [] },
    { name: "the second emit throws", failAt: 2, how: "throw", emitted: [1, 2], errors: ["batch failed"] },
    { name: "the second emit refuses (a fence)", failAt: 2, how: "refuse", emitted: [1, 2], errors: [] },
  ];
  for (const c of cases) {
    await t.test(c.name, async () => {
      const src = source<DeliveredMsg>();
      const msg = (seq: number) => ({ subject: "s", seq, data: new Uint8Array(), ack: () => undefined });
      const log: string[] = [];
      const errors: string[] = [];
      const emitted: number[] = [];
      let ended = false;
      const gates = new Map<number, () => void>();
      const done = pump({ [Symbol.asyncIterator]: src.it[Symbol.asyncIterator], stop: () => src.end() }, 1, {
        running: () => true,
        prepare: async (b) => {
          log.push(`prepare ${b[0]!.seq}`);
          return b[0]!.seq;
        },
        emit: async (n) => {
          log.push(`emit ${n}`);
          await new Promise<void>((r) => gates.set(n, r));
          emitted.push(n);
          if (n === c.failAt && c.how === "throw") throw new Error("publish failed");
          return n !== c.failAt;
        },
        ended: () => {
          ended = true;
          src.end();
        },
        error: (m) => errors.push(m),
      });
      src.push(msg(1), msg(2), msg(3));
      src.end();
      await settle();
      assert.deepEqual(log, ["prepare 1", "emit 1", "prepare 2"], "batch 2 prepared while batch 1 is emitted, not emitted before it ends");
      for (const n of [1, 2, 3]) {
        gates.get(n)?.();
        await settle();
      }
      await done;
      assert.equal(ended, true);
      assert.deepEqual(emitted, c.emitted);
      assert.deepEqual(errors, c.errors);
      const emits = log.filter((l) => l.startsWith("emit"));
      assert.deepEqual(emits, c.emitted.map((n) => `emit ${n}`), "nothing emitted after a failed or refused emit");
    });
  }
});

/** A registry whose head (`remote`) the guard sees only through sync. */
class Registry implements RegistryView {
  state: RegistryState;
  remote: ShardState | undefined;
  syncs = 0;
  failSyncs = 0;
  private readonly listeners = new Set<(s: RegistryState) => void>();
  readonly shards = { shardOf: () => 0 };

  constructor(s: ShardState) {
    this.state = applyRecord(EMPTY_REGISTRY, 1, registryRecord("init", "t", [s]));
  }

  set(s: ShardState): void {
    this.state = applyRecord(this.state, this.state.seq + 1, registryRecord("takeover", "op", [s]));
    for (const l of this.listeners) l(this.state);
  }

  async sync(): Promise<void> {
    this.syncs++;
    if (this.failSyncs > 0) {
      this.failSyncs--;
      throw new Error("TIMEOUT");
    }
    if (this.remote !== undefined) this.set(this.remote);
    this.remote = undefined;
  }

  onChange(l: (s: RegistryState) => void): () => void {
    this.listeners.add(l);
    return () => this.listeners.delete(l);
  }

  async update(): Promise<null> {
    return null;
  }
}

function guarded(s: ShardState) {
  const registry = new Registry(s);
  const clock = new ManualClock();
  const fences: number[] = [];
  let running = true;
  const guard = new EpochGuard({
    shard: 0, epoch: s.epoch, workerId: "w1", registry, log: pino({ level: "silent" }), clock,
    running: () => running,
    fence: (e) => {
      fences.push(e);
      running = false;
    },
  });
  return { registry, clock, guard, fences, stop: () => (running = false) };
}

/** Awaits `p`, stepping `clock` 100 ms at a time while it waits (a retry's backoff runs on the clock). */
async function stepping<T>(clock: ManualClock, p: Promise<T>): Promise<T> {
  let done = false;
  p.then(() => (done = true), () => (done = true));
  for (let i = 0; i < 100; i++) {
    await settle();
    if (done) break;
    clock.advance(100);
  }
  return p;
}

const [s0] = initialShards(1, ["logA"]) as [ShardState];
const mine: ShardState = { ...s0, owner: "w1" };

test("epoch guard - superseded: a newer epoch, or this epoch owned by another", () => {
  const cases: [string, ShardState, boolean][] = [
    ["this epoch, this owner", mine, false],
    ["a newer epoch", bumpEpoch(mine, { cause: "takeover", start_offset: 1, owner: null }), true],
    ["this epoch, another owner", { ...mine, owner: "w2" }, true],
    ["this epoch, released", { ...mine, owner: null, released_offset: 3 }, true],
  ];
  for (const [name, cur, want] of cases) assert.equal(superseded(cur, 0, "w1"), want, name);
});

test("epoch guard - holds until the registry shows a newer epoch, and fences once, from the listener", () => {
  const g = guarded(mine);
  const unwatch = g.guard.watch();
  assert.equal(g.guard.holds(), true);
  g.registry.set(bumpEpoch(mine, { cause: "takeover", start_offset: 1, owner: null }));
  assert.deepEqual(g.fences, [1], "the listener fenced");
  assert.equal(g.guard.holds(), false);
  assert.deepEqual(g.fences, [1], "not fenced again once stopped");
  unwatch();
});

test("epoch guard - confirm reads the head, retries while it cannot, and a fresh confirmation stands for 50 ms", async () => {
  const g = guarded(mine);
  g.registry.failSyncs = 2;
  const started = g.clock.monotonic();
  assert.equal(await stepping(g.clock, g.guard.confirm()), true, "confirmed after two failed reads");
  assert.equal(g.registry.syncs, 3);
  assert.equal(g.clock.monotonic() - started, 300, "after waiting 100 ms, then 200 ms");
  // a newer epoch on the head only, within 50 ms of the confirmation: not read (today's trade-off)
  g.registry.remote = bumpEpoch(mine, { cause: "takeover", start_offset: 1, owner: null });
  g.clock.advance(49);
  assert.equal(await g.guard.confirm(), true, "a fresh confirmation stands, without a read");
  assert.equal(g.registry.syncs, 3);
  g.clock.advance(1);
  assert.equal(await g.guard.confirm(), false, "at 50 ms the head is read again: fenced");
  assert.equal(g.registry.syncs, 4);
  assert.deepEqual(g.fences, [1]);
});

test("epoch guard - a stopped runner is never confirmed, and nothing is read for it", async () => {
  const g = guarded(mine);
  g.stop();
  assert.equal(await g.guard.confirm(), false);
  assert.equal(g.registry.syncs, 0);
  assert.deepEqual(g.fences, [], "a stop is no fence");
});
