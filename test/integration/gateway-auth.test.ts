import { test, after } from "node:test";
import assert from "node:assert/strict";
import { jetstream, jetstreamManager, type JsMsg } from "@nats-io/jetstream";
import { RedisKeys, bigintsAsStrings, bumpEpoch, composeSeq, halfRange, seqOffset, shardStream, splitShard, userHash, WATERMARK_ALL, type CursorToken, type DeviceCursor, type Entry, type MailboxSeq, type ServerFrame } from "../../protocol/index.js";
import { loadConfig, newLogId, shardStreamConfig } from "../../protocol/io/index.js";
import { redisClient, startStack, spawnGateway, spawnWorker } from "../harness/stack.js";
import { TestDevice, deviceToken } from "../harness/device.js";
import { waitFor } from "../harness/wait.js";

const stack = await startStack({ env: { JETGATE_LEASE_MS: "1000", JETGATE_AUTH_TIMEOUT_MS: "600" }, gateway: {} });
after(() => stack.dispose());
const { infra, nc, registry, dispatcher } = stack;
const gateway = stack.gateway!;
const config = loadConfig(infra.env);
const js = jetstream(nc);
const jsm = await jetstreamManager(nc);
const keys = new RedisKeys(config.JETGATE_REDIS_PREFIX);
const redis = await redisClient(infra.redis.url);
after(() => redis.disconnect());

/** Users by shard: alice is on shard 0; `moved` is a shard-1 user in the upper half (moved by the split). */
const usersOf = (pred: (h: number) => boolean) => Array.from({ length: 400 }, (_, i) => `user${i}`).filter((u) => pred(userHash(u)));
const shard1 = registry.state.shards.get(1)!.range;
const moved = usersOf((h) => h >= halfRange(shard1, true).lo && h <= shard1.hi)[0]!;
const neighbour = usersOf((h) => h >= halfRange(shard1, false).lo && h <= halfRange(shard1, false).hi)[0]!;

let n = 0;
async function send(user: string, count: number): Promise<string[]> {
  const ids: string[] = [];
  for (let i = 0; i < count; i++) {
    const id = `${user}-m${n++}`;
    const [r] = await dispatcher.dispatch({ dispatch_id: id, message_id: id, lane: "default", recipients: [user], body: new TextEncoder().encode(id) });
    assert.ok(r && !("error" in r), JSON.stringify(r, bigintsAsStrings));
    ids.push(id);
  }
  return ids;
}

interface Synced {
  dev: TestDevice;
  errors: Extract<ServerFrame, { t: "ERROR" }>[];
  ok: Extract<ServerFrame, { t: "AUTH_OK" }>;
  entries: Entry[];
  cursor: DeviceCursor;
}

/** AUTH (with a cursor, maybe) and wait for SYNCED, or until `expect` more entries arrived. */
async function session(user: string, cursor?: DeviceCursor, expect = 0, timeoutMs = 10_000): Promise<Synced> {
  const dev = await TestDevice.connect(gateway.httpPort);
  dev.send({ t: "AUTH", v: 1, token: await deviceToken(user), device: "phone", ...(cursor ? { cursor } : {}) });
  await dev.next("SYNCED");
  await waitFor(`${expect} entries`, () => dev.entries().length >= expect, { timeoutMs });
  const ok = await dev.next("AUTH_OK");
  const entries = dev.entries();
  return { dev, ok, entries, errors: dev.frames.filter((f): f is Extract<ServerFrame, { t: "ERROR" }> => f.t === "ERROR"), cursor: cursorOf(dev) };
}

/** What a device keeps: the newest token (AUTH_OK, or a later CURSOR_REBASED) and its last seq. */
function cursorOf(dev: TestDevice): DeviceCursor {
  let token: CursorToken | undefined;
  let seq = 0n;
  for (const f of dev.frames) {
    if (f.t === "AUTH_OK") {
      token = f.cursor;
      seq = f.from > seq ? f.from : seq;
    } else if (f.t === "ERROR" && f.new_cursor) {
      token = f.new_cursor;
      if (f.replay_from_seq !== undefined && f.replay_from_seq > seq) seq = f.replay_from_seq;
    } else if (f.t === "MSGS" && f.id === undefined) {
      for (const e of f.e) if (e.seq > seq) seq = e.seq;
    }
  }
  return { ...token!, seq };
}

