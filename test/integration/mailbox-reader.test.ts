import { test, after } from "node:test";
import assert from "node:assert/strict";
import { RedisKeys, WATERMARK_ALL, type Entry, type MailboxSeq } from "../../protocol/index.js";
import { MailboxReader } from "../../gateway/mailbox/reader.js";
import { UnavailableError } from "../../gateway/mailbox/gather.js";
import { startStack, redisClient } from "../harness/stack.js";
import { waitFor } from "../harness/wait.js";

// A hot cache of 8 rows: a long read comes from the stream, in pages
const stack = await startStack({ env: { JETGATE_HOT_CACHE_MAXLEN: "8" }, lanes: ["default", "chat"] });
const redis = await redisClient(stack.infra.redis.url);
after(async () => {
  redis.disconnect();
  await stack.dispose();
});
const keys = new RedisKeys("jg");
const user = "longread";
const N = 600;
const ids = Array.from({ length: N }, (_, i) => `lr${i}`);
// every third entry in the second lane, so prev chains per lane are checked
for (let i = 0; i < N; i += 50) {
  await Promise.all(ids.slice(i, i + 50).map((id, k) => stack.dispatcher.dispatch({ dispatch_id: id, message_id: id, lane: (i + k) % 3 === 0 ? "chat" : "default", recipients: [user], body: new TextEncoder().encode(id) })));
}
await waitFor("every entry processed (the user's head in Redis)", async () => (await redis.hget(keys.watermarks(user), WATERMARK_ALL)) !== null && (await redis.xlen(keys.hotCache(user))) === 8);
const shard = stack.registry.shards.shardOf(user)!;
const reader = new MailboxReader(stack.nc, redis, keys, stack.registry, ["default", "chat"]);

async function readAll(after: MailboxSeq, opts: Parameters<MailboxReader["read"]>[3] = {}) {
  const entries: Entry[] = [];
  const sources = new Set<string>();
  for await (const page of reader.read(shard, user, after, opts)) {
    entries.push(...page.entries);
    sources.add(page.source);
  }
  return { entries, sources };
}

/** Entries in order, each lane's prev the one before it in the read (or the read's start). */
function assertChained(entries: Entry[], after: MailboxSeq) {
  const last = new Map<string, MailboxSeq>();
  let prevSeq = after;
  for (const e of entries) {
    assert.ok(e.seq > prevSeq, `seq ${e.seq} after ${prevSeq}`);
    assert.equal(e.prev, last.get(e.lane) ?? after, `prev of ${e.id}`);
    last.set(e.lane, e.seq);
    prevSeq = e.seq;
  }
}

test("mailbox reader - a long read: every entry once, in order, from the stream; the last few from the cache", async () => {
  const { entries, sources } = await readAll(0n);
  assert.deepEqual(entries.map((e) => e.id), ids);
  // the cache's rows do not reach back to the read's start, so it serves none of them
  assert.deepEqual([...sources], ["stream"]);
  assertChained(entries, 0n);
  assert.equal(new TextDecoder().decode(entries[123]!.b), "lr123");
  const tail = await readAll(entries[N - 9]!.seq);
  assert.deepEqual(tail.entries.map((e) => e.id), ids.slice(N - 8));
  assert.deepEqual([...tail.sources], ["cache"]);
});

test("mailbox reader - a read bounded by until and by limit, and one from the middle", async () => {
  const all = (await readAll(0n)).entries;
  const until = all[299]!.seq;
  const bounded = await readAll(0n, { until });
  assert.deepEqual(bounded.entries.map((e) => e.id), ids.slice(0, 300));
  assert.deepEqual([...bounded.sources], ["stream"], "the cache's 8 rows lie past the bound");
  const limited = await readAll(0n, { limit: 100 });
  assert.deepEqual(limited.entries.map((e) => e.id), ids.slice(0, 100));
  const middle = await readAll(all[449]!.seq);
  assert.deepEqual(middle.entries.map((e) => e.id), ids.slice(450));
  assertChained(middle.entries, all[449]!.seq);
});

