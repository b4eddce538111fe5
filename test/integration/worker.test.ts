import { test, after } from "node:test";
import assert from "node:assert/strict";
import { headers } from "@nats-io/transport-node";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { RedisKeys, composeSeq, encodeStoredEntry, entrySubject, halfRange, shardStream, splitShard, userHash, decodeCacheRecord, seqKey, parseCacheRow, cacheStreamId, WATERMARK_ALL, seqOffset, type Push } from "../../protocol/index.js";
import { loadConfig, newLogId, shardStreamConfig } from "../../protocol/io/index.js";
import { applyBatch } from "../../worker/mailbox-script.js";
import { MailboxReader } from "../../gateway/mailbox/reader.js";
import { startStack, PushCollector, redisClient, DispatchLoad } from "../harness/stack.js";
import { sleep, waitFor } from "../harness/wait.js";

// A 1 s JetStream duplicate window, so a test can append the same dispatch twice outside it.
const stack = await startStack({ env: { JETGATE_LEASE_MS: "1000", JETGATE_DUPLICATE_WINDOW_S: "1" }, lanes: ["default", "chat"] });
const pushes = await PushCollector.start(stack.infra.nats.url, stack.infra.redis.url);
after(async () => {
  await pushes.close();
  await stack.dispose();
});
const { infra, registry, dispatcher } = stack;
const worker = stack.worker!;

/** Dispatches one entry; the collector is in the user's routes first, as a gateway with a session of the user would be. */
const one = async (user: string, id: string, lane = "default") => {
  await pushes.watch(user);
  return dispatcher.dispatch({ dispatch_id: id, message_id: id, lane, recipients: [user], body: new TextEncoder().encode(id) });
};
const pushesOf = (user: string) => pushes.pushes.filter((p) => p.user === user).map((p) => p.push);

test("worker - pushes each entry with its composite seq and the lane's prev", async () => {
  await one("walt", "w1");
  await one("walt", "w2", "chat");
  await one("walt", "w3");
  const got = await waitFor("three pushes for walt", () => (pushesOf("walt").length === 3 ? pushesOf("walt") : undefined));
  const [a, b, c] = got.map((p) => p.entry) as [Push["entry"], Push["entry"], Push["entry"]];
  const shard = registry.shards.shardOf("walt")!;
  const epoch = registry.state.shards.get(shard)!.epoch;
  assert.deepEqual(got.map((p) => [p.shard, p.epoch]), [[shard, epoch], [shard, epoch], [shard, epoch]]);
  assert.ok(a.seq >= composeSeq(epoch, 1) && b.seq > a.seq && c.seq > b.seq);
  assert.equal(a.prev, null, "first entry of the lane: the worker cannot know a prev");
  assert.equal(b.prev, null, "first of lane chat");
  assert.equal(c.prev, a.seq, "prev is the previous seq in the same lane");
  assert.deepEqual(got.map((p) => p.prevAll), [null, a.seq, b.seq], "pa is the previous seq over all lanes");
  assert.equal(new TextDecoder().decode(c.b), "w3");
  const r = await redisClient(infra.redis.url);
  try {
    const keys = new RedisKeys("jg");
    assert.equal(await r.hget(keys.watermarks("walt"), "default"), seqKey(c.seq));
    assert.equal(await r.hget(keys.watermarks("walt"), WATERMARK_ALL), seqKey(c.seq));
    const cache = await r.xrangeBuffer(keys.hotCache("walt"), "-", "+");
    assert.deepEqual(cache.map(([id]) => id.toString()), got.map((p) => cacheStreamId(p.entry.seq)));
    assert.ok(got.every((p) => cacheStreamId(p.entry.seq) === `${epoch}-${seqOffset(p.entry.seq)}`));
    const rows = cache.map(([, f]) => parseCacheRow(f)!);
    const fromCache = rows.map((row) => decodeCacheRecord(row.seq, row.prev, row.lane, row.entry));
    assert.deepEqual(fromCache.map((e) => ({ ...e, b: [...e.b] })), got.map((p) => ({ ...p.entry, b: [...p.entry.b] })), "the cache holds exactly what was pushed");
    assert.deepEqual(rows.map((row) => row.shard), [String(shard), String(shard), String(shard)], "each row names its shard");
  } finally {
    r.disconnect();
  }
});

