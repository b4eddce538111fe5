import { test, after } from "node:test";
import assert from "node:assert/strict";
import { jetstreamManager } from "@nats-io/jetstream";
import type { Redis } from "ioredis";
import { RedisKeys, seqKey, type Entry } from "../../protocol/index.js";
import { loadConfig } from "../../protocol/io/index.js";
import { startStack, spawnGateway, redisClient } from "../harness/stack.js";
import { TestDevice, deviceToken } from "../harness/device.js";
import { sleep, waitFor } from "../harness/wait.js";

const stack = await startStack({
  env: { JETGATE_LEASE_MS: "1000", JETGATE_SERVICE_TOKEN: "svc-secret", JETGATE_LANES: "default,chat" },
  lanes: ["default", "chat"],
  dispatcher: { maxInFlight: 20_000 },
  worker: { JETGATE_WORKER_BATCH: "1000" },
  gateway: {},
});
after(() => stack.dispose());
const { infra, nc, dispatcher } = stack;
const worker = stack.worker!;
const gateway = stack.gateway!;
const keys = new RedisKeys(loadConfig(infra.env).JETGATE_REDIS_PREFIX);

async function live(port: number, user: string, device = "d1", lanes?: string[]): Promise<TestDevice> {
  const dev = await TestDevice.connect(port);
  dev.send({ t: "AUTH", v: 1, token: await deviceToken(user), device, ...(lanes ? { lanes } : {}) });
  await dev.next("SYNCED", 60_000);
  return dev;
}

function assertStrictlyIncreasing(entries: Entry[]): void {
  for (let i = 1; i < entries.length; i++) assert.ok(entries[i]!.seq > entries[i - 1]!.seq, `entry ${i}: ${entries[i - 1]!.seq} -> ${entries[i]!.seq}`);
}

test("gateway live - catch-up of 20,000 entries while dispatches continue: every entry once, seqs strictly increasing", async () => {
  const user = "heavy";
  const backlog: string[] = [];
  const inFlight: Promise<unknown>[] = [];
  for (let i = 0; i < 20_000; i++) {
    const id = `h${i}`;
    backlog.push(id);
    inFlight.push(dispatcher.dispatch({ dispatch_id: id, message_id: id, lane: i % 3 === 0 ? "chat" : "default", recipients: [user], body: new Uint8Array(64) }));
  }
  await Promise.all(inFlight);
  await waitFor("the worker processed the backlog", async () => (await worker.metric("jetgate_worker_entries_pushed_total")) >= 20_000, { timeoutMs: 60_000 });
  const dev = await TestDevice.connect(gateway.httpPort);
  dev.send({ t: "AUTH", v: 1, token: await deviceToken(user), device: "d1" });
  // dispatches keep coming while the device catches up
  const during: string[] = [];
  const running = (async () => {
    for (let i = 0; i < 300; i++) {
      const id = `hl${i}`;
      during.push(id);
      await dispatcher.dispatch({ dispatch_id: id, message_id: id, lane: "default", recipients: [user], body: new Uint8Array(8) });
      if (i % 20 === 0) await sleep(5);
    }
  })();
  await dev.next("SYNCED", 60_000);
  await running;
  const all = [...backlog, ...during];
  await waitFor("every entry delivered", () => dev.entries().length >= all.length, { timeoutMs: 30_000 });
  // a marker dispatched after everything was delivered comes after any repeat the gateway would send
  await dispatcher.dispatch({ dispatch_id: "hmark", message_id: "hmark", lane: "default", recipients: [user], body: new Uint8Array(1) });
  await waitFor("the marker entry delivered", () => dev.entries().some((e) => e.id === "hmark"));
  assert.equal(dev.entries().at(-1)!.id, "hmark", "nothing after the marker");
  const got = dev.entries().slice(0, -1);
  assert.equal(got.length, all.length, "each entry exactly once");
  assert.deepEqual(new Set(got.map((e) => e.id)), new Set(all));
  assertStrictlyIncreasing(got);
  assert.equal(await gateway.metric("jetgate_mailbox_seq_regression_total", { component: "gateway" }), 0);
  const synced = await dev.next("SYNCED");
  assert.ok(synced.seq >= got[19_999]!.seq || synced.seq >= got.find((e) => e.id === "h19999")!.seq);
  dev.close();
});

