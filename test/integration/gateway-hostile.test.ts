/**
 * Hostile clients against a live gateway: forged and misused tokens and cursors, and floods of
 * connections, AUTHs, PULLs and SENDs, each bounded by a configured limit while other users keep
 * receiving their entries.
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import WebSocket from "ws";
import { SignJWT } from "jose";
import { DEV_JWT_SECRET, bigintsAsStrings, type Entry } from "../../protocol/index.js";
import { spawnGateway, startStack } from "../harness/stack.js";
import { TestDevice, deviceToken } from "../harness/device.js";
import { sleep, waitFor } from "../harness/wait.js";

const stack = await startStack({
  env: {
    JETGATE_MAX_CONNS_PER_IP: "12", JETGATE_RATE_FRAMES_PER_S: "50", JETGATE_RATE_BURST: "100", JETGATE_RATE_USER_FRAMES_PER_S: "150",
    // a lifetime past Node's 2^31 ms timer limit (24.8 days), for the timer overflow test
    JETGATE_JWT_MAX_LIFETIME_S: String(90 * 86_400),
  },
  gateway: {},
});
after(() => stack.dispose());
const gateway = stack.gateway!;

async function authed(user: string, device = "d1", cursor?: unknown): Promise<TestDevice> {
  const dev = await TestDevice.connect(gateway.httpPort);
  dev.send({ t: "AUTH", v: 1, token: await deviceToken(user), device, ...(cursor ? { cursor: cursor as never } : {}) });
  await dev.next("SYNCED");
  return dev;
}

async function dispatch(user: string, id: string): Promise<void> {
  const [r] = await stack.dispatcher.dispatch({ dispatch_id: id, message_id: id, lane: "default", recipients: [user], body: new Uint8Array([1]) });
  assert.ok(r && "seq" in r, JSON.stringify(r, bigintsAsStrings));
}

/** Dispatches to `user` every 50 ms while `during` runs; returns the worst dispatch-to-device delay. */
async function bystanderDelay(dev: TestDevice, user: string, during: () => Promise<void>): Promise<number> {
  let running = true;
  const sentAt = new Map<string, number>();
  const loop = (async () => {
    for (let i = 0; running; i++) {
      const id = `${user}-${Date.now()}-${i}`;
      sentAt.set(id, Date.now());
      await dispatch(user, id);
      await sleep(50);
    }
  })();
  await during();
  running = false;
  await loop;
  await waitFor("the bystander got every entry", () => [...sentAt.keys()].every((id) => dev.entries().some((e: Entry) => e.id === id)), { timeoutMs: 10_000 });
  assert.equal(dev.closed, undefined, "the bystander stayed connected");
  return Math.max(...[...sentAt.keys()].map((id) => dev.arrivedAt(id)! - sentAt.get(id)!));
}

/**
 * Until the gateway holds no connection: every test connects from 127.0.0.1, and the tests of the
 * per-address limit need all its slots (a closed connection frees its slot when the gateway has
 * seen the close).
 */
async function noConnections(): Promise<void> {
  await waitFor("the gateway to hold no connection", async () => (await gateway.metric("jetgate_gateway_connections")) === 0);
}

async function closedWith(token: string): Promise<{ code: number; error: string | undefined }> {
  const dev = await TestDevice.connect(gateway.httpPort);
  dev.send({ t: "AUTH", v: 1, token, device: "d1" });
  const c = await dev.waitClosed();
  const err = dev.frames.find((f) => f.t === "ERROR");
  return { code: c.code, error: err?.t === "ERROR" ? err.code : undefined };
}

test("hostile auth - alg none, a token not valid yet, and a token signed with another secret: UNAUTHORIZED, 4401", async () => {
  const none = `${Buffer.from(JSON.stringify({ alg: "none", typ: "JWT" })).toString("base64url")}.${Buffer.from(JSON.stringify({ sub: "mallory", exp: Math.floor(Date.now() / 1000) + 60 })).toString("base64url")}.`;
  assert.deepEqual(await closedWith(none), { code: 4401, error: "UNAUTHORIZED" });
  const early = await new SignJWT({}).setProtectedHeader({ alg: "HS256" }).setSubject("mallory").setNotBefore(Math.floor(Date.now() / 1000) + 3600)
    .setExpirationTime(Math.floor(Date.now() / 1000) + 7200).sign(new TextEncoder().encode(DEV_JWT_SECRET));
  assert.deepEqual(await closedWith(early), { code: 4401, error: "UNAUTHORIZED" });
  assert.deepEqual(await closedWith(await deviceToken("mallory", { secret: "a-different-secret-of-enough-length-000" })), { code: 4401, error: "UNAUTHORIZED" });
  assert.deepEqual(await closedWith(await deviceToken("mallory", { expiresInS: -10 })), { code: 4401, error: "UNAUTHORIZED" });
});