test("worker - the same dispatch appended twice outside the JetStream window: one push, one duplicate counted", async () => {
  const dupsBefore = await worker.metric("jetgate_worker_duplicates_total");
  const first = await one("dora", "dup1");
  await sleep(1500); // past the 1 s duplicate window
  const second = await one("dora", "dup1");
  const [a, b] = [first[0]!, second[0]!];
  assert.ok("seq" in a && "seq" in b && a.duplicate === false && b.duplicate === false && b.seq > a.seq, "two offsets");
  await waitFor("duplicate counted", async () => (await worker.metric("jetgate_worker_duplicates_total")) === dupsBefore + 1);
  await one("dora", "after"); // anything pushed after the duplicate proves the duplicate was passed over
  await waitFor("entry after the duplicate pushed", () => pushesOf("dora").some((p) => p.entry.id === "after"));
  assert.deepEqual(pushesOf("dora").map((p) => p.entry.id), ["dup1", "after"]);
  // the duplicate copy is still a mailbox position: the next push's pa points at it
  const [, after] = pushesOf("dora");
  assert.ok(after!.prevAll! > pushesOf("dora")[0]!.entry.seq, "pa of the next entry is the duplicate copy's seq");
  const r = await redisClient(infra.redis.url);
  assert.equal(await r.xlen(new RedisKeys("jg").hotCache("dora")), 3, "both copies and the next entry are in the hot cache");
  r.disconnect();
});

test("worker - the watermark script never lowers a watermark under concurrent updates from two clients", async () => {
  const [r1, r2] = [await redisClient(infra.redis.url), await redisClient(infra.redis.url)];
  const keys = new RedisKeys("wmtest");
  try {
    const seqs = Array.from({ length: 400 }, (_, i) => composeSeq(1 + (i % 3), 1 + Math.floor(Math.random() * 1e9)));
    const shared = { shard: 0, log: "l", dedupTtlS: 60, hotCacheMaxLen: 0, hotCacheTtlS: 60, watermarkTtlS: 60 };
    // batches of one and of several entries of the user, interleaved from two clients
    const call = (r: typeof r1, seq: bigint, i: number) =>
      applyBatch(r, keys, shared, [{ user: "u", dispatch: `d${i}`, lane: "x", offset: i, seq, body: new Uint8Array(1) }]).then(([x]) => x!);
    let observedMax = 0n;
    const watcher = (async () => {
      for (let i = 0; i < 200; i++) {
        const v = await r1.hget(keys.watermarks("u"), "x");
        if (v !== null) {
          assert.ok(BigInt(v) >= observedMax, "watermark went down");
          observedMax = BigInt(v);
        }
      }
    })();
    const results = await Promise.all(seqs.map((s, i) => call(i % 2 === 0 ? r1 : r2, s, i)));
    await watcher;
    const max = seqs.reduce((m, s) => (s > m ? s : m), 0n);
    assert.equal(await r1.hget(keys.watermarks("u"), "x"), seqKey(max));
    for (const r of results) assert.equal(r.first, true);
  } finally {
    r1.disconnect();
    r2.disconnect();
  }
});

test("worker - a batch script run again (its batch retried after another Redis node failed) answers 'routes unknown' again for the entry that found them unknown", async () => {
  const r = await redisClient(infra.redis.url);
  const keys = new RedisKeys("rbtest");
  try {
    const shared = { shard: 0, log: "l", dedupTtlS: 60, hotCacheMaxLen: 0, hotCacheTtlS: 60, watermarkTtlS: 60 };
    const e = (user: string, offset: number) => ({ user, dispatch: `d${offset}`, lane: "x", offset, seq: composeSeq(1, offset), body: new Uint8Array(1) });
    // two users' hashes gone (a node restarted empty): each one's first entry goes to every gateway
    const batch = [e("ua", 1), e("ub", 2), e("ua", 3)];
    const first = await applyBatch(r, keys, shared, batch);
    assert.deepEqual(first.map((x) => x.routes), [undefined, undefined, []], "unknown for each user's first entry, then known: nobody");
    // the worker saw the batch fail elsewhere and runs it again: its broadcasts never left, so they go now
    const again = await applyBatch(r, keys, shared, batch);
    assert.deepEqual(again.map((x) => x.routes), [undefined, undefined, []]);
    assert.deepEqual(again.map((x) => x.first), [true, true, true], "the same first copies");
    // a later entry: known
    const later = await applyBatch(r, keys, shared, [e("ua", 4)]);
    assert.deepEqual(later[0]!.routes, []);
  } finally {
    r.disconnect();
  }
});

