/**
 * The users API against two gateways (real processes, NATS, Redis, SDK clients on real sockets):
 * ending sessions across both, the SDK's two disconnect kinds, token revocation at AUTH, REFRESH
 * and on live sessions (also on a gateway started after it), presence as devices move, the
 * mailbox's position, and every bad input and bound.
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import WebSocket from "ws";
import { CloseCode, RedisKeys, cacheStreamId, seqLabel, userHash } from "../../protocol/index.js";
import { JetgateClient, MemoryCursorStore, type ClientEvent, type WebSocketFactory } from "../../client/index.js";
import { startStack, spawnGateway, redisClient, type JetgateProcess } from "../harness/stack.js";
import { deviceToken, TestDevice } from "../harness/device.js";
import { sleep, waitFor } from "../harness/wait.js";
import { runCli } from "../harness/cli.js";

const TOKEN = "users-api-secret";
const stack = await startStack({ env: { JETGATE_SERVICE_TOKEN: TOKEN, JETGATE_LANES: "default,chat" }, lanes: ["default", "chat"], gateway: {} });
const gw1 = stack.gateway!;
const gw2 = await spawnGateway(stack.infra.env);
const extra: JetgateProcess[] = [gw2];
const clients: JetgateClient[] = [];
const keys = new RedisKeys("jg");
after(async () => {
  for (const c of clients) await c.close();
  for (const p of extra) await p.kill();
  await stack.dispose();
});

async function api(gw: JetgateProcess, method: "GET" | "POST", path: string, body?: unknown, token = TOKEN): Promise<{ status: number; json: Record<string, unknown>; headers: Headers }> {
  const res = await fetch(`http://127.0.0.1:${gw.httpPort}${path}`, {
    method,
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    ...(body !== undefined ? { body: typeof body === "string" ? body : JSON.stringify(body) } : {}),
  });
  return { status: res.status, json: (await res.json()) as Record<string, unknown>, headers: res.headers };
}

// a gateway's answers are partial until it has listened to two rounds of the others' beats
for (const gw of [gw1, gw2]) {
  await waitFor("whole answers", async () => ((await api(gw, "GET", "/v1/users/nobody/presence")).json.gateways as { partial: boolean }).partial === false);
}

/** An SDK client of `user`/`device` on `gw`, live; its events recorded. `iat`: its tokens' issue time (a function: asked at each connect). */
async function client(gw: JetgateProcess, user: string, device: string, iat: () => number = () => Math.floor(Date.now() / 1000)) {
  const events: ClientEvent[] = [];
  const c = new JetgateClient({
    url: `ws://127.0.0.1:${gw.httpPort}/v1/ws`, device, token: () => deviceToken(user, { issuedAt: iat() }), store: new MemoryCursorStore(),
    onEntry: () => undefined, WebSocket: WebSocket as unknown as WebSocketFactory, backoff: { baseMs: 50, capMs: 200 },
  });
  c.on((e) => void events.push(e));
  clients.push(c);
  await c.start();
  await waitFor(`${user}/${device} live`, () => c.state.type === "live");
  return { c, events };
}

test("users API - disconnect signed_out ends the user's sessions on both gateways; the SDK stops and says so", async () => {
  const a = await client(gw1, "sam", "phone");
  const b = await client(gw2, "sam", "tablet");
  const bystander = await client(gw1, "other", "phone");
  const r = await api(gw2, "POST", "/v1/users/sam/disconnect", { mode: "signed_out", reason: "signed out elsewhere" });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  assert.deepEqual(r.json, { user: "sam", ended: 2, gateways: { answered: 2, live: 2, partial: false } });
  for (const x of [a, b]) {
    await waitFor("closed", () => x.c.state.type === "closed");
    assert.ok(x.events.some((e) => e.type === "signed_out" && e.reason === "signed out elsewhere"));
    assert.ok(x.events.some((e) => e.type === "closed" && e.code === CloseCode.SIGNED_OUT));
  }
  await sleep(800);
  assert.equal(a.c.state.type, "closed", "no reconnect after a sign-out");
  assert.equal(a.c.stats.reconnects, 0);
  assert.equal(bystander.c.state.type, "live", "another user's session is untouched");
});