test("gateway live - lanes filter what a device receives; PULL pages by lane; PING; ACK is stored, a lower ACK never lowers it", async () => {
  const user = "laner";
  const ids = ["l0", "l1", "l2", "l3", "l4", "l5"];
  for (const [i, id] of ids.entries()) {
    await dispatcher.dispatch({ dispatch_id: id, message_id: id, lane: i % 2 === 0 ? "chat" : "default", recipients: [user], body: new Uint8Array(1) });
  }
  const dev = await live(gateway.httpPort, user, "d1", ["chat"]);
  await waitFor("chat entries", () => dev.entries().length === 3);
  assert.deepEqual(dev.entries().map((e) => e.id), ["l0", "l2", "l4"]);
  dev.send({ t: "PING", id: 77 });
  assert.equal((await dev.next("PONG")).id, 77);
  dev.send({ t: "PULL", id: 5, after: 0n, limit: 2, lane: "chat" });
  const page = await waitFor("PULL reply", () => dev.frames.find((f) => f.t === "MSGS" && f.id === 5));
  assert.ok(page.t === "MSGS");
  assert.deepEqual(page.e.map((e) => e.id), ["l0", "l2"]);
  assert.equal(page.more, true);
  // only seqs the device received are ACKed (the gateway refuses one beyond what it sent)
  const last = dev.entries().at(-1)!.seq;
  const lower = dev.entries()[0]!.seq;
  const ackKey = keys.deviceAck(user, "d1");
  const r = await redisClient(infra.redis.url);
  // every command that carries the lower seq into the device's ACK key (the gateway's store, and
  // a write inside its script if it wrongly lowered the value)
  const monitor = await r.monitor();
  let lowerStores = 0;
  monitor.on("monitor", (_time: string, args: string[]) => {
    if (args.includes(ackKey) && args.includes(seqKey(lower))) lowerStores++;
  });
  try {
    dev.send({ t: "ACK", seq: last });
    await waitFor(`${ackKey} to hold the ACKed seq ${seqKey(last)}`, async () => {
      const v = await r.get(ackKey);
      if (v !== seqKey(last)) throw new Error(`it holds ${v}`);
      return true;
    }, { timeoutMs: 5000 });
    // a lower ACK in the same session: the close flushes what the session holds
    dev.send({ t: "ACK", seq: lower });
    dev.close();
    await dev.waitClosed();
    // a new session of the device (restored from a backup, say) ACKs an older entry it received
    // again: its store reaches Redis (on close), and must not lower the value
    const again = await live(gateway.httpPort, user, "d1", ["chat"]);
    await waitFor("the catch-up of the new session", () => again.entries().length === 3);
    assert.equal(again.entries()[0]!.seq, lower);
    again.send({ t: "ACK", seq: lower });
    again.close();
    await waitFor(`the gateway's store of the lower ACK ${seqKey(lower)} in Redis`, () => lowerStores > 0);
    assert.equal(await r.get(ackKey), seqKey(last), "a lower ACK never lowers the stored one");
  } finally {
    monitor.disconnect();
    r.disconnect();
  }
});

test("gateway live - SEND goes to INGRESS once per cmid; SEND_OK after the JetStream ack", async () => {
  const dev = await live(gateway.httpPort, "sender");
  dev.send({ t: "SEND", id: 1, cmid: "c-1", b: new TextEncoder().encode("hello") });
  dev.send({ t: "SEND", id: 2, cmid: "c-1", b: new TextEncoder().encode("hello") });
  const oks = await waitFor("two SEND_OK", () => {
    const f = dev.frames.filter((x) => x.t === "SEND_OK");
    return f.length === 2 ? f : undefined;
  });
  assert.deepEqual(oks.map((f) => f.t === "SEND_OK" && [f.id, f.cmid, f.dup]), [[1, "c-1", false], [2, "c-1", true]]);
  const jsm = await jetstreamManager(nc);
  const m = await jsm.streams.getMessage("INGRESS", { last_by_subj: "in.sender.d1" });
  assert.equal(new TextDecoder().decode(m!.data), "hello");
  assert.equal(m!.header.get("Nats-Msg-Id"), "sender:d1:c-1");
  dev.close();
});