test("worker - a gap the sessions of one user fill at once is read once, and the answer shared", async () => {
  const user = "gapshare";
  for (const id of ["gs1", "gs2", "gs3"]) await one(user, id);
  await waitFor("all three pushed", () => pushesOf(user).length === 3);
  const last = pushesOf(user).at(-1)!.entry.seq;
  const redis = await redisClient(infra.redis.url);
  const reader = new MailboxReader(stack.nc, redis, new RedisKeys("jg"), registry, ["default", "chat"]);
  try {
    const shard = registry.shards.shardOf(user)!;
    // fifty sessions of the user find the same gap below the third entry in the same turn
    const answers = await Promise.all(Array.from({ length: 50 }, () => reader.fill(shard, user, 0n, last)));
    assert.ok(Array.isArray(answers[0]));
    assert.deepEqual((answers[0] as { id: string }[]).map((e) => e.id), ["gs1", "gs2"]);
    assert.ok(answers.every((a) => a === answers[0]), "one read, its answer shared");
    const later = await reader.fill(shard, user, 0n, last);
    assert.notEqual(later, answers[0], "a fill after the first settled reads again");
    assert.deepEqual(later, answers[0]);
  } finally {
    redis.disconnect();
  }
});

test("worker - Redis FLUSHALL while it runs: it keeps going, no push is lost, caches refill", async () => {
  const epochsBefore = [...registry.state.shards.values()].map((s) => s.epoch);
  const users = ["f1", "f2", "f3", "f4", "f5"];
  await pushes.watch(...users);
  const processedBefore = await worker.metric("jetgate_worker_entries_processed_total");
  const load = new DispatchLoad(dispatcher, users, { perTick: 10, everyMs: 20, prefix: "F" });
  await sleep(700);
  const r = await redisClient(infra.redis.url);
  await r.flushall();
  await sleep(700);
  await load.stop();
  const ids = load.allIds();
  assert.equal(load.failed.length, 0);
  // delivery through the flush (routes lost with it) is routing.test.ts's: a gateway reads what it missed
  await waitFor("every dispatched entry processed", async () => (await worker.metric("jetgate_worker_entries_processed_total")) - processedBefore >= ids.length);
  const keys = new RedisKeys("jg");
  // every row now in the hot caches was written after the flush; the first of each user knew no prev
  let unknownPrev = 0;
  for (const u of users) for (const [, f] of await r.xrangeBuffer(keys.hotCache(u), "-", "+")) if (parseCacheRow(f)?.prev === "") unknownPrev++;
  assert.ok(unknownPrev >= 1, "a prev lost with the flush is written (and pushed) as unknown");
  assert.ok((await worker.metric("jetgate_worker_broadcast_pushes_total")) >= users.length, "routes lost with the flush: each user's next entry went to every gateway");
  for (const u of users) {
    assert.ok((await r.hget(keys.watermarks(u), "default")) !== null, `watermark of ${u} refilled`);
    assert.ok((await r.xlen(keys.hotCache(u))) > 0, `hot cache of ${u} refilled`);
    // made again after the flush, each with an expiry (XADD NOMKSTREAM noticed the cache gone)
    assert.ok((await r.ttl(keys.hotCache(u))) > 0, `hot cache of ${u} expires`);
    assert.ok((await r.ttl(keys.watermarks(u))) > 0, `watermarks of ${u} expire`);
  }
  await waitFor("lease taken again", async () => (await r.exists(keys.lease(0))) === 1 && (await r.exists(keys.lease(1))) === 1);
  assert.deepEqual([...registry.state.shards.values()].map((s) => s.epoch), epochsBefore, "no takeover: the worker kept its shards");
  r.disconnect();
});