test("users API - disconnect reconnect of one device: it comes back at once with a fresh token; the user's other device stays", async () => {
  const a = await client(gw1, "rita", "phone");
  const b = await client(gw2, "rita", "tablet");
  const t0 = Date.now();
  const r = await api(gw1, "POST", "/v1/users/rita/disconnect", { device: "phone", mode: "reconnect" });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  assert.deepEqual(r.json, { user: "rita", device: "phone", ended: 1, gateways: { answered: 2, live: 2, partial: false } });
  await waitFor("the phone reconnected", () => a.events.some((e) => e.type === "reconnect_requested") && a.c.state.type === "live" && a.c.stats.reconnects === 1);
  console.log(`  reconnect: live again ${Date.now() - t0} ms after the call`);
  assert.ok(a.events.some((e) => e.type === "closed" && e.code === CloseCode.RECONNECT_NOW));
  assert.equal(b.c.stats.reconnects, 0, "the tablet was not touched");
});

test("users API - revoke: live sessions with older tokens end on both gateways; old tokens refused at AUTH (also by a gateway started later) and REFRESH; newer ones accepted", async () => {
  const old = Math.floor(Date.now() / 1000) - 100;
  let iat = old;
  const a = await client(gw1, "vic", "phone", () => iat);
  const b = await client(gw2, "vic", "tablet", () => iat);
  // the app gets new tokens from now on: the SDK's reconnect picks one up (issued_before is the
  // second after the call's: a token minted in that second is refused too)
  iat = Math.floor(Date.now() / 1000) + 2;
  const r = await api(gw2, "POST", "/v1/users/vic/revoke", { mode: "reconnect" });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  assert.equal(r.json.ended, 2);
  assert.deepEqual(r.json.gateways, { answered: 2, live: 2, partial: false });
  const before = r.json.issued_before as number;
  assert.ok(Math.abs(before - Date.now() / 1000) < 5, "issued_before defaults to now");
  assert.ok((r.json.expires_at as number) > Date.now());
  for (const x of [a, b]) await waitFor("back with a new token", () => x.c.state.type === "live" && x.c.stats.reconnects >= 1);

  // an old token at AUTH, on each gateway and on one started after the revocation (it reads Redis)
  const gw3 = await spawnGateway(stack.infra.env);
  extra.push(gw3);
  for (const gw of [gw1, gw2, gw3]) {
    const d = await TestDevice.connect(gw.httpPort);
    d.send({ t: "AUTH", v: 1, token: await deviceToken("vic", { issuedAt: old }), device: "laptop" });
    const e = await d.next("ERROR");
    assert.equal(e.code, "UNAUTHORIZED");
    assert.match(e.msg, /token revoked/);
    await waitFor("closed 4401", () => d.closed?.code === CloseCode.UNAUTHENTICATED);
    // a token without iat cannot be shown to be newer
    const n = await TestDevice.connect(gw.httpPort);
    n.send({ t: "AUTH", v: 1, token: await deviceToken("vic", { issuedAt: null }), device: "laptop" });
    assert.match((await n.next("ERROR")).msg, /token revoked/);
  }
  // REFRESH with an old token on a session that AUTHed with a new one, on every gateway
  for (const gw of [gw1, gw2, gw3]) {
    const d = await TestDevice.connect(gw.httpPort);
    d.send({ t: "AUTH", v: 1, token: await deviceToken("vic", { issuedAt: before }), device: "watch" });
    await d.next("SYNCED");
    d.send({ t: "REFRESH", token: await deviceToken("vic", { issuedAt: old }) });
    assert.match((await d.next("ERROR")).msg, /refresh refused: token revoked/);
    await waitFor("closed 4401", () => d.closed?.code === CloseCode.UNAUTHENTICATED);
  }
  // another user's old token is fine
  const o = await TestDevice.connect(gw1.httpPort);
  o.send({ t: "AUTH", v: 1, token: await deviceToken("walt", { issuedAt: old }), device: "phone" });
  await o.next("SYNCED");
  o.ws.close();
  assert.ok((await gw1.metric("jetgate_gateway_auth_outcomes_total", { case: "revoked" })) >= 2);
});