test("gateway live - one session per device across two gateways: the older is closed with 4409", async () => {
  const g2 = await spawnGateway(infra.env);
  try {
    const first = await live(gateway.httpPort, "twin", "phone");
    const second = await live(g2.httpPort, "twin", "phone");
    assert.equal((await first.waitClosed()).code, 4409);
    assert.equal(second.closed, undefined);
    // another device of the same user is untouched. Its AUTH claimed presence (and published any
    // kick to g2) before its SYNCED; a kick this gateway publishes afterwards reaches g2 after it:
    // once that one closed its session, a wrong kick from the tablet's AUTH has closed `second`
    const tablet = await live(gateway.httpPort, "twin", "tablet");
    const watchOnG2 = await live(g2.httpPort, "twin", "watch");
    const watchOnG1 = await live(gateway.httpPort, "twin", "watch");
    assert.equal((await watchOnG2.waitClosed()).code, 4409, "the marker kick from this gateway to g2");
    assert.equal(await second.roundTrip(), true, `the phone's session on g2 still answers (closed: ${JSON.stringify(second.closed)})`);
    assert.equal(second.closed, undefined);
    watchOnG1.close();
    await dispatcher.dispatch({ dispatch_id: "tw1", message_id: "tw1", lane: "default", recipients: ["twin"], body: new Uint8Array(1) });
    await waitFor("both live sessions get it", () => second.entries().length === 1 && tablet.entries().length === 1);
    second.close();
    tablet.close();
  } finally {
    await g2.kill();
  }
});

test("gateway live - a device that stops reading is closed with 4408 and resumes by cursor", async () => {
  const user = "sloth";
  const dev = await live(gateway.httpPort, user);
  const sock = (dev.ws as unknown as { _socket: { pause(): void; resume(): void } })._socket;
  sock.pause();
  const big = new Uint8Array(60_000);
  for (let i = 0; i < 400; i++) {
    await dispatcher.dispatch({ dispatch_id: `s${i}`, message_id: `s${i}`, lane: "default", recipients: [user], body: big });
  }
  await waitFor("the gateway gave up on it", async () => (await gateway.metric("jetgate_gateway_slow_consumers_total")) >= 1, { timeoutMs: 30_000 });
  sock.resume();
  assert.equal((await dev.waitClosed(30_000)).code, 4408);
});

test("gateway live - POST /v1/dispatch: delivered end to end; 401 without the token; 400 names the bad field", async () => {
  const dev = await live(gateway.httpPort, "httpuser");
  const post = (body: unknown, token = "svc-secret") =>
    fetch(`http://127.0.0.1:${gateway.httpPort}/v1/dispatch`, {
      method: "POST",
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
      body: typeof body === "string" ? body : JSON.stringify(body),
    });
  const ok = await post({ dispatch_id: "http1", message_id: "http1", lane: "default", recipients: ["httpuser"], body: "hi there" });
  assert.equal(ok.status, 200);
  const res = (await ok.json()) as { results: { user: string; seq: number }[] };
  assert.equal(res.results[0]!.user, "httpuser");
  await waitFor("delivered", () => dev.entries().some((e) => e.id === "http1"));
  assert.equal(new TextDecoder().decode(dev.entries().find((e) => e.id === "http1")!.b), "hi there");
  assert.equal((await post({ dispatch_id: "x", message_id: "x", lane: "default", recipients: ["a"], body: "x" }, "wrong")).status, 401);
  const cases: [unknown, RegExp][] = [
    ["{not json", /not JSON/],
    [{ dispatch_id: "x", message_id: "x", lane: "default", recipients: ["a"] }, /exactly one of body and body_b64/],
    [{ dispatch_id: "x.y", message_id: "x", lane: "default", recipients: ["a"], body: "x" }, /dispatch_id: dispatch id may contain only/],
    [{ dispatch_id: "x", message_id: "x", lane: "nope", recipients: ["a"], body: "x" }, /unknown lane "nope"/],
    [{ dispatch_id: "x", message_id: "x", lane: "default", recipients: [], body: "x" }, /at least one recipient/],
  ];
  for (const [body, re] of cases) {
    const r = await post(body);
    assert.equal(r.status, 400, JSON.stringify(body));
    assert.match(((await r.json()) as { error: string }).error, re);
  }
  dev.close();
});

