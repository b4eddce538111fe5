/**
 * The mailbox reader's decisions in memory (gateway/mailbox/source.ts): which source serves a read
 * (the user's head, the hot cache as far as its rows prove themselves complete, the stream), when a
 * device is sent away because this gateway's registry view is behind, pagination, gap fills and the
 * bound on stream reads. Redis and JetStream are fakes of the two ports (gateway/mailbox/ports.ts);
 * test/integration/mailbox-reader.test.ts runs the same reads on the real servers.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import {
  applyRecord,
  bumpEpoch,
  composeSeq,
  encodeStoredEntry,
  entrySubject,
  initialShards,
  parseEntrySubject,
  WATERMARK_ALL,
  type CacheRow,
  type Entry,
  type MailboxSeq,
  type RegistryState,
  type ShardState,
} from "../../protocol/index.js";
import { UnavailableError } from "../../gateway/mailbox/gather.js";
import type { MailboxCache, MailboxStream, StreamCursor, StreamMsg, StreamState } from "../../gateway/mailbox/ports.js";
import { CacheFirstMailbox } from "../../gateway/mailbox/source.js";

const U = "alice";

/** The registry view the reader numbers by; `apply` writes a record, `syncs` counts the reader's syncs. */
class FakeRegistry {
  state: RegistryState;
  syncs = 0;
  constructor(shards: ShardState[]) {
    this.state = applyRecord({ seq: 0, shards: new Map() }, 1, { v: 1, op: "init", at: 0, by: "test", shards });
  }
  apply(shards: ShardState[]): void {
    this.state = applyRecord(this.state, this.state.seq + 1, { v: 1, op: "takeover", at: 0, by: "test", shards });
  }
  async sync(): Promise<void> {
    this.syncs++;
  }
}
const seq = (offset: number, epoch = 0): MailboxSeq => composeSeq(epoch, offset);

/** Shard 0's stream (log `logA` unless the test changes it) and the calls made to it. */
class FakeStream implements MailboxStream {
  msgs: StreamMsg[] = [];
  log: string | undefined = "logA";
  /** Offsets at or below this were removed by retention. */
  trimmedTo = 0;
  calls = { state: 0, last: 0, next: 0, open: 0, closed: 0 };
  /** Leader gets running now, and the most at once. */
  running = 0;
  peak = 0;
  /** When set, every `next` waits for it. */
  gate: Promise<void> | undefined;

  append(user: string, lane = "default", id = `e${this.lastOffset() + 1}`): number {
    const offset = this.lastOffset() + 1;
    this.msgs.push({ offset, subject: entrySubject(0, user, lane), data: encodeStoredEntry({ id, d: id, ts: 1, b: new Uint8Array([offset & 0xff]) }) });
    return offset;
  }
  lastOffset(): number {
    return this.msgs.at(-1)?.offset ?? 0;
  }
  private held(): StreamMsg[] {
    return this.msgs.filter((m) => m.offset > this.trimmedTo);
  }
  private ofUser(user: string, from: number): StreamMsg[] {
    return this.held().filter((m) => m.offset >= from && parseEntrySubject(m.subject)?.user === user);
  }
  async state(): Promise<StreamState> {
    this.calls.state++;
    return { firstOffset: this.trimmedTo + 1, lastOffset: this.lastOffset(), log: this.log };
  }
  async last(_shard: number, user: string, lane: string): Promise<StreamMsg | null> {
    this.calls.last++;
    return this.held().filter((m) => m.subject === entrySubject(0, user, lane)).at(-1) ?? null;
  }
  async next(_shard: number, user: string, offset: number): Promise<StreamMsg | null> {
    this.calls.next++;
    this.running++;
    this.peak = Math.max(this.peak, this.running);
    try {
      await this.gate;
      return this.ofUser(user, offset)[0] ?? null;
    } finally {
      this.running--;
    }
  }
  async open(_shard: number, user: string, offset: number): Promise<StreamCursor> {
    this.calls.open++;
    const queue = this.ofUser(user, offset);
    return {
      pending: queue.length,
      async *fetch(max: number) {
        for (let i = 0; i < max && queue.length > 0; i++) {
          const m = queue.shift()!;
          yield { ...m, left: queue.length };
        }
      },
      close: async () => void this.calls.closed++,
    };
  }
}