function assertIncreasing(entries: Entry[], above: MailboxSeq = 0n): void {
  let last = above;
  for (const e of entries) {
    assert.ok(e.seq > last, `seq ${e.seq} after ${last}`);
    last = e.seq;
  }
}
const ids = (es: Entry[]) => es.map((e) => e.id);

let alice: DeviceCursor;
let aliceIds: string[] = [];

test("gateway auth - fresh device: AUTH_OK from 0, the whole mailbox, SYNCED, then live", async () => {
  aliceIds = await send("alice", 5);
  const s = await session("alice", undefined, 5);
  assert.equal(s.errors.length, 0);
  assert.equal(s.ok.from, 0n);
  assert.equal(s.ok.user, "alice");
  assert.equal(s.ok.shard, registry.shards.shardOf("alice"));
  assert.equal(s.ok.head, s.entries.at(-1)!.seq);
  assert.deepEqual(ids(s.entries), aliceIds);
  assertIncreasing(s.entries);
  const live = await send("alice", 2);
  await waitFor("live entries", () => s.dev.entries().length === 7);
  assert.deepEqual(ids(s.dev.entries()), [...aliceIds, ...live]);
  aliceIds.push(...live);
  assertIncreasing(s.dev.entries());
  alice = cursorOf(s.dev);
  s.dev.close();
});

test("gateway auth - same epoch: catch-up strictly after the cursor, no ERROR frame", async () => {
  const more = await send("alice", 3);
  const s = await session("alice", alice, 3);
  assert.equal(s.errors.length, 0);
  assert.equal(s.ok.from, alice.seq);
  assert.deepEqual(ids(s.entries), more);
  assertIncreasing(s.entries, alice.seq);
  aliceIds.push(...more);
  alice = s.cursor;
  s.dev.close();
});

test("gateway auth - a cursor with a bad signature: CURSOR_INVALID, then a fresh start", async () => {
  const sig = new Uint8Array(alice.sig);
  sig[0]! ^= 0xff;
  const s = await session("alice", { ...alice, sig }, aliceIds.length);
  assert.equal(s.errors[0]?.code, "CURSOR_INVALID");
  assert.equal(s.errors[0]?.fatal, false);
  assert.equal(s.ok.from, 0n);
  assert.deepEqual(ids(s.entries), aliceIds);
  s.dev.close();
  // a cursor signed for another user is no better
  const bob = await session(neighbour, alice, 0);
  assert.equal(bob.errors[0]?.code, "CURSOR_INVALID");
  bob.dev.close();
});

test("gateway auth - an expired JWT: UNAUTHORIZED and close 4401", async () => {
  const dev = await TestDevice.connect(gateway.httpPort);
  dev.send({ t: "AUTH", v: 1, token: await deviceToken("alice", { expiresInS: -60 }), device: "phone" });
  const err = await dev.next("ERROR");
  assert.equal(err.code, "UNAUTHORIZED");
  assert.equal(err.fatal, true);
  assert.match(err.msg, /exp/);
  assert.equal((await dev.waitClosed()).code, 4401);
  const wrong = await TestDevice.connect(gateway.httpPort);
  wrong.send({ t: "AUTH", v: 1, token: await deviceToken("alice", { secret: "not-the-gateway-secret" }), device: "phone" });
  assert.equal((await wrong.waitClosed()).code, 4401);
});

test("gateway auth - no AUTH within the timeout: close 4401; traffic does not extend it", async () => {
  const dev = await TestDevice.connect(gateway.httpPort);
  const started = Date.now();
  // WebSocket pings every 100 ms (the only traffic allowed before AUTH) past the 600 ms timeout
  const pings = setInterval(() => dev.ws.ping(), 100);
  try {
    const closed = await dev.waitClosed(5000);
    assert.deepEqual(closed, { code: 4401, reason: "auth timeout" });
    assert.ok(Date.now() - started >= 500, `closed after ${Date.now() - started} ms`);
  } finally {
    clearInterval(pings);
  }
});

