/**
 * Live pushes routed to the gateways of each user's sessions (worker/push-router.ts,
 * gateway/hub/routes.ts), with real processes: each gateway gets its own users' entries only, an
 * offline user costs no message, a device that moves between gateways mid-stream loses nothing,
 * and when Redis loses the routes (a FLUSHALL, one user's hash evicted) devices still get every
 * entry within seconds. Gateway A never runs a tail check, so what it delivers after a loss comes
 * from routing alone; B's tail check (1 s) is what finds a route evicted alone.
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { CloseCode, RedisKeys, parseRoutes, type Entry, type ServerFrame } from "../../protocol/index.js";
import { loadConfig } from "../../protocol/io/index.js";
import { DispatchLoad, redisClient, spawnGateway, startStack } from "../harness/stack.js";
import { TestDevice, deviceToken } from "../harness/device.js";
import { waitFor } from "../harness/wait.js";

const stack = await startStack({ env: { JETGATE_LEASE_MS: "2000" } });
const gwA = await spawnGateway(stack.infra.env, { JETGATE_GATEWAY_ID: "gw-a", JETGATE_TAIL_CHECK_S: "0" });
const gwB = await spawnGateway(stack.infra.env, { JETGATE_GATEWAY_ID: "gw-b", JETGATE_TAIL_CHECK_S: "1" });
const redis = await redisClient(stack.infra.redis.url);
const keys = new RedisKeys(loadConfig(stack.infra.env).JETGATE_REDIS_PREFIX);
after(async () => {
  redis.disconnect();
  await gwA.kill();
  await gwB.kill();
  await stack.dispose();
});

type Cursor = Extract<ServerFrame, { t: "AUTH_OK" }>["cursor"] & { seq: bigint };

async function live(port: number, user: string, device = "d1", cursor?: Cursor): Promise<TestDevice> {
  const dev = await TestDevice.connect(port);
  dev.send({ t: "AUTH", v: 1, token: await deviceToken(user), device, ...(cursor ? { cursor } : {}) });
  await dev.next("SYNCED", 15_000);
  return dev;
}

function cursorOf(dev: TestDevice): Cursor {
  const ok = dev.frames.find((f) => f.t === "AUTH_OK");
  assert.ok(ok !== undefined && ok.t === "AUTH_OK");
  return { ...ok.cursor, seq: dev.entries().at(-1)?.seq ?? ok.from };
}

async function send(user: string, id: string): Promise<void> {
  const [r] = await stack.dispatcher.dispatch({ dispatch_id: id, message_id: id, lane: "default", recipients: [user], body: new Uint8Array(4) });
  assert.ok(r !== undefined && !("error" in r), `dispatch ${id}`);
}

/** Seqs strictly increasing and ids each once. */
function inOrderOnce(entries: Entry[], what: string): void {
  for (let i = 1; i < entries.length; i++) assert.ok(entries[i]!.seq > entries[i - 1]!.seq, `${what}: seqs increase`);
  assert.equal(new Set(entries.map((e) => e.id)).size, entries.length, `${what}: each entry once`);
}

test("routing - each gateway receives the entries of its own sessions' users only, several to a message", async () => {
  const ann = await live(gwA.httpPort, "r-ann");
  const bob = await live(gwB.httpPort, "r-bob");
  const [aBefore, bBefore, msgsBefore, pushedBefore] = await Promise.all([
    gwA.metric("jetgate_gateway_pushes_received_total"), gwB.metric("jetgate_gateway_pushes_received_total"),
    stack.worker!.metric("jetgate_worker_push_messages_total"), stack.worker!.metric("jetgate_worker_entries_pushed_total"),
  ]);
  await Promise.all(Array.from({ length: 40 }, (_, i) => send(i % 2 === 0 ? "r-ann" : "r-bob", `rt${i}`)));
  await waitFor("every entry at its device", () => ann.entries().length === 20 && bob.entries().length === 20);
  inOrderOnce(ann.entries(), "ann");
  inOrderOnce(bob.entries(), "bob");
  assert.equal((await gwA.metric("jetgate_gateway_pushes_received_total")) - aBefore, 20, "A got ann's entries, none of bob's");
  assert.equal((await gwB.metric("jetgate_gateway_pushes_received_total")) - bBefore, 20, "B got bob's entries, none of ann's");
  assert.equal(await gwA.metric("jetgate_gateway_stray_pushes_total"), 0);
  const messages = (await stack.worker!.metric("jetgate_worker_push_messages_total")) - msgsBefore;
  const pushed = (await stack.worker!.metric("jetgate_worker_entries_pushed_total")) - pushedBefore;
  assert.equal(pushed, 40);
  assert.ok(messages <= pushed, `${messages} push messages for ${pushed} entries`);
  ann.close();
  bob.close();
});