test("users API - revoke one device's tokens: that device's sessions only; an earlier issued_before never lowers a later one", async () => {
  const now = Math.floor(Date.now() / 1000);
  const phone = await client(gw1, "dora", "phone", () => now - 50);
  const tablet = await client(gw2, "dora", "tablet", () => now - 50);
  const r = await api(gw1, "POST", "/v1/users/dora/revoke", { device: "phone", issued_before: now - 10, mode: "signed_out" });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  assert.deepEqual([r.json.ended, r.json.device, r.json.issued_before], [1, "phone", now - 10]);
  await waitFor("the phone signed out", () => phone.events.some((e) => e.type === "signed_out"));
  assert.equal(tablet.c.state.type, "live");
  const again = await api(gw2, "POST", "/v1/users/dora/revoke", { device: "phone", issued_before: now - 1000 });
  assert.equal(again.json.issued_before, now - 10, "the later revocation stays in force");
  assert.ok((again.json.expires_at as number) >= (r.json.expires_at as number), "nor its expiry");
  // what a device revocation binds: a token with `dev` only ever AUTHs as that device; the holder
  // of one without `dev` chooses its device id (docs/server-api.md: revoke the user to take access away)
  const authAs = async (device: string, dev: string | undefined) => {
    const d = await TestDevice.connect(gw1.httpPort);
    d.send({ t: "AUTH", v: 1, token: await deviceToken("dora", { issuedAt: now - 50, ...(dev !== undefined ? { device: dev } : {}) }), device });
    await waitFor("an answer", () => d.frames.some((f) => f.t === "SYNCED" || f.t === "ERROR"));
    d.ws.close();
    const e = d.frames.find((f) => f.t === "ERROR");
    return e?.t === "ERROR" ? e.msg : "accepted";
  };
  assert.equal(await authAs("phone", "phone"), "token revoked");
  assert.equal(await authAs("laptop", "phone"), "token is bound to another device");
  assert.equal(await authAs("phone", undefined), "token revoked");
  assert.equal(await authAs("laptop", undefined), "accepted", "a token without dev, under another device id");
  const redis = await redisClient(stack.infra.redis.url);
  try {
    assert.match((await redis.hget(keys.revocations(), "d:dora:phone")) ?? "", new RegExp(`^${now - 10}/\\d+$`));
  } finally {
    redis.disconnect();
  }
});

test("users API - revoke with the shortest lifetime (60 s): kept until a token issued a second before issued_before with exp - iat = 65 s can no longer be accepted", async () => {
  const gw = await spawnGateway(stack.infra.env, { JETGATE_JWT_MAX_LIFETIME_S: "60" });
  extra.push(gw);
  const token = (iat: number) => deviceToken("tess", { issuedAt: iat, expiresInS: iat + 65 - Math.floor(Date.now() / 1000) });
  const authWith = async (t: string) => {
    const d = await TestDevice.connect(gw.httpPort);
    d.send({ t: "AUTH", v: 1, token: t, device: "phone" });
    await waitFor("an answer", () => d.frames.some((f) => f.t === "SYNCED" || f.t === "ERROR"));
    d.ws.close();
    const e = d.frames.find((f) => f.t === "ERROR");
    return e?.t === "ERROR" ? e.msg : "accepted";
  };
  // 65 s is within the maximum and its 5 s of clock tolerance: such a token is good
  assert.equal(await authWith(await token(Math.floor(Date.now() / 1000))), "accepted");
  const r = await api(gw, "POST", "/v1/users/tess/revoke", {});
  assert.equal(r.status, 200, JSON.stringify(r.json));
  const iat = (r.json.issued_before as number) - 1;
  assert.equal(await authWith(await token(iat)), "token revoked");
  // the gateway would take it until 5 s after its exp (the same tolerance): the revocation must outlive that
  const acceptedUntil = (iat + 65 + 5) * 1000;
  assert.ok((r.json.expires_at as number) >= acceptedUntil, `expires_at ${r.json.expires_at as number} is ${acceptedUntil - (r.json.expires_at as number)} ms before the token can no longer be accepted`);
});

test("users API - presence: which devices are live, where and since when; it follows a device that moves to the other gateway", async () => {
  const t0 = Date.now();
  const m = await client(gw1, "pia", "phone");
  let r = await api(gw2, "GET", "/v1/users/pia/presence");
  assert.equal(r.status, 200, JSON.stringify(r.json));
  const seen = (r.json.users as Record<string, { device: string; gateway: string; since: number }[]>).pia!;
  assert.equal(seen.length, 1);
  assert.equal(seen[0]!.device, "phone");
  assert.ok(seen[0]!.since >= t0 - 1000 && seen[0]!.since <= Date.now());
  const firstGateway = seen[0]!.gateway;
  await m.c.close();
  await client(gw2, "pia", "phone");
  r = await api(gw1, "POST", "/v1/presence", { users: ["pia", "nobody"] });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  const users = r.json.users as Record<string, { gateway: string }[]>;
  assert.equal(users.pia!.length, 1, "one live session: the old one is gone");
  assert.notEqual(users.pia![0]!.gateway, firstGateway, "now on the other gateway");
  assert.deepEqual(users.nobody, []);
});