test("hostile auth - a cursor issued to user A, replayed by another user's device: CURSOR_INVALID, and nothing of A's", async () => {
  await dispatch("alice", "a1");
  const a = await authed("alice", "phone");
  await waitFor("alice's entry", () => a.entries().length === 1);
  const ok = await a.next("AUTH_OK");
  const stolen = { ...ok.cursor, seq: 0n };
  a.close();
  await dispatch("bob", "b1");
  const b = await TestDevice.connect(gateway.httpPort);
  b.send({ t: "AUTH", v: 1, token: await deviceToken("bob"), device: "laptop", cursor: stolen });
  await b.next("SYNCED");
  const err = await b.next("ERROR");
  assert.equal(err.code, "CURSOR_INVALID");
  assert.equal(err.fatal, false);
  assert.deepEqual(b.entries().map((e) => e.id), ["b1"], "bob gets his own mailbox from the start, never alice's");
  b.close();
});

test("hostile flood - connections from one address: the limit, then HTTP 429; a freed slot is usable again", async () => {
  await noConnections();
  const open: TestDevice[] = [];
  let refused = 0;
  for (let i = 0; i < 20; i++) {
    try {
      open.push(await TestDevice.connect(gateway.httpPort));
    } catch (err) {
      assert.match((err as Error).message, /429/);
      refused++;
    }
  }
  assert.equal(open.length, 12, "JETGATE_MAX_CONNS_PER_IP connections");
  assert.equal(refused, 8);
  assert.ok((await gateway.metric("jetgate_gateway_refused_upgrades_total", { reason: "per_ip" })) >= 8);
  open.pop()!.close();
  await waitFor("a slot is free again", async () => {
    try {
      open.push(await TestDevice.connect(gateway.httpPort));
      return true;
    } catch {
      return false;
    }
  });
  for (const d of open) d.close();
  await noConnections(); // the next tests connect from this address too
});

test("hostile flood - an AUTH flood of bad tokens is refused 4401 each, and a bystander keeps receiving", async () => {
  const bystander = await authed("calm1");
  const worst = await bystanderDelay(bystander, "calm1", async () => {
    for (let round = 0; round < 10; round++) {
      const devs = await Promise.all(Array.from({ length: 8 }, () => TestDevice.connect(gateway.httpPort)));
      for (const d of devs) d.send({ t: "AUTH", v: 1, token: "not.a.jwt", device: "x" });
      for (const d of devs) assert.equal((await d.waitClosed()).code, 4401);
    }
  });
  assert.ok(worst < 1000, `bystander delay ${worst} ms`);
  bystander.close();
});

test("hostile flood - PULL and SEND floods: RATE_LIMITED then 4429, and a bystander keeps receiving", async () => {
  const bystander = await authed("calm2");
  const worst = await bystanderDelay(bystander, "calm2", async () => {
    const puller = await authed("puller");
    for (let i = 0; i < 2000; i++) puller.send({ t: "PULL", id: i, after: 0n, limit: 1000 });
    assert.equal((await puller.waitClosed()).code, 4429);
    assert.ok(puller.frames.some((f) => f.t === "ERROR" && f.code === "RATE_LIMITED" && !f.fatal));
    const sender = await authed("sender");
    for (let i = 0; i < 2000; i++) sender.send({ t: "SEND", id: i, cmid: `c${i}`, b: new Uint8Array(8) });
    assert.equal((await sender.waitClosed()).code, 4429);
  });
  assert.ok(worst < 1000, `bystander delay ${worst} ms`);
  bystander.close();
});

async function openWithForwardedFor(port: number, n: number): Promise<{ socks: WebSocket[]; refused: number }> {
  const socks: WebSocket[] = [];
  let refused = 0;
  for (let i = 0; i < n; i++) {
    const ws = new WebSocket(`ws://127.0.0.1:${port}/v1/ws`, { headers: { "x-forwarded-for": `192.0.2.1, 10.0.0.${i}` } });
    const ok = await new Promise<boolean>((r) => {
      ws.once("open", () => r(true));
      ws.once("error", () => r(false));
    });
    if (ok) socks.push(ws);
    else refused++;
  }
  return { socks, refused };
}