test("routing - a user with no session anywhere costs no push message", async () => {
  const dev = await live(gwA.httpPort, "r-gone");
  dev.close();
  await waitFor("the route released", async () => !((await redis.hget(keys.watermarks("r-gone"), ":r")) ?? "").includes("gw-a"));
  // a new user's hash was made by the route, so its routes start unknown: its first entry goes to
  // every gateway (once per hash), and from then on they are known
  const firstBroadcast = await stack.worker!.metric("jetgate_worker_broadcast_pushes_total");
  await send("r-gone", "off-first");
  await waitFor("the first entry went to every gateway", async () => (await stack.worker!.metric("jetgate_worker_broadcast_pushes_total")) - firstBroadcast === 1);
  const msgs = await stack.worker!.metric("jetgate_worker_push_messages_total");
  const unrouted = await stack.worker!.metric("jetgate_worker_unrouted_entries_total");
  for (let i = 0; i < 5; i++) await send("r-gone", `off${i}`);
  await waitFor("processed", async () => (await stack.worker!.metric("jetgate_worker_unrouted_entries_total")) - unrouted === 5);
  assert.equal(await stack.worker!.metric("jetgate_worker_push_messages_total"), msgs);
  const back = await live(gwB.httpPort, "r-gone", "d1");
  assert.deepEqual(back.entries().slice(-5).map((e) => e.id), ["off0", "off1", "off2", "off3", "off4"], "all in the mailbox");
  back.close();
});

test("routing - a device moving between gateways while entries flow: every entry once, in order, without waiting for a tail check", async () => {
  const user = "r-mover";
  const load = new DispatchLoad(stack.dispatcher, [user], { perTick: 3, everyMs: 15, prefix: "mv" });
  const got: Entry[] = [];
  let dev = await live(gwA.httpPort, user);
  for (let hop = 0; hop < 8; hop++) {
    await new Promise((r) => setTimeout(r, 150));
    const cursor = cursorOf(dev);
    const older = dev;
    // the same device on the other gateway: the older session is replaced (4409)
    dev = await live(hop % 2 === 0 ? gwB.httpPort : gwA.httpPort, user, "d1", cursor);
    await waitFor("the older session replaced", () => older.closed?.code === CloseCode.REPLACED);
    got.push(...older.entries().filter((e) => e.seq <= cursor.seq));
  }
  await load.stop();
  const ids = load.allIds();
  // gateway A has no tail check: whatever reaches a device on A came by routing or by its own reads
  await waitFor("every entry at the last device", () => new Set([...got, ...dev.entries()].map((e) => e.id)).size === ids.length, { timeoutMs: 5000 });
  got.push(...dev.entries());
  inOrderOnce(got, "across the hops");
  assert.deepEqual(new Set(got.map((e) => e.id)), new Set(ids));
  dev.close();
  assert.equal(await gwA.metric("jetgate_mailbox_seq_regression_total"), 0);
  assert.equal(await gwB.metric("jetgate_mailbox_seq_regression_total"), 0);
});

test("routing - Redis FLUSHALL under load: devices keep getting every entry within seconds (gateway A has no tail check)", async () => {
  const users = ["rf1", "rf2", "rf3", "rf4"];
  const devs = await Promise.all(users.map((u, i) => live(i % 2 === 0 ? gwA.httpPort : gwB.httpPort, u)));
  const load = new DispatchLoad(stack.dispatcher, users, { perTick: 4, everyMs: 20, prefix: "fl" });
  await new Promise((r) => setTimeout(r, 500));
  await redis.flushall();
  await new Promise((r) => setTimeout(r, 1500));
  await load.stop();
  const stopped = Date.now();
  await waitFor("every entry at its device", () => users.every((u, i) => devs[i]!.entries().length === (load.sent.get(u)?.length ?? 0)), { timeoutMs: 5000 });
  console.log(`  flushall: the last entries reached their devices ${Date.now() - stopped} ms after the load stopped`);
  users.forEach((u, i) => {
    inOrderOnce(devs[i]!.entries(), u);
    assert.deepEqual(devs[i]!.entries().map((e) => e.id), load.sent.get(u));
  });
  assert.ok((await redis.hget(keys.watermarks("rf1"), ":r"))?.includes("gw-a"), "gateway A registered its route again");
  for (const d of devs) d.close();
});