/** The user's watermark hash and hot cache, as the worker writes them. */
class FakeCache implements MailboxCache {
  hash = new Map<string, Record<string, string>>();
  rows = new Map<string, CacheRow[]>();
  failing = new Set<string>();
  async watermarkHash(user: string) {
    return { ...this.hash.get(user) };
  }
  async headAndRows(user: string, after: MailboxSeq, until: MailboxSeq | undefined, count: number) {
    const rows = (this.rows.get(user) ?? []).filter((r) => BigInt(r.seq) > after && (until === undefined || BigInt(r.seq) <= until)).slice(0, count);
    return { head: this.hash.get(user)?.[WATERMARK_ALL], rows };
  }
  async headsAndRoutes(users: readonly string[]) {
    return users.map((u): [unknown, unknown] | null => (this.failing.has(u) ? null : [this.hash.get(u)?.[WATERMARK_ALL] ?? null, this.hash.get(u)?.[":r"] ?? null]));
  }
}

function world(opts: { now?: () => number } = {}) {
  const registry = new FakeRegistry(initialShards(2, ["logA", "logZ"]));
  const stream = new FakeStream();
  const cache = new FakeCache();
  const reader = new CacheFirstMailbox(cache, stream, registry, ["default", "chat"], opts);
  /** Appends `n` entries of the user and has the worker process them: watermarks, and a cache row each when `cached`. */
  const dispatch = (n: number, { cached = true, lane = "default", epoch = 0 } = {}): MailboxSeq[] => {
    const out: MailboxSeq[] = [];
    for (let i = 0; i < n; i++) {
      const offset = stream.append(U, lane);
      const m = stream.msgs.at(-1)!;
      const s = seq(offset, epoch);
      const h = cache.hash.get(U) ?? {};
      const prevAll = h[WATERMARK_ALL] ?? "";
      if (cached) {
        const rows = cache.rows.get(U) ?? [];
        rows.push({ seq: s.toString(), prev: h[lane] ?? "", prevAll, lane, entry: Buffer.from(m.data), shard: "0" });
        cache.rows.set(U, rows);
      }
      cache.hash.set(U, { ...h, [WATERMARK_ALL]: s.toString(), [lane]: s.toString() });
      out.push(s);
    }
    return out;
  };
  return { registry, stream, cache, reader, dispatch };
}

type World = ReturnType<typeof world>;

async function readAll(w: World, after: MailboxSeq, opts: Parameters<CacheFirstMailbox["read"]>[3] = {}) {
  const pages: { entries: Entry[]; source: string }[] = [];
  for await (const p of w.reader.read(0, U, after, opts)) pages.push(p);
  return { seqs: pages.flatMap((p) => p.entries.map((e) => e.seq)), sources: [...new Set(pages.map((p) => p.source))], pages };
}

test("mailbox reader - the head says nothing is new: no cache rows read past it, no stream read", async () => {
  const w = world();
  const seqs = w.dispatch(3);
  const r = await readAll(w, seqs[2]!);
  assert.deepEqual(r.seqs, []);
  assert.deepEqual(w.stream.calls, { state: 0, last: 0, next: 0, open: 0, closed: 0 });
});

test("mailbox reader - the cache covers the range: every entry from it, in order, with its prevs; the stream untouched", async () => {
  const w = world();
  const seqs = w.dispatch(5);
  w.dispatch(1, { lane: "chat" });
  const r = await readAll(w, seqs[1]!);
  assert.deepEqual(r.seqs, [...seqs.slice(2), seq(6)]);
  assert.deepEqual(r.sources, ["cache"]);
  const entries = r.pages.flatMap((p) => p.entries);
  assert.equal(entries[0]!.prev, seqs[1], "the worker's lane prev");
  assert.equal(entries.at(-1)!.prev, null, "the first of its lane");
  assert.equal(w.stream.calls.open + w.stream.calls.next, 0);
});