test("gateway auth - epoch bumped in the same log (E1 takeover): rebased, no duplicates, no gap", async () => {
  const before = registry.state.shards.get(alice.shard)!.epoch;
  await stack.worker!.kill("SIGKILL");
  stack.worker = await spawnWorker(infra.env);
  await waitFor("takeover", () => registry.state.shards.get(alice.shard)!.epoch > before, { timeoutMs: 15_000 });
  const more = await send("alice", 3);
  const s = await session("alice", alice, 3);
  assert.equal(s.errors[0]?.code, "CURSOR_REBASED");
  assert.equal(s.errors[0]?.fatal, false);
  assert.ok(s.errors[0]!.replay_from_seq! >= alice.seq, "never below the cursor");
  assert.equal(s.ok.epoch, registry.state.shards.get(alice.shard)!.epoch);
  assert.equal(s.ok.cursor.epoch, s.ok.epoch);
  assert.deepEqual(ids(s.entries), more, "exactly the new entries: no duplicates, no gap");
  assertIncreasing(s.entries, s.errors[0]!.replay_from_seq!);
  aliceIds.push(...more);
  alice = s.cursor;
  s.dev.close();
});

async function readAll(stream: string): Promise<JsMsg[]> {
  const last = (await jsm.streams.info(stream)).state.last_seq;
  const c = await js.consumers.get(stream);
  const out: JsMsg[] = [];
  for await (const m of await c.fetch({ max_messages: last })) {
    out.push(m);
    if (m.seq >= last) break;
  }
  return out;
}

test("gateway auth - stream recreated (E3): the new log is replayed from its start; duplicates only of re-appended entries", async () => {
  const shard = alice.shard;
  const old = await readAll(shardStream(shard));
  const log = newLogId();
  // registry first, then the stream work (the order `jetgate shard rebuild` follows)
  await registry.update((st) => ({
    v: 1, op: "rebuild", at: Date.now(), by: "test",
    shards: [bumpEpoch(st.shards.get(shard)!, { cause: "rebuild", log, start_offset: 1, prev_end_offset: old.at(-1)!.seq })],
  }));
  await jsm.streams.delete(shardStream(shard));
  await jsm.streams.add(shardStreamConfig(shard, log, config));
  for (const m of old) await js.publish(m.subject, m.data, { msgID: m.headers!.get("Nats-Msg-Id") });
  const reappended = new Set(old.filter((m) => m.subject.includes(".alice.")).map((m) => new TextDecoder().decode(m.data).match(/alice-m\d+/)![0]));
  const fresh = await send("alice", 2);
  const s = await session("alice", alice, reappended.size + 2);
  assert.equal(s.errors[0]?.code, "CURSOR_REBASED");
  assert.equal(s.ok.cursor.log, log);
  const got = ids(s.entries);
  assertIncreasing(s.entries, alice.seq);
  for (const id of fresh) assert.ok(got.includes(id), `new entry ${id} delivered`);
  const repeats = got.filter((id) => aliceIds.includes(id));
  assert.ok(repeats.every((id) => reappended.has(id)), "every repeat is a re-appended entry");
  assert.deepEqual(new Set(got), new Set([...reappended, ...fresh]));
  aliceIds.push(...fresh);
  alice = s.cursor;
  s.dev.close();
});