test("mailbox reader - a head above what the stream holds: the read ends with what there is", async () => {
  const all = (await readAll(0n)).entries;
  const r = await readAll(0n, { wm: { lanes: new Map(), head: all.at(-1)!.seq + 1000n, from: "redis" } });
  assert.deepEqual(r.entries.map((e) => e.id), ids);
});

test("mailbox reader - the user's head and hot cache lost from Redis: the read is complete from the stream", async () => {
  await redis.hdel(keys.watermarks(user), WATERMARK_ALL);
  await redis.del(keys.hotCache(user));
  const r = await readAll(0n);
  assert.deepEqual(r.entries.map((e) => e.id), ids);
  assert.deepEqual([...r.sources], ["stream"]);
  assert.equal((await readAll(0n, { limit: 5 })).entries.length, 5);
  // a user with no entries at all: nothing, no error
  let pages = 0;
  for await (const _ of reader.read(shard, "nobody-here", 0n)) pages++;
  assert.equal(pages, 0);
});

test("mailbox reader - a registry view behind the stream's log (a rebuild it has not seen): no entry numbered by the old log, a retry, a sync started", async () => {
  const real = stack.registry.state.shards.get(shard)!;
  // the view of a gateway that has not seen a rebuild yet: the same shard on the log before it
  const stale = { ...real, log: "logBeforeRebuild", boundaries: real.boundaries.map((b) => ({ ...b, log: "logBeforeRebuild" })) };
  let syncs = 0;
  const view = {
    state: { seq: stack.registry.state.seq, shards: new Map([...stack.registry.state.shards].map(([id, s]) => [id, id === shard ? stale : s])) },
    shards: stack.registry.shards,
    sync: async () => void syncs++,
  };
  const behind = new MailboxReader(stack.nc, redis, keys, view as unknown as typeof stack.registry, ["default", "chat"]);
  const read = async () => {
    for await (const page of behind.read(shard, user, 0n)) assert.fail(`a page of ${page.entries.length} entries from ${page.source}`);
  };
  await assert.rejects(read, (err: unknown) => {
    assert.ok(err instanceof UnavailableError, String(err));
    assert.match(err.message, new RegExp(`shard ${shard}: its stream holds log ${real.log}, not logBeforeRebuild`));
    assert.equal(err.retryMs, 1000);
    return true;
  });
  await assert.rejects(() => behind.bounds(shard, { fresh: true }), UnavailableError, "the AUTH decision's bounds too");
  assert.equal(syncs, 2, "each refusal starts a registry sync");
});

test("mailbox reader - a Redis that does not answer is UNAVAILABLE (4503 to a session), a wrong reply stays an error; the reads work again once it answers", async () => {
  // a wrong type under the user's hot cache key: a reply error that is a bug, not an outage
  const odd = "oddtype";
  await redis.set(keys.hotCache(odd), "not a stream");
  const oddShard = stack.registry.shards.shardOf(odd)!;
  await assert.rejects(reader.read(oddShard, odd, 0n).next(), (err: Error) => {
    assert.ok(!(err instanceof UnavailableError), `${err.name}: ${err.message}`);
    assert.match(err.message, /WRONGTYPE/);
    return true;
  });
  // Redis paused past the reader's command timeout: no answer
  const slow = await redisClient(stack.infra.redis.url, { commandTimeout: 300 });
  const paused = new MailboxReader(stack.nc, slow, keys, stack.registry, ["default"]);
  await redis.call("CLIENT", "PAUSE", "2000", "ALL");
  await assert.rejects(paused.read(shard, user, 0n).next(), (err: Error) => {
    assert.ok(err instanceof UnavailableError, `${err.name}: ${err.message}`);
    assert.match(err.message, /^Redis did not answer \(Command timed out\); reconnect$/);
    return true;
  });
  await assert.rejects(paused.watermarks(shard, user), UnavailableError);
  await waitFor("Redis answering again", async () => (await paused.watermarks(shard, user).catch(() => undefined))?.head !== undefined, { timeoutMs: 10_000 });
  assert.ok((await paused.watermarks(shard, user)).head > 0n);
  slow.disconnect();
});