test("gateway live - POST /v1/dispatch/batch: many dispatches in one request, a user's in array order; a bad one refuses the whole batch", async () => {
  const a = await live(gateway.httpPort, "batch-a");
  const b = await live(gateway.httpPort, "batch-b");
  const post = (body: unknown) =>
    fetch(`http://127.0.0.1:${gateway.httpPort}/v1/dispatch/batch`, {
      method: "POST",
      headers: { authorization: "Bearer svc-secret", "content-type": "application/json" },
      body: typeof body === "string" ? body : JSON.stringify(body),
    });
  const one = (id: string, recipients: string[]) => ({ dispatch_id: id, message_id: id, lane: "default", recipients, body: id });
  const ids = Array.from({ length: 50 }, (_, i) => `bt${i}`);
  const ok = await post({ dispatches: ids.map((id, i) => one(id, i % 2 === 0 ? ["batch-a", "batch-b"] : ["batch-a"])) });
  assert.equal(ok.status, 200);
  const res = (await ok.json()) as { dispatches: { results: { user: string; seq: string; duplicate: boolean }[] }[] };
  assert.equal(res.dispatches.length, 50);
  assert.deepEqual(res.dispatches[0]!.results.map((r) => r.user), ["batch-a", "batch-b"]);
  await waitFor("all 50 at batch-a", () => a.entries().length === 50);
  assert.deepEqual(a.entries().map((e) => e.id), ids, "a user's entries in the batch's order");
  await waitFor("25 at batch-b", () => b.entries().length === 25);
  const seqs = res.dispatches.map((d) => BigInt(d.results[0]!.seq));
  assert.ok(seqs.every((s, i) => i === 0 || s > seqs[i - 1]!), "seqs increase in array order");
  // validated whole before anything is appended
  const before = a.entries().length;
  const bad = await post({ dispatches: [one("bt-x1", ["batch-a"]), one("bt-x2", ["batch-a", "no.dots"])] });
  assert.equal(bad.status, 400);
  assert.deepEqual(await bad.json(), { error: "dispatches.1.recipients.1: user id may contain only A-Z a-z 0-9 _ -, got \"no.dots\"", field: "dispatches.1.recipients.1" });
  const unknownLane = await post({ dispatches: [one("bt-y1", ["batch-a"]), { ...one("bt-y2", ["batch-a"]), lane: "gossip" }] });
  assert.equal(unknownLane.status, 400);
  assert.match(((await unknownLane.json()) as { error: string }).error, /^dispatches\.1\.lane: unknown lane "gossip"/);
  const cases: [unknown, RegExp][] = [
    [{ dispatches: [] }, /^dispatches: must hold at least one dispatch$/],
    [{ dispatches: Array.from({ length: 1001 }, (_, i) => one(`m${i}`, ["u"])) }, /^dispatches: at most 1000 dispatches in a batch$/],
    [{ dispatches: Array.from({ length: 3 }, (_, i) => one(`r${i}`, Array.from({ length: 4000 }, (_, j) => `u${j}`))) }, /^dispatches: at most 10000 recipients in a batch/],
    [one("single", ["u"]), /^request: nested deeper|^request: |^dispatches: /],
  ];
  for (const [body, re] of cases) {
    const r = await post(body);
    assert.equal(r.status, 400, JSON.stringify(body).slice(0, 60));
    assert.match(((await r.json()) as { error: string }).error, re);
  }
  assert.equal(await a.roundTrip(), true);
  assert.equal(a.entries().length, before, "nothing of a refused batch was appended");
  a.close();
  b.close();
});