test("gateway auth - a user moved by a split: old range first, then the new shard, then a new cursor", async () => {
  await send(moved, 3);
  const s1 = await session(moved, undefined, 3);
  const cursor: DeviceCursor = s1.cursor;
  s1.dev.close();
  const tail = await send(moved, 2); // still the parent's: after the device's cursor, before the cut
  const cut = (await jsm.streams.info(shardStream(1))).state.last_seq;
  const childLog = newLogId();
  await registry.update((st) => {
    const [p, c] = splitShard(st.shards.get(1)!, { child: 2, childLog, moved: halfRange(st.shards.get(1)!.range, true), cutOffset: cut });
    return { v: 1, op: "split", at: Date.now(), by: "test", shards: [p, c] };
  });
  await jsm.streams.add(shardStreamConfig(2, childLog, config));
  assert.equal(registry.shards.shardOf(moved), 2);
  await waitFor("a worker runs the child shard", async () => (await stack.worker!.metric("jetgate_worker_lease_held", { shard: "2" })) === 1, { timeoutMs: 15_000 });
  const after = await send(moved, 2);
  // the child pushes once its parent has processed up to the cut (a takeover of the parent first)
  const s = await session(moved, cursor, 4, 30_000);
  const rebased = s.errors[0]!;
  assert.equal(rebased.code, "CURSOR_REBASED");
  assert.deepEqual(rebased.old_range && { shard: rebased.old_range.shard, after: rebased.old_range.after }, { shard: 1, after: cursor.seq });
  assert.equal(s.ok.shard, 2);
  assert.equal(s.ok.cursor.shard, 2);
  assert.deepEqual(ids(s.entries), [...tail, ...after], "old range, then the child's entries");
  assertIncreasing(s.entries, cursor.seq);
  const msgs = s.dev.frames.filter((f) => f.t === "MSGS");
  assert.equal(msgs[0]!.t === "MSGS" && msgs[0]!.shard, 1, "the old range comes from the parent");
  assert.equal(msgs.at(-1)!.t === "MSGS" && msgs.at(-1)!.shard, 2);
  // PULL after a seq of the parent, on the child's session, from the stream: the parent's rest and
  // the child's entries (the stream reader used to start at the parent seq's offset bits in the
  // child's log, past everything the child holds, and answered an empty page)
  const lastParent = s.entries[tail.length - 1]!.seq;
  const pull = async (id: number, after: MailboxSeq) => {
    s.dev.send({ t: "PULL", id, after, limit: 10 });
    return waitFor(`PULL ${id}`, () => s.dev.frames.find((f): f is Extract<ServerFrame, { t: "MSGS" }> => f.t === "MSGS" && f.id === id));
  };
  assert.deepEqual(ids((await pull(77, lastParent)).e), after, "the child's entries after the parent's last");
  assert.deepEqual(ids((await pull(78, cursor.seq)).e), [...tail, ...after], "the parent's rest, then the child");
  s.dev.close();
  // the neighbour stayed on the parent: a plain rebase, no old range
  const nb = await session(neighbour, undefined, 0);
  assert.equal(nb.ok.shard, 1);
  nb.dev.close();
});

test("gateway auth - retention passed the cursor (max_bytes): CURSOR_EXPIRED, rebuild, continue from the head", async () => {
  const shard = alice.shard;
  const info = await jsm.streams.info(shardStream(shard));
  await jsm.streams.update(shardStream(shard), { ...info.config, max_bytes: 4000 });
  const others = usersOf((h) => registry.shards.shardOfHash(h) === shard).filter((u) => u !== "alice").slice(0, 5);
  for (const u of others) await send(u, 12); // pushes alice's entries out of the stream
  const head = await send("alice", 1);
  const { first_seq: first, last_seq: headOffset } = (await jsm.streams.info(shardStream(shard))).state;
  assert.ok(first > 5, `retention removed old entries (first_seq ${first})`);
  // the head (the stream's last entry) is in alice's watermarks before the session starts: it is
  // below where the session continues, never a live entry of it
  await waitFor(`the worker applied alice's head (offset ${headOffset})`, async () => {
    const all = await redis.hget(keys.watermarks("alice"), WATERMARK_ALL);
    return all !== null && seqOffset(BigInt(all)) >= BigInt(headOffset);
  });
  const s = await session("alice", alice, 0);
  const err = s.errors[0]!;
  assert.equal(err.code, "CURSOR_EXPIRED");
  assert.equal(err.rebuild_required, true);
  assert.ok(err.trim_watermark! > alice.seq);
  assert.ok(err.new_cursor);
  assert.ok(s.ok.from >= err.trim_watermark!, "continues from the head");
  const live = await send("alice", 1);
  await waitFor("live after expiry", () => ids(s.dev.entries()).includes(live[0]!));
  assert.ok(!ids(s.dev.entries()).includes(head[0]!), "nothing at or below the head is replayed after a rebuild");
  s.dev.close();
});