test("routing - a user's hash evicted alone: the tail check finds the route missing and puts it back", async () => {
  const user = "r-evicted";
  const dev = await live(gwB.httpPort, user);
  await send(user, "ev0");
  await waitFor("ev0", () => dev.entries().some((e) => e.id === "ev0"));
  await redis.del(keys.watermarks(user));
  for (let i = 1; i <= 3; i++) await send(user, `ev${i}`);
  await waitFor("the entries after the eviction", () => dev.entries().length === 4, { timeoutMs: 6000 });
  assert.deepEqual(dev.entries().map((e) => e.id), ["ev0", "ev1", "ev2", "ev3"]);
  await waitFor("routed again", async () => ((await redis.hget(keys.watermarks(user), ":r")) ?? "").includes("gw-b"));
  await send(user, "ev4");
  await waitFor("ev4 live", () => dev.entries().length === 5, { timeoutMs: 3000 });
  dev.close();
});

test("routing - a user's hash evicted alone, on a gateway with no tail check: the next entry reaches every gateway, and the holder registers again", async () => {
  const user = "r-evicted-a";
  const dev = await live(gwA.httpPort, user);
  await send(user, "ea0");
  await waitFor("ea0", () => dev.entries().some((e) => e.id === "ea0"));
  const broadcasts = await stack.worker!.metric("jetgate_worker_broadcast_pushes_total");
  await redis.del(keys.watermarks(user));
  for (let i = 1; i <= 3; i++) await send(user, `ea${i}`);
  await waitFor("the entries after the eviction", () => dev.entries().length === 4, { timeoutMs: 5000 });
  assert.deepEqual(dev.entries().map((e) => e.id), ["ea0", "ea1", "ea2", "ea3"]);
  assert.ok((await stack.worker!.metric("jetgate_worker_broadcast_pushes_total")) - broadcasts >= 1, "the first entry after the eviction went to every gateway");
  await waitFor("routed again", async () => ((await redis.hget(keys.watermarks(user), ":r")) ?? "").includes("gw-a"));
  dev.close();
});

test("routing - the route scripts: a late removal never takes a newer registration; a hash made after a loss keeps its routes unknown until the next entry", async () => {
  const key = keys.watermarks("r-scripts");
  // a hash Redis does not have: the registration marks the others unknown
  assert.equal(await redis.jgRouteAdd(key, "gx", 5, 60), "", "no head yet");
  assert.equal(await redis.hget(key, ":r"), "?,gx.5");
  assert.deepEqual(parseRoutes("?,gx.5"), { gateways: ["gx"], unknown: true });
  // the user's next entry goes to every gateway and makes the routes known
  await send("r-scripts", "rs0");
  await waitFor("the worker made the routes known", async () => (await redis.hget(key, ":r")) === "gx.5");
  await redis.jgRouteAdd(key, "gy", 1, 60);
  await redis.jgRouteAdd(key, "gx", 7, 60); // gx registers again (a newer session)
  assert.equal(await redis.hget(key, ":r"), "gy.1,gx.7");
  assert.equal(await redis.jgRouteDrop(key, 6, "gx"), 0, "a removal decided before registration 7, run late: nothing removed");
  await redis.jgRouteAdd(key, "gx", 6, 60); // an older registration run late: the newer stays
  assert.equal(await redis.hget(key, ":r"), "gy.1,gx.7");
  assert.equal(await redis.jgRouteDrop(key, 7, "gx"), 1);
  assert.equal(await redis.jgRouteDrop(key, Number.MAX_SAFE_INTEGER, "gy", "gone"), 1, "a silent gateway's every registration");
  assert.equal(await redis.hget(key, ":r"), "", "known: nobody");
  assert.deepEqual(parseRoutes(""), { gateways: [], unknown: false });
  assert.ok((await redis.ttl(key)) > 0, "the hash has an expiry");
});

test("routing - the gateways' beat set lost alone: each gateway registers its routes again, and delivery goes on", async () => {
  const user = "r-beats";
  const dev = await live(gwA.httpPort, user);
  const tokenOf = async () => ((await redis.hget(keys.watermarks(user), ":r")) ?? "").split(",").find((t) => t.startsWith("gw-a.")) ?? "";
  const before = await tokenOf();
  await redis.del(keys.gateways());
  await waitFor("gw-a registered again (a newer generation)", async () => {
    const now = await tokenOf();
    return now !== "" && Number(now.split(".")[1]) > Number(before.split(".")[1]);
  }, { timeoutMs: 5000 });
  await send(user, "gb0");
  await waitFor("gb0 live", () => dev.entries().some((e) => e.id === "gb0"), { timeoutMs: 3000 });
  dev.close();
});