test("mailbox reader - table: which source serves each read, and that no entry is ever withheld", async () => {
  type Case = { name: string; arrange: (w: World) => void; after?: number; opts?: (w: World) => Parameters<CacheFirstMailbox["read"]>[3]; offsets: number[]; sources: string[]; opens: number; gets: number };
  const cases: Case[] = [
    {
      name: "hot cache expired, watermarks kept: the stream, never 'nothing there'",
      arrange: (w) => (w.dispatch(6), w.cache.rows.delete(U)),
      offsets: [1, 2, 3, 4, 5, 6], sources: ["stream"], opens: 1, gets: 1,
    },
    {
      name: "hot cache and watermarks both lost: the stream",
      arrange: (w) => (w.dispatch(6), w.cache.rows.delete(U), w.cache.hash.delete(U)),
      offsets: [1, 2, 3, 4, 5, 6], sources: ["stream"], opens: 1, gets: 1,
    },
    {
      name: "a trimmed cache (its first row follows an entry past the cursor): the stream from the cursor",
      arrange: (w) => (w.dispatch(6), w.cache.rows.get(U)!.splice(0, 3)),
      offsets: [1, 2, 3, 4, 5, 6], sources: ["stream"], opens: 1, gets: 1,
    },
    {
      name: "a hole in the cache's rows (a row lost mid-chain): the cache up to it, the stream from there",
      arrange: (w) => (w.dispatch(6), w.cache.rows.get(U)!.splice(3, 1)),
      offsets: [1, 2, 3, 4, 5, 6], sources: ["cache", "stream"], opens: 1, gets: 1,
    },
    {
      name: "a row written while the hash was gone (no prevAll), other users' entries before it: one get vouches for it",
      arrange: (w) => {
        w.dispatch(3);
        w.stream.append("bob");
        w.stream.append("bob");
        w.dispatch(3);
        w.cache.rows.get(U)![3]!.prevAll = "";
      },
      offsets: [1, 2, 3, 6, 7, 8], sources: ["cache"], opens: 0, gets: 1,
    },
    {
      name: "a user's first entries (the first row names no predecessor) after other users': one get vouches for the start",
      arrange: (w) => (w.stream.append("bob"), w.stream.append("bob"), w.dispatch(2)),
      offsets: [3, 4], sources: ["cache"], opens: 0, gets: 1,
    },
    {
      name: "a device up to date but for a cache row that names no predecessor: no get needed",
      arrange: (w) => (w.dispatch(2), w.cache.hash.delete(U), w.dispatch(2)),
      after: 2, offsets: [3, 4], sources: ["cache"], opens: 0, gets: 0,
    },
    {
      name: "entries appended and not processed yet: the cache up to the head (the rest comes as pushes)",
      arrange: (w) => (w.dispatch(3), w.stream.append(U), w.stream.append(U)),
      offsets: [1, 2, 3], sources: ["cache"], opens: 0, gets: 0,
    },
    {
      name: "the same, with a head the caller read past the cache: the stream reaches it",
      arrange: (w) => (w.dispatch(3), w.stream.append(U), w.stream.append(U)),
      opts: () => ({ wm: { lanes: new Map(), head: seq(5), from: "redis" } }),
      offsets: [1, 2, 3, 4, 5], sources: ["cache", "stream"], opens: 1, gets: 1,
    },
    {
      name: "a cache read cut by its limit: the stream does not vouch for what lies past the rows",
      arrange: (w) => w.dispatch(6),
      opts: () => ({ limit: 4 }),
      offsets: [1, 2, 3, 4], sources: ["cache"], opens: 0, gets: 0,
    },
  ];
  for (const c of cases) {
    const w = world();
    c.arrange(w);
    const r = await readAll(w, seq(c.after ?? 0), c.opts?.(w) ?? {});
    assert.deepEqual(r.seqs, c.offsets.map((o) => seq(o)), `${c.name}: every entry once, in order`);
    assert.deepEqual(r.sources, c.sources, `${c.name}: sources`);
    assert.equal(w.stream.calls.open, c.opens, `${c.name}: stream reads`);
    assert.equal(w.stream.calls.next, c.gets, `${c.name}: leader gets`);
    assert.equal(w.stream.calls.closed, w.stream.calls.open, `${c.name}: every stream read closed`);
  }
});