test("gateway live - health, readiness and metrics on their own port; the device port answers none of them", async () => {
  await dispatcher.dispatch({ dispatch_id: "met1", message_id: "met1", lane: "default", recipients: ["metered"], body: new Uint8Array(1) });
  (await live(gateway.httpPort, "metered")).close();
  assert.deepEqual(await gateway.http("/healthz"), { status: 200, text: "ok\n" });
  const ready = await gateway.http("/readyz");
  assert.equal(ready.status, 200);
  assert.deepEqual(JSON.parse(ready.text), { ready: true, problems: [] });
  const { text } = await gateway.http("/metrics");
  for (const name of [
    'jetgate_mailbox_seq_regression_total{component="gateway"} 0', "jetgate_gateway_connections", "jetgate_gateway_frames_in_total",
    "jetgate_gateway_frames_out_total", "jetgate_gateway_bytes_out_total", "jetgate_gateway_entries_sent_total", "jetgate_gateway_redis_writable 1", 'jetgate_gateway_auth_outcomes_total{case="fresh"}',
    'jetgate_gateway_catchup_entries_total{source="stream"}', "jetgate_gateway_slow_consumers_total", "jetgate_gateway_dispatch_requests_total",
  ]) assert.ok(text.includes(name), name);
  const head = (await stack.registry.sync()).seq;
  await waitFor("the gateway reports the registry record it applied", async () => (await gateway.metric("jetgate_gateway_registry_record")) === head);
  assert.equal((await gateway.http("/nope")).status, 404);
  assert.notEqual(gateway.opsPort, gateway.httpPort);
  // the device port: the WebSocket path and the dispatch API, nothing that tells about the fleet
  for (const path of ["/metrics", "/healthz", "/readyz", "/nope", "/v1/ws/../metrics"]) {
    const r = await fetch(`http://127.0.0.1:${gateway.httpPort}${path}`);
    assert.equal(r.status, 404, path);
    assert.ok(!(await r.text()).includes("jetgate_"), path);
  }
});

/** Deletes every Redis key of `user` (what a FLUSHALL takes from it) and no other: the server is shared by this file's tests. */
async function dropUserKeys(r: Redis, user: string): Promise<number> {
  const pattern = `${keys.watermarks(user).slice(0, -"wm".length)}*`;
  let dropped = 0;
  let cursor = "0";
  do {
    const [next, found] = await r.scan(cursor, "MATCH", pattern, "COUNT", 1000);
    cursor = next;
    if (found.length > 0) dropped += await r.del(...found);
  } while (cursor !== "0");
  return dropped;
}

