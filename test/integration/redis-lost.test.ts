/**
 * One gateway cut off from Redis while NATS still reaches it (a TCP proxy between that gateway and
 * Redis black-holes: the connection stays, nothing answers). Its Redis beats stop, so Redis no
 * longer counts it live, yet it holds its devices and answers on NATS:
 * - on another gateway, presence lists its devices and disconnect ends them, every time, and the
 *   answer says it is whole only when every gateway there was to ask answered;
 * - on that gateway, every route of the users API and the console answers within
 *   JETGATE_DEPENDENCY_TIMEOUT_MS and a little: what needs only NATS answers (partial where Redis
 *   would have been needed to be sure), what needs Redis is 503 with Retry-After;
 * - healed, it answers whole again.
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import WebSocket from "ws";
import { CloseCode, RedisKeys } from "../../protocol/index.js";
import { JetgateClient, MemoryCursorStore, type ClientEvent, type WebSocketFactory } from "../../client/index.js";
import { startStack, spawnGateway, redisClient, type JetgateProcess } from "../harness/stack.js";
import { deviceToken } from "../harness/device.js";
import { TcpProxy } from "../harness/proxy.js";
import { waitFor } from "../harness/wait.js";

const TOKEN = "redis-lost-secret";
const ADMIN = "redis-lost-admin-token";
const TIMEOUT_MS = 1000;
const stack = await startStack({ env: { JETGATE_SERVICE_TOKEN: TOKEN, JETGATE_DEPENDENCY_TIMEOUT_MS: String(TIMEOUT_MS) }, gateway: {} });
const gw1 = stack.gateway!;
const proxy = await TcpProxy.start(stack.infra.redis.port);
const gw2 = await spawnGateway(stack.infra.env, { JETGATE_REDIS_URL: `redis://127.0.0.1:${proxy.port}`, JETGATE_ADMIN_TOKEN: ADMIN });
const redis = await redisClient(stack.infra.redis.url);
const clients: JetgateClient[] = [];
after(async () => {
  for (const c of clients) await c.close();
  await gw2.kill();
  await proxy.close();
  redis.disconnect();
  await stack.dispose();
});

type Api = { status: number; json: Record<string, unknown>; headers: Headers; ms: number };

async function api(gw: JetgateProcess, method: "GET" | "POST", path: string, body?: unknown, auth = `Bearer ${TOKEN}`): Promise<Api> {
  const t0 = performance.now();
  const res = await fetch(`http://127.0.0.1:${gw.httpPort}${path}`, {
    method,
    headers: { authorization: auth, "content-type": "application/json" },
    ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
    signal: AbortSignal.timeout(15_000),
  });
  const json = (await res.json()) as Record<string, unknown>;
  return { status: res.status, json, headers: res.headers, ms: performance.now() - t0 };
}

async function client(gw: JetgateProcess, user: string, device: string) {
  const events: ClientEvent[] = [];
  const c = new JetgateClient({
    url: `ws://127.0.0.1:${gw.httpPort}/v1/ws`, device, token: () => deviceToken(user), store: new MemoryCursorStore(),
    onEntry: () => undefined, WebSocket: WebSocket as unknown as WebSocketFactory, backoff: { baseMs: 200, capMs: 1000 },
  });
  c.on((e) => void events.push(e));
  clients.push(c);
  await c.start();
  await waitFor(`${user}/${device} live`, () => c.state.type === "live");
  return { c, events };
}

const keys = new RedisKeys("jg");
/** Whether Redis counts `gateway` live (a beat within GATEWAY_LIVENESS.liveWithinS), as the users API reads it. */
async function liveInRedis(gateway: string): Promise<boolean> {
  const [now, ...rest] = await redis.jgGatewaysSeen(keys.gateways());
  for (let i = 0; i + 1 < rest.length; i += 2) if (rest[i] === gateway && Number(rest[i + 1]) >= Number(now) - 5) return true;
  return false;
}

let gw2Id = "";