test("mailbox reader - offsets with holes (other users' entries, a lane's own order): the stream read keeps each lane's prev chain", async () => {
  const w = world();
  const mine: MailboxSeq[] = [];
  for (let i = 0; i < 9; i++) {
    if (i % 3 === 0) w.stream.append("bob");
    mine.push(seq(w.stream.append(U, i % 2 === 0 ? "default" : "chat")));
  }
  const r = await readAll(w, 0n, { pageSize: 4 });
  assert.deepEqual(r.seqs, mine);
  assert.deepEqual(r.pages.map((p) => p.entries.length), [4, 4, 1], "pages of pageSize");
  const entries = r.pages.flatMap((p) => p.entries);
  const last = new Map<string, MailboxSeq>();
  for (const e of entries) {
    assert.equal(e.prev, last.get(e.lane) ?? 0n, `prev of ${e.seq}`);
    last.set(e.lane, e.seq);
  }
  const limited = await readAll(w, 0n, { limit: 5 });
  assert.deepEqual(limited.seqs, mine.slice(0, 5), "limit");
  const bounded = await readAll(w, 0n, { until: mine[3]! });
  assert.deepEqual(bounded.seqs, mine.slice(0, 4), "until, inclusive");
});

test("mailbox reader - a bounded read reaches `until` in the stream even when the head is below it (entries not processed yet)", async () => {
  const w = world();
  const seqs = w.dispatch(2);
  const late = seq(w.stream.append(U));
  const r = await readAll(w, seqs[1]!, { until: late });
  assert.deepEqual(r.seqs, [late]);
  assert.deepEqual(r.sources, ["stream"]);
});

test("mailbox reader - the stream holds another log than the registry view (a rebuild not seen yet): UnavailableError, nothing sent, a sync started", async () => {
  const w = world();
  w.dispatch(4);
  w.cache.rows.delete(U);
  w.stream.log = "logNew";
  await assert.rejects(readAll(w, 0n), (err: unknown) => {
    assert.ok(err instanceof UnavailableError, String(err));
    assert.match(err.message, /^shard 0: its stream holds log logNew, not logA/);
    assert.equal(err.retryMs, 1000);
    return true;
  });
  assert.equal(w.stream.calls.open, 0, "no stream read opened");
  await assert.rejects(w.reader.bounds(0, { fresh: true }), UnavailableError, "the AUTH decision's bounds too");
  assert.equal(w.registry.syncs, 2, "each refusal starts a registry sync");
  // a stream that names no log is taken as the view's
  w.stream.log = undefined;
  assert.equal((await readAll(w, 0n)).seqs.length, 4);
});

test("mailbox reader - the hot cache holds an epoch newer than the view (the worker's, not seen here yet): UnavailableError, no page", async () => {
  const w = world();
  w.dispatch(2);
  w.dispatch(2, { epoch: 1 });
  const pages: unknown[] = [];
  await assert.rejects(
    (async () => {
      for await (const p of w.reader.read(0, U, 0n)) pages.push(p);
    })(),
    (err: unknown) => err instanceof UnavailableError && /^shard 0: the hot cache holds epoch 1/.test(err.message) && err.retryMs === 1000,
  );
  assert.deepEqual(pages, [], "not even the older epoch's entries");
  assert.equal(w.registry.syncs, 1);
  // once the view has the epoch, the same rows are served
  w.registry.apply([bumpEpoch(w.registry.state.shards.get(0)!, { cause: "takeover", start_offset: 3 })]);
  assert.deepEqual((await readAll(w, 0n)).seqs, [seq(1), seq(2), seq(3, 1), seq(4, 1)]);
});

test("mailbox reader - bounds: the trim in today's numbering, cached for a second unless fresh; a failure is not cached", async () => {
  let now = 1000;
  const w = world({ now: () => now });
  w.dispatch(8, { cached: false });
  w.stream.trimmedTo = 5;
  assert.deepEqual(await w.reader.bounds(0), { trim: seq(5), lastOffset: 8 });
  w.stream.append(U);
  assert.deepEqual(await w.reader.bounds(0), { trim: seq(5), lastOffset: 8 }, "cached");
  assert.deepEqual(await w.reader.bounds(0, { fresh: true }), { trim: seq(5), lastOffset: 9 }, "fresh");
  now += 1000;
  w.stream.trimmedTo = 0;
  assert.deepEqual(await w.reader.bounds(0), { trim: 0n, lastOffset: 9 }, "nothing trimmed: 0");
  assert.equal(w.stream.calls.state, 3);
  w.stream.log = "logNew";
  now += 1000;
  await assert.rejects(w.reader.bounds(0), UnavailableError);
  w.stream.log = "logA";
  assert.deepEqual(await w.reader.bounds(0), { trim: 0n, lastOffset: 9 }, "the refusal was not cached");
  // a cursor expired by retention: the stream read starts at the first offset it holds
  w.stream.trimmedTo = 7;
  assert.deepEqual((await readAll(w, 0n)).seqs, [seq(8), seq(9)]);
});