test("users API - mailbox: shard, epoch, log, head per lane and the trim watermark, as a device would see them", async () => {
  let last = 0n;
  for (let i = 0; i < 3; i++) {
    const [res] = await stack.dispatcher.dispatch({ dispatch_id: `mb${i}`, message_id: `mb${i}`, lane: "default", recipients: ["mona"], body: new Uint8Array(1) });
    assert.ok(res && !("error" in res));
    last = res.seq;
  }
  const shard = stack.registry.shards.shardOf("mona")!;
  const s = stack.registry.state.shards.get(shard)!;
  const r = await waitFor("the head", async () => {
    const x = await api(gw1, "GET", "/v1/users/mona/mailbox");
    return x.json.head === last.toString() ? x : undefined;
  });
  assert.equal(r.status, 200);
  assert.deepEqual(r.json, { user: "mona", shard, epoch: s.epoch, log: s.log, head: last.toString(), head_label: seqLabel(last), lanes: { default: last.toString() }, trim: "0" });
  const none = await api(gw1, "GET", "/v1/users/newbie/mailbox");
  assert.equal(none.json.head, "0");
});

test("users API - bad input and bounds: named 4xx, nothing done", async () => {
  const cases: [string, "GET" | "POST", string, unknown, number, RegExp, string?][] = [
    ["a bad user id", "POST", "/v1/users/a.b/disconnect", { mode: "signed_out" }, 400, /user id/, "user"],
    ["no mode", "POST", "/v1/users/sam/disconnect", {}, 400, /mode/, "mode"],
    ["an unknown mode", "POST", "/v1/users/sam/disconnect", { mode: "kick" }, 400, /mode/, "mode"],
    ["an unknown field", "POST", "/v1/users/sam/disconnect", { mode: "reconnect", extra: 1 }, 400, /unrecognized|extra/i],
    ["a bad device id", "POST", "/v1/users/sam/revoke", { device: "a b" }, 400, /device id/, "device"],
    ["a reason that is not printable ASCII", "POST", "/v1/users/sam/disconnect", { mode: "reconnect", reason: "bye\n" }, 400, /printable/, "reason"],
    ["a reason too long", "POST", "/v1/users/sam/disconnect", { mode: "reconnect", reason: "x".repeat(101) }, 400, /reason/, "reason"],
    ["issued_before not an integer", "POST", "/v1/users/sam/revoke", { issued_before: 1.5 }, 400, /issued_before/, "issued_before"],
    // a later call cannot lower it: one far ahead would lock the user out until then
    ["issued_before an hour ahead", "POST", "/v1/users/sam/revoke", { issued_before: Math.floor(Date.now() / 1000) + 3600 }, 400, /^issued_before: \d+ is 3[56]\d\d s ahead; at most 60 s ahead is taken/, "issued_before"],
    ["issued_before in ms", "POST", "/v1/users/sam/revoke", { issued_before: Date.now() }, 400, /it looks like milliseconds: issued_before is in unix seconds/, "issued_before"],
    ["not JSON", "POST", "/v1/users/sam/disconnect", "{mode:", 400, /not JSON/],
    ["no users", "POST", "/v1/presence", { users: [] }, 400, /users/, "users"],
    ["101 users", "POST", "/v1/presence", { users: Array.from({ length: 101 }, (_, i) => `u${i}`) }, 400, /users/, "users"],
    ["a body too large", "POST", "/v1/presence", { users: ["a"], pad: "x".repeat(20_000) }, 413, /over 16384 bytes/],
  ];
  for (const [what, method, path, body, status, msg, field] of cases) {
    const r = await api(gw1, method, path, body);
    assert.equal(r.status, status, `${what}: ${JSON.stringify(r.json)}`);
    assert.match(String(r.json.error), msg, what);
    if (field !== undefined) assert.equal(r.json.field, field, what);
  }
  const wrong = await api(gw1, "GET", "/v1/users/sam/presence", undefined, "nope");
  assert.deepEqual([wrong.status, wrong.json.error], [401, "wrong bearer token"]);
  const redis = await redisClient(stack.infra.redis.url);
  try {
    assert.equal(await redis.hget(keys.revocations(), "u:sam"), null, "no revocation was recorded");
  } finally {
    redis.disconnect();
  }
});

interface EntriesPage { case: string; reason?: string; trim?: string; entries: { seq: string; id: string; lane: string; ts: number; body_b64: string }[]; next: string; more: boolean }