test("worker - after a split, an entry published to the parent for a moved user is forwarded to the child, same Nats-Msg-Id", async () => {
  const jsm = await jetstreamManager(stack.nc);
  const parent = registry.state.shards.get(1)!;
  const upper = halfRange(parent.range, true);
  const moved = Array.from({ length: 400 }, (_, i) => `mv${i}`).find((u) => userHash(u) >= upper.lo && userHash(u) <= upper.hi)!;
  const cut = (await jsm.streams.info(shardStream(1))).state.last_seq;
  const childLog = newLogId();
  await registry.update((st) => {
    const [p, c] = splitShard(st.shards.get(1)!, { child: 2, childLog, moved: upper, cutOffset: cut });
    return { v: 1, op: "split", at: Date.now(), by: "test", shards: [p, c] };
  });
  await jsm.streams.add(shardStreamConfig(2, childLog, loadConfig(infra.env)));
  await waitFor("the worker runs parent and child", async () =>
    (await worker.metric("jetgate_worker_lease_held", { shard: "1" })) === 1 && (await worker.metric("jetgate_worker_lease_held", { shard: "2" })) === 1 &&
    registry.state.shards.get(1)!.epoch > parent.epoch, { timeoutMs: 15_000 });
  // a producer that has not seen the split yet publishes to the parent
  await pushes.watch(moved);
  const h = headers();
  h.set("Nats-Msg-Id", `fwd1:${moved}`);
  await jetstream(stack.nc).publish(entrySubject(1, moved, "default"), encodeStoredEntry({ id: "fwd1", d: "fwd1", ts: Date.now(), b: new Uint8Array(1) }), { headers: h });
  const p = await waitFor("the forwarded entry pushed by the child", () => pushes.pushes.find((x) => x.push.entry.id === "fwd1"), { timeoutMs: 15_000 });
  assert.equal(p.user, moved);
  assert.equal(p.push.shard, 2, "pushed by the child, not the parent");
  assert.ok((await worker.metric("jetgate_worker_forwarded_total", { shard: "1" })) >= 1);
  const copy = await jsm.streams.getMessage(shardStream(2), { last_by_subj: entrySubject(2, moved, "default") });
  assert.equal(copy?.header.get("Nats-Msg-Id"), `fwd1:${moved}`, "the same Nats-Msg-Id, so a repeated forward is deduplicated");
});

test("worker - health, readiness and metrics endpoints", async () => {
  assert.deepEqual(await worker.http("/healthz"), { status: 200, text: "ok\n" });
  const ready = await worker.http("/readyz");
  assert.equal(ready.status, 200);
  assert.deepEqual(JSON.parse(ready.text), { ready: true, problems: [] });
  const { text } = await worker.http("/metrics");
  for (const name of [
    "jetgate_mailbox_seq_regression_total{component=\"worker\"} 0", "jetgate_worker_entries_processed_total",
    "jetgate_worker_duplicates_total", "jetgate_worker_forwarded_total", "jetgate_worker_lag_entries", "jetgate_shard_epoch",
    "jetgate_shard_log_offset", "jetgate_worker_lease_held", "jetgate_worker_batches_total", "jetgate_worker_push_messages_total", "jetgate_worker_redis_writable 1",
  ]) assert.ok(text.includes(name), name);
  // what batching cuts, countable: entries per batch and per push message (routed: at most one message per gateway per batch)
  const batches = await worker.metric("jetgate_worker_batches_total");
  assert.ok(batches >= 1 && batches <= (await worker.metric("jetgate_worker_entries_processed_total")), `batches ${batches}`);
  const messages = await worker.metric("jetgate_worker_push_messages_total");
  assert.ok(messages >= 1 && messages < (await worker.metric("jetgate_worker_entries_pushed_total")), `push messages ${messages}: fewer than the entries pushed`);
  for (const name of ["jetgate_worker_broadcast_pushes_total", "jetgate_worker_unrouted_entries_total", "jetgate_worker_silent_routes_total"]) assert.ok(text.includes(name), name);
  const head = (await registry.sync()).seq;
  await waitFor("the worker reports the registry record it applied", async () => (await worker.metric("jetgate_worker_registry_record")) === head);
  assert.equal((await worker.http("/nope")).status, 404);
});