test("mailbox reader - watermarks: Redis's when it has the head (lanes it lacks unknown), else the stream's last of each lane", async () => {
  const w = world();
  w.dispatch(2);
  w.dispatch(1, { lane: "chat" });
  w.cache.hash.set(U, { ...w.cache.hash.get(U), ":r": "gw1.1", other: "not a seq" });
  const fromRedis = await w.reader.watermarks(0, U);
  assert.deepEqual(fromRedis, { lanes: new Map([["default", seq(2)], ["chat", seq(3)]]), head: seq(3), from: "redis" });
  w.cache.hash.set(U, { [WATERMARK_ALL]: seq(3).toString() });
  assert.deepEqual(await w.reader.watermarks(0, U), { lanes: new Map(), head: seq(3), from: "redis" }, "lanes lost: unknown, the head right");
  w.cache.hash.delete(U);
  assert.deepEqual(await w.reader.watermarks(0, U), { lanes: new Map([["default", seq(2)], ["chat", seq(3)]]), head: seq(3), from: "stream" });
  assert.equal(w.stream.calls.last, 2);
  assert.deepEqual(await w.reader.watermarks(0, "nobody"), { lanes: new Map(), head: 0n, from: "stream" });
});

test("mailbox reader - cachedHeads: a user whose read failed is undefined, not 'no head'; all failed is an error", async () => {
  const w = world();
  w.dispatch(2);
  w.cache.hash.set(U, { ...w.cache.hash.get(U), ":r": "gw1.3,gw2.1" });
  w.cache.failing.add("bob");
  const heads = await w.reader.cachedHeads([U, "bob", "carol"]);
  assert.deepEqual(heads, [{ head: seq(2), routes: ["gw1", "gw2"] }, undefined, { head: undefined, routes: [] }]);
  w.cache.failing.add(U);
  await assert.rejects(w.reader.cachedHeads([U, "bob"]), /no user's head could be read/);
  assert.deepEqual(await w.reader.cachedHeads([]), []);
});

test("mailbox reader - fill: the entries of a gap by leader gets; 'too_many' at max; one read shared by the sessions asking at once", async () => {
  const w = world();
  const seqs = w.dispatch(6, { cached: false });
  w.stream.append("bob");
  const after = seqs[0]!;
  const before = seqs[4]!;
  const got = await w.reader.fill(0, U, after, before);
  assert.ok(got !== "too_many");
  assert.deepEqual(got.map((e) => e.seq), seqs.slice(1, 4));
  assert.equal(got[0]!.prev, after, "the first of its lane follows the gap's start");
  assert.equal(await w.reader.fill(0, U, after, before, 3), "too_many");
  assert.deepEqual(await w.reader.fill(0, U, seqs[5]!, seq(100)), [], "nothing in the gap");
  w.stream.calls.next = 0;
  const [a, b] = await Promise.all([w.reader.fill(0, U, after, before), w.reader.fill(0, U, after, before)]);
  assert.equal(a, b, "one answer for both");
  assert.equal(w.stream.calls.next, 3, "one read for both: a get per entry");
});

test("mailbox reader - at most 32 stream calls at once; the rest wait their turn and all are answered", async () => {
  const w = world();
  w.dispatch(2, { cached: false });
  let open!: () => void;
  w.stream.gate = new Promise<void>((r) => (open = r));
  const fills = Array.from({ length: 50 }, (_, i) => w.reader.fill(0, U, 0n, seq(2 + i)));
  await new Promise((r) => setImmediate(r));
  assert.equal(w.stream.running, 32, "32 running, 18 queued");
  open();
  const all = await Promise.all(fills);
  assert.ok(all.every((r) => r !== "too_many" && r.length >= 1));
  assert.equal(w.stream.peak, 32);
});