async function page(user: string, q: Record<string, string | number> = {}): Promise<EntriesPage> {
  const qs = new URLSearchParams(Object.entries(q).map(([k, v]) => [k, String(v)])).toString();
  const r = await api(gw1, "GET", `/v1/users/${user}/entries${qs ? `?${qs}` : ""}`);
  assert.equal(r.status, 200, JSON.stringify(r.json));
  return r.json as unknown as EntriesPage;
}

async function send(user: string, ids: string[], lane = "default"): Promise<bigint[]> {
  const seqs: bigint[] = [];
  for (const id of ids) {
    const [res] = await stack.dispatcher.dispatch({ dispatch_id: id, message_id: id, lane, recipients: [user], body: new TextEncoder().encode(id) });
    assert.ok(res && !("error" in res), `dispatch ${id} failed`);
    seqs.push(res.seq);
  }
  // processed by the worker: its row in the user's hot cache (the mailbox API's head may come from
  // the stream before the worker has got there, and a read answers what the worker has processed)
  const want = cacheStreamId(seqs.at(-1)!);
  const redis = await redisClient(stack.infra.redis.url);
  try {
    await waitFor("processed", async () => (await redis.xrevrange(keys.hotCache(user), "+", "-", "COUNT", 1))[0]?.[0] === want);
  } finally {
    redis.disconnect();
  }
  return seqs;
}

/** What a device that AUTHs with the page position `next` is told: the ERROR case (if any) and the ids it gets until SYNCED. */
async function deviceAnswer(user: string, next: string): Promise<{ error: string | undefined; ids: string[] }> {
  const p = JSON.parse(Buffer.from(next, "base64url").toString()) as { shard: number; epoch: number; log: string; seq: string; sig: string };
  const d = await TestDevice.connect(gw2.httpPort);
  d.send({ t: "AUTH", v: 1, token: await deviceToken(user), device: "probe", cursor: { shard: p.shard, epoch: p.epoch, log: p.log, seq: BigInt(p.seq), sig: new Uint8Array(Buffer.from(p.sig, "base64url")) } });
  await d.next("SYNCED");
  const error = d.frames.find((f) => f.t === "ERROR");
  d.ws.close();
  return { error: error?.t === "ERROR" ? error.code : undefined, ids: d.entries().map((e) => e.id) };
}

test("users API - entries: pages from the start, a lane at a time, then what came since; each entry once, in order", async () => {
  await send("erin", ["e1", "e2", "e3", "e4", "e5"]);
  await send("erin", ["c1", "c2"], "chat");
  const first = await page("erin", { limit: 3 });
  assert.deepEqual([first.case, first.entries.map((e) => e.id), first.more], ["fresh", ["e1", "e2", "e3"], true]);
  assert.equal(Buffer.from(first.entries[0]!.body_b64, "base64").toString(), "e1");
  const second = await page("erin", { limit: 3, next: first.next });
  assert.deepEqual([second.case, second.entries.map((e) => e.id), second.more], ["normal", ["e4", "e5", "c1"], true]);
  const third = await page("erin", { limit: 3, next: second.next });
  assert.deepEqual([third.entries.map((e) => e.id), third.more], [["c2"], false]);
  const seqs = [...first.entries, ...second.entries, ...third.entries].map((e) => BigInt(e.seq));
  assert.deepEqual(seqs, [...seqs].sort((a, b) => (a < b ? -1 : 1)));
  assert.deepEqual((await page("erin", { next: third.next })).entries, [], "nothing new yet");
  await send("erin", ["e6"]);
  assert.deepEqual((await page("erin", { next: third.next })).entries.map((e) => e.id), ["e6"]);
  assert.deepEqual((await page("erin", { lane: "chat" })).entries.map((e) => e.id), ["c1", "c2"]);
  const chat = await page("erin", { lane: "chat", limit: 2 });
  assert.equal(chat.more, true, "the read stopped at its limit");
});