test("gateway live - catch-up is right from the hot cache and, with the user's Redis keys gone (as after a FLUSHALL), from the stream", async () => {
  const user = "cachey";
  const send = async (from: number, to: number) => {
    for (let i = from; i < to; i++) await dispatcher.dispatch({ dispatch_id: `c${i}`, message_id: `c${i}`, lane: "default", recipients: [user], body: new Uint8Array(4) });
  };
  await send(0, 5);
  const first = await live(gateway.httpPort, user);
  await waitFor("five", () => first.entries().length === 5);
  const ok = first.frames.find((f) => f.t === "AUTH_OK")!;
  assert.ok(ok.t === "AUTH_OK");
  const cursor = { ...ok.cursor, seq: first.entries().at(-1)!.seq };
  first.close();
  const r = await redisClient(infra.redis.url);
  await send(5, 10);
  // the user's hot cache, created at c0, holds c0..c9 (the worker writes one row per entry)
  await waitFor("the hot cache holds c0..c9", async () => (await r.xlen(keys.hotCache(user))) === 10);
  const fromCache = async () => gateway.metric("jetgate_gateway_catchup_entries_total", { source: "cache" });
  const cacheBefore = await fromCache();
  const again = await TestDevice.connect(gateway.httpPort);
  again.send({ t: "AUTH", v: 1, token: await deviceToken(user), device: "d1", cursor });
  await again.next("SYNCED");
  assert.deepEqual(again.entries().map((e) => e.id), ["c5", "c6", "c7", "c8", "c9"]);
  assert.equal((await fromCache()) - cacheBefore, 5, "served by the hot cache");
  again.close();
  assert.ok((await dropUserKeys(r, user)) >= 2, "the user's watermarks and hot cache were there");
  assert.equal(await r.exists(keys.watermarks(user), keys.hotCache(user)), 0);
  const fromStream = async () => gateway.metric("jetgate_gateway_catchup_entries_total", { source: "stream" });
  const streamBefore = await fromStream();
  const flushed = await TestDevice.connect(gateway.httpPort);
  flushed.send({ t: "AUTH", v: 1, token: await deviceToken(user), device: "d1", cursor });
  await flushed.next("SYNCED");
  assert.deepEqual(flushed.entries().map((e) => e.id), ["c5", "c6", "c7", "c8", "c9"], "the same entries with no cache at all");
  assert.equal((await fromStream()) - streamBefore, 5);
  const head = (await flushed.next("AUTH_OK")).head;
  assert.equal(head, flushed.entries().at(-1)!.seq, "the head rebuilt from the stream");
  // the hash holds the gateway's route now (the session was there to get live entries), nothing else
  assert.deepEqual(Object.keys(await r.hgetall(keys.watermarks(user))).filter((f) => !f.includes(":")), [], "not written back: only the worker writes watermarks, in stream order");
  flushed.close();

  // after the flush the cache starts again at the next entry: a device behind it is still served
  // from the stream (c5..c9 lie between), one with nothing in between from the cache
  // another user's entry on the same shard first, so the cache's start is not right after c9
  const neighbour = Array.from({ length: 200 }, (_, i) => `nb${i}`).find((u) => stack.registry.shards.shardOf(u) === stack.registry.shards.shardOf(user))!;
  await dispatcher.dispatch({ dispatch_id: "nb", message_id: "nb", lane: "default", recipients: [neighbour], body: new Uint8Array(1) });
  await send(10, 12);
  await waitFor("the cache restarted", async () => (await r.xlen(keys.hotCache(user))) === 2);
  const streamBefore2 = await fromStream();
  const behind = await TestDevice.connect(gateway.httpPort);
  behind.send({ t: "AUTH", v: 1, token: await deviceToken(user), device: "d1", cursor });
  await behind.next("SYNCED");
  assert.deepEqual(behind.entries().map((e) => e.id), ["c5", "c6", "c7", "c8", "c9", "c10", "c11"]);
  assert.equal((await fromStream()) - streamBefore2, 7, "entries before the cache's start come from the stream");
  const upToDate = { ...cursor, seq: behind.entries().find((e) => e.id === "c9")!.seq };
  behind.close();
  const cacheBefore2 = await fromCache();
  const near = await TestDevice.connect(gateway.httpPort);
  near.send({ t: "AUTH", v: 1, token: await deviceToken(user), device: "d1", cursor: upToDate });
  await near.next("SYNCED");
  assert.deepEqual(near.entries().map((e) => e.id), ["c10", "c11"]);
  assert.equal((await fromCache()) - cacheBefore2, 2, "nothing in the stream between the cursor and the cache's start: from the cache");
  near.close();

  // a row of another shard in the user's cache (a moved user's cache holds parent and child rows):
  // past the head it changes nothing; inside the range the cache cannot say what this shard holds
  // (its rows and the other shard's can fail behind each other), so the rest comes from the stream
  const own = near.entries().at(-1)!.seq;
  const foreignSeq = own + (1n << 48n);
  await r.xadd(keys.hotCache(user), `${foreignSeq >> 48n}-${foreignSeq & 0xffffffffffffn}`, "s", seqKey(foreignSeq), "p", "", "a", seqKey(own), "l", "default", "e", "x", "h", "999");
  const cacheBefore3 = await fromCache();
  const past = await TestDevice.connect(gateway.httpPort);
  past.send({ t: "AUTH", v: 1, token: await deviceToken(user), device: "d1", cursor: upToDate });
  await past.next("SYNCED");
  assert.deepEqual(past.entries().map((e) => e.id), ["c10", "c11"], "only this shard's entries");
  assert.equal((await fromCache()) - cacheBefore3, 2, "the foreign row lies past the head: from the cache");
  past.close();
  // c12's row is refused (its id is below the foreign row's): the cache holds c10, c11 and the foreign row
  await send(12, 13);
  await waitFor("c12 processed", async () => (await r.hget(keys.watermarks(user), "_all")) !== seqKey(own));
  const streamBefore3 = await fromStream();
  const mixed = await TestDevice.connect(gateway.httpPort);
  mixed.send({ t: "AUTH", v: 1, token: await deviceToken(user), device: "d1", cursor: upToDate });
  await mixed.next("SYNCED");
  assert.deepEqual(mixed.entries().map((e) => e.id), ["c10", "c11", "c12"], "every entry, once, in order");
  assert.equal((await fromStream()) - streamBefore3, 1, "c12 from the stream, after the cache's c10 and c11");
  mixed.close();
  r.disconnect();
});