test("hostile flood - X-Forwarded-For counts only when trusted (JETGATE_TRUST_FORWARDED_FOR), by its last hop", async () => {
  await noConnections();
  const forged = await openWithForwardedFor(gateway.httpPort, 14);
  assert.equal(forged.socks.length, 12, "not trusted: a forged header does not escape the per-address limit");
  assert.equal(forged.refused, 2);
  for (const s of forged.socks) s.close();
  await noConnections(); // the next tests connect from this address too
  const behindProxy = await spawnGateway(stack.infra.env, { JETGATE_MAX_CONNS_PER_IP: "12", JETGATE_TRUST_FORWARDED_FOR: "true" });
  try {
    const proxied = await openWithForwardedFor(behindProxy.httpPort, 14);
    assert.equal(proxied.refused, 0, "trusted: each last hop is its own address");
    for (const s of proxied.socks) s.close();
  } finally {
    await behindProxy.kill();
  }
});

test("hostile auth - token expiry: a REFRESH with a fresh token keeps the session; without it, 4401 at expiry", async () => {
  const dev = await TestDevice.connect(gateway.httpPort);
  dev.send({ t: "AUTH", v: 1, token: await deviceToken("refresher", { expiresInS: 2 }), device: "d1" });
  await dev.next("SYNCED");
  dev.send({ t: "REFRESH", id: 5, token: await deviceToken("refresher", { expiresInS: 3600 }) });
  const ok = await dev.next("REFRESH_OK");
  assert.equal(ok.id, 5);
  assert.ok(ok.exp > Date.now() + 3_000_000);

  // a session without a REFRESH whose token expires at least a second after the first token: its
  // close shows the gateway's expiry timers ran past the first token's expiry
  const lapsed = await TestDevice.connect(gateway.httpPort);
  lapsed.send({ t: "AUTH", v: 1, token: await deviceToken("refresher", { expiresInS: 3 }), device: "d2" });
  await lapsed.next("SYNCED");
  const closed = await lapsed.waitClosed(8000);
  assert.equal(closed.code, 4401);
  assert.match(closed.reason, /expired/);
  assert.equal(await dev.roundTrip(), true, `past the first token's expiry, still open (closed: ${JSON.stringify(dev.closed)})`);
  await dispatch("refresher", "rf1");
  await waitFor("still receiving", () => dev.entries().some((e) => e.id === "rf1"));
  assert.equal(dev.closed, undefined);
  dev.close();
});

test("hostile auth - REFRESH with another user's token, or an expired one (even inside the clock tolerance), or before AUTH: UNAUTHORIZED, 4401", async () => {
  // -2 s: verification's 5 s clock tolerance accepts it, but a REFRESH must not move the expiry into the past
  for (const token of [await deviceToken("someone-else"), await deviceToken("refresher2", { expiresInS: -10 }), await deviceToken("refresher2", { expiresInS: -2 }), await deviceToken("refresher2", { device: "other" })]) {
    const dev = await authed("refresher2");
    dev.send({ t: "REFRESH", token });
    assert.equal((await dev.waitClosed()).code, 4401);
    const err = dev.frames.find((f) => f.t === "ERROR");
    assert.ok(err?.t === "ERROR" && err.code === "UNAUTHORIZED" && err.fatal);
  }
  const early = await TestDevice.connect(gateway.httpPort);
  early.send({ t: "REFRESH", token: await deviceToken("refresher2") });
  assert.equal((await early.waitClosed()).code, 4401);
});

test("hostile auth - a token valid for 60 days does not close the session at once (timer overflow)", async () => {
  const dev = await TestDevice.connect(gateway.httpPort);
  dev.send({ t: "AUTH", v: 1, token: await deviceToken("longlived", { expiresInS: 60 * 86_400 }), device: "d1" });
  await dev.next("SYNCED");
  // an overflowed timer fires after 1 ms: armed at AUTH, before SYNCED; a close it caused comes
  // before the answer to a PING sent after SYNCED
  assert.equal(await dev.roundTrip(), true, `still open after SYNCED (closed: ${JSON.stringify(dev.closed)})`);
  assert.equal(dev.closed, undefined);
  dev.close();
});