test("users API - entries across an E1 rebase and a split: the same case and the same entries a device gets with that position", async () => {
  const shardOf = (u: string) => stack.registry.shards.shardOf(u)!;
  // a user in the upper half of its shard's range (a split moves the upper half)
  const user = Array.from({ length: 200 }, (_, i) => `split${i}`).find((u) => {
    const s = stack.registry.state.shards.get(shardOf(u))!;
    const h = userHash(u);
    return h > s.range.lo + Math.floor((s.range.hi - s.range.lo) / 2);
  })!;
  await send(user, ["s1", "s2"]);
  const before = await page(user);
  assert.deepEqual(before.entries.map((e) => e.id), ["s1", "s2"]);
  // E1 by hand: a new epoch on the same log
  const shard = shardOf(user);
  const epoch = stack.registry.state.shards.get(shard)!.epoch;
  const t = await runCli(stack.infra.env, ["shard", "takeover", String(shard)]);
  assert.equal(t.code, 0, t.text);
  await waitFor("the worker took the new epoch", async () => (await stack.registry.sync()).shards.get(shard)!.owner !== null && stack.registry.state.shards.get(shard)!.epoch > epoch, { timeoutMs: 15_000 });
  await send(user, ["s3"]);
  const rebased = await page(user, { next: before.next });
  assert.equal(rebased.case, "rebased");
  assert.deepEqual(rebased.entries.map((e) => e.id), ["s3"]);
  assert.deepEqual(await deviceAnswer(user, before.next), { error: "CURSOR_REBASED", ids: ["s3"] });
  // a split moves the user to a new shard; entries after it go there
  const sp = await runCli(stack.infra.env, ["shard", "split", String(shard)]);
  assert.equal(sp.code, 0, sp.text);
  await waitFor("the user moved", async () => (await stack.registry.sync(), shardOf(user) !== shard), { timeoutMs: 15_000 });
  await send(user, ["s4"]);
  const split = await page(user, { next: before.next });
  assert.equal(split.case, "split");
  assert.deepEqual(split.entries.map((e) => e.id), ["s3", "s4"], "the old shard's rest, then the new shard's");
  assert.deepEqual(await deviceAnswer(user, before.next), { error: "CURSOR_REBASED", ids: ["s3", "s4"] });
  const after = await page(user, { next: split.next });
  assert.deepEqual([after.case, after.entries], ["normal", []]);
});

test("users API - entries: bad positions, limits and lanes are 400 naming the field; another user's position is `invalid` and starts over", async () => {
  for (const [q, field] of [[{ next: "nope!" }, "next"], [{ next: Buffer.from("{}").toString("base64url") }, "next"], [{ limit: 0 }, "limit"], [{ limit: 1001 }, "limit"], [{ limit: "x" }, "limit"], [{ lane: "nope" }, "lane"], [{ cursor: "1" }, undefined]] as const) {
    const qs = new URLSearchParams(Object.entries(q).map(([k, v]) => [k, String(v)])).toString();
    const r = await api(gw1, "GET", `/v1/users/erin/entries?${qs}`);
    assert.equal(r.status, 400, `${qs}: ${JSON.stringify(r.json)}`);
    if (field !== undefined) assert.equal(r.json.field, field, qs);
  }
  const erins = await page("erin", { limit: 1 });
  const stolen = await page("mallory", { next: erins.next });
  assert.equal(stolen.case, "invalid");
  assert.match(stolen.reason ?? "", /signature/);
});

test("users API - off without a service token (503); rate-limited per gateway (429 with Retry-After); a revocation Redis does not take is 503 and done nowhere", async () => {
  const off = await spawnGateway({ ...stack.infra.env, JETGATE_SERVICE_TOKEN: "" });
  extra.push(off);
  const r = await api(off, "GET", "/v1/users/sam/presence");
  assert.equal(r.status, 503);
  assert.match(String(r.json.error), /JETGATE_SERVICE_TOKEN/);

  const slow = await spawnGateway({ ...stack.infra.env, JETGATE_USERS_API_RATE_PER_S: "2" });
  extra.push(slow);
  const answers = await Promise.all(Array.from({ length: 4 }, () => api(slow, "GET", "/v1/users/sam/mailbox")));
  const limited = answers.filter((a) => a.status === 429);
  assert.ok(limited.length >= 1, `statuses ${answers.map((a) => a.status).join(",")}`);
  assert.equal(limited[0]!.headers.get("retry-after"), "1");
  assert.match(String(limited[0]!.json.error), /JETGATE_USERS_API_RATE_PER_S/);

  // Redis gone: the revocation is refused, and no gateway heard of it
  const live = await client(gw1, "ursula", "phone");
  await stack.infra.redis.stop();
  try {
    const refused = await api(gw1, "POST", "/v1/users/ursula/revoke", {});
    assert.equal(refused.status, 503, JSON.stringify(refused.json));
    assert.match(String(refused.json.error), /nothing was revoked/);
    assert.equal(refused.headers.get("retry-after"), "2");
    await sleep(300);
    assert.equal(live.c.state.type, "live", "no session ended");
  } finally {
    await stack.infra.redis.start();
  }
});