test("gateway auth - a split that lands while an AUTH is deciding: the session moves to the child right after", async () => {
  // this gateway's AUTH waits 1.5 s between taking its registry view and its reads
  const slow = await spawnGateway(infra.env, { JETGATE_FAULT_AUTH_PAUSE_MS: "1500" });
  try {
    const range = registry.state.shards.get(0)!.range;
    const user = Array.from({ length: 400 }, (_, i) => `late${i}`).find((u) => userHash(u) >= halfRange(range, true).lo && userHash(u) <= range.hi)!;
    const before = await send(user, 2);
    const dev = await TestDevice.connect(slow.httpPort);
    dev.send({ t: "AUTH", v: 1, token: await deviceToken(user), device: "tablet" });
    // the session's presence claim is the step before the gateway takes its view and pauses
    await waitFor("the AUTH's presence claim (the gateway then holds the pre-split view)", async () => (await redis.exists(keys.presence(user, "tablet"))) === 1);
    const cut = (await jsm.streams.info(shardStream(0))).state.last_seq;
    const childLog = newLogId();
    await jsm.streams.add(shardStreamConfig(3, childLog, config));
    await registry.update((st) => {
      const [p, c] = splitShard(st.shards.get(0)!, { child: 3, childLog, moved: halfRange(st.shards.get(0)!.range, true), cutOffset: cut });
      return { v: 1, op: "split", at: Date.now(), by: "test", shards: [p, c] };
    });
    assert.equal(registry.shards.shardOf(user), 3);
    const ok = await dev.next("AUTH_OK", 10_000);
    assert.equal(ok.shard, 0, "the decision was made on the pre-split view");
    await waitFor("a worker runs the child shard", async () => (await stack.worker!.metric("jetgate_worker_lease_held", { shard: "3" })) === 1, { timeoutMs: 15_000 });
    const rebased = await waitFor("a mid-session CURSOR_REBASED to the child", () =>
      dev.frames.find((f): f is Extract<ServerFrame, { t: "ERROR" }> => f.t === "ERROR" && f.new_cursor?.shard === 3), { timeoutMs: 10_000 });
    assert.equal(rebased.code, "CURSOR_REBASED");
    const later = await send(user, 2);
    await waitFor("the child's entries reach the session", () => later.every((id) => ids(dev.entries()).includes(id)), { timeoutMs: 10_000 });
    assert.deepEqual(ids(dev.entries()), [...before, ...later]);
    assertIncreasing(dev.entries());
    dev.close();
  } finally {
    await slow.kill();
  }
});

test("gateway auth - a cursor newer than the gateway's registry view while the registry cannot be read: UNAVAILABLE and 4503, retry later (never CURSOR_INVALID)", async () => {
  const shard = registry.state.shards.get(alice.shard)!;
  const ahead: DeviceCursor = { ...alice, seq: composeSeq(shard.epoch + 3, 1) };
  const dev = await TestDevice.connect(gateway.httpPort);
  infra.nats.pause();
  try {
    dev.send({ t: "AUTH", v: 1, token: await deviceToken("alice"), device: "phone", cursor: ahead });
    const err = await dev.next("ERROR", 20_000);
    assert.deepEqual([err.code, err.fatal, err.msg, err.retry_ms], ["UNAVAILABLE", true, "registry unavailable: reconnect later", 2000]);
    assert.equal((await dev.waitClosed()).code, 4503);
    assert.ok(!dev.frames.some((f) => f.t === "AUTH_OK"), "no decision on a view known to be behind");
  } finally {
    infra.nats.resume();
  }
});