test("redis lost by one gateway - presence on another lists that gateway's devices every time; disconnect ends them and counts them", async () => {
  await client(gw1, "pat", "tablet");
  const phone = await client(gw2, "pat", "phone");
  // a gateway's first answers are partial until it has listened to two rounds of beats
  let before!: Api;
  await waitFor("a whole answer", async () => ((before = await api(gw1, "GET", "/v1/users/pat/presence")).json.gateways as { partial: boolean }).partial === false);
  assert.equal(before.status, 200);
  const listed = (before.json.users as Record<string, { device: string; gateway: string }[]>).pat!;
  gw2Id = listed.find((s) => s.device === "phone")!.gateway;
  assert.deepEqual(before.json.gateways, { answered: 2, live: 2, partial: false });

  proxy.blackhole();
  await waitFor("Redis no longer counts the cut-off gateway live", async () => !(await liveInRedis(gw2Id)), { timeoutMs: 15_000, intervalMs: 250 });
  const answers: Api[] = [];
  for (let i = 0; i < 10; i++) answers.push(await api(gw1, "GET", "/v1/users/pat/presence"));
  for (const a of answers) {
    assert.equal(a.status, 200);
    const devices = (a.json.users as Record<string, { device: string }[]>).pat!.map((s) => s.device).sort();
    assert.deepEqual(devices, ["phone", "tablet"], `every answer lists the device on the gateway without Redis: ${JSON.stringify(a.json)}`);
    assert.deepEqual(a.json.gateways, { answered: 2, live: 2, partial: false });
  }
  const many = await api(gw1, "POST", "/v1/presence", { users: ["pat"] });
  assert.equal((many.json.users as Record<string, unknown[]>).pat!.length, 2);

  const ended = await api(gw1, "POST", "/v1/users/pat/disconnect", { device: "phone", mode: "signed_out" });
  assert.equal(ended.status, 200, JSON.stringify(ended.json));
  assert.deepEqual(ended.json, { user: "pat", device: "phone", ended: 1, gateways: { answered: 2, live: 2, partial: false } });
  await waitFor("the phone was closed as signed out", () => phone.events.some((e) => e.type === "closed" && e.code === CloseCode.SIGNED_OUT));
});

test("redis lost by one gateway - on that gateway every route answers within the dependency timeout: NATS-only ones answer (partial), Redis ones 503 with Retry-After", async () => {
  assert.equal(proxy.mode, "blackhole");
  const limit = TIMEOUT_MS + 400;
  const presence = await api(gw2, "GET", "/v1/users/pat/presence");
  assert.equal(presence.status, 200, JSON.stringify(presence.json));
  assert.deepEqual((presence.json.users as Record<string, { device: string }[]>).pat!.map((s) => s.device), ["tablet"]);
  assert.equal((presence.json.gateways as { partial: boolean }).partial, true, "without Redis's beat set it cannot know every gateway was asked");
  const answers: [string, Api, number][] = [
    ["presence", presence, 200],
    ["presence list", await api(gw2, "POST", "/v1/presence", { users: ["pat"] }), 200],
    ["disconnect", await api(gw2, "POST", "/v1/users/nobody/disconnect", { mode: "reconnect" }), 200],
    ["dispatch", await api(gw2, "POST", "/v1/dispatch", { dispatch_id: "lost-1", message_id: "lost-1", lane: "default", recipients: ["pat"], body: "x" }), 200],
    ["mailbox", await api(gw2, "GET", "/v1/users/pat/mailbox"), 503],
    ["entries", await api(gw2, "GET", "/v1/users/pat/entries"), 503],
    ["revoke", await api(gw2, "POST", "/v1/users/pat/revoke", {}), 503],
    ["console user lookup", await api(gw2, "GET", "/admin/api/user/pat", undefined, `Bearer ${ADMIN}`), 503],
  ];
  for (const [route, a, status] of answers) {
    console.log(`  ${route}: ${a.status} in ${Math.round(a.ms)} ms`);
    assert.equal(a.status, status, `${route}: ${JSON.stringify(a.json)}`);
    assert.ok(a.ms < limit, `${route} answered in ${Math.round(a.ms)} ms, over ${limit}`);
    if (status === 503) {
      assert.match(a.headers.get("retry-after") ?? "", /^\d+$/, `${route}: Retry-After`);
      assert.equal(typeof a.json.error, "string", `${route}: says why`);
    }
  }
  assert.equal((answers[2]![1].json.gateways as { partial: boolean }).partial, true);
});

test("redis lost by one gateway - healed, it answers whole again", async () => {
  proxy.heal();
  await waitFor("the healed gateway counts live in Redis again", () => liveInRedis(gw2Id), { timeoutMs: 30_000, intervalMs: 250 });
  await waitFor("its mailbox route answers", async () => (await api(gw2, "GET", "/v1/users/pat/mailbox")).status === 200, { timeoutMs: 15_000, intervalMs: 250 });
  const p = await api(gw2, "GET", "/v1/users/pat/presence");
  assert.deepEqual(p.json.gateways, { answered: 2, live: 2, partial: false });
});
