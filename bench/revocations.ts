/**
 * What token revocations in force cost a gateway's event loop and a revoke call (issue 39, defect 3).
 * Writes `--revocations` revocations of distinct users into the harness's redis-server, starts one
 * real gateway (which loads them before it is ready), connects a device that sends a PING every
 * 100 ms for `--seconds` (65 by default: more than two of the gateway's 30 s revocation syncs)
 * and measures each PONG's delay, and the gateway's own longest event-loop delay over that time
 * (its `nodejs_eventloop_lag_max_seconds`); meanwhile a revoke call every 5 s, timed over HTTP
 * and, by Redis's SLOWLOG, the revoke script's own time in Redis. Then, in this process, the
 * longest step of the gateway's sync while it loads them all, and one prune step (syncSteps):
 * on a shared machine the PONG delays carry its other load, which these do not.
 *
 *   npm run bench:revocations -- [--revocations 200000] [--seconds 65] [--json]
 *   npm run bench:revocations -- --revocations 1000000
 */
import { parseArgs } from "node:util";
import WebSocket from "ws";
import { REVOCATION_LOG_MAXLEN, REVOCATION_SWEEP_COUNT, RedisKeys, decodeServerFrame, encodeFrame } from "../protocol/index.js";
import { PRUNE_STEP, RevocationStore, RevocationSync, type RevocationSink } from "../gateway/hub/revocation-sync.js";
import { Revocations } from "../gateway/hub/revocations.js";
import { deviceToken } from "../test/harness/device.js";
import { initStack, redisClient, spawnGateway, startInfra, type JetgateProcess, type ScriptedTestRedis } from "../test/harness/stack.js";
import { waitFor } from "../test/harness/wait.js";

const { values } = parseArgs({
  options: {
    revocations: { type: "string", default: "200000" },
    seconds: { type: "string", default: "65" },
    json: { type: "boolean", default: false },
  },
});
const count = Number(values.revocations);
const seconds = Number(values.seconds);
const TOKEN = "bench-revocations";
const PING_EVERY_MS = 100;
const REVOKE_EVERY_MS = 5000;

/**
 * The revocations as the revoke calls of many users leave them in Redis (the users `bench<i>`,
 * tokens before now, kept a day): the revoke script itself, pipelined 10,000 at a time.
 */
async function fill(redis: ScriptedTestRedis, keys: RedisKeys): Promise<void> {
  const now = Date.now();
  const before = Math.floor(now / 1000);
  for (let i = 0; i < count; i += 10_000) {
    const p = redis.pipeline() as unknown as { jgRevoke(...a: Parameters<ScriptedTestRedis["jgRevoke"]>): void; exec(): Promise<unknown> };
    for (let j = i; j < Math.min(count, i + 10_000); j++) {
      p.jgRevoke(keys.revocations(), keys.revocationLog(), `u:bench${j}`, before, now + 86_400_000, now, REVOCATION_LOG_MAXLEN, REVOCATION_SWEEP_COUNT);
    }
    await p.exec();
  }
}

function quantile(sorted: number[], p: number): number {
  return Number((sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))] ?? 0).toFixed(1));
}

/** PINGs every 100 ms until `untilMs`; resolves with each one's delay (ms; a PONG that never came: until the end). */
async function pingFor(port: number, untilMs: number): Promise<number[]> {
  const ws = new WebSocket(`ws://127.0.0.1:${port}/v1/ws`);
  ws.binaryType = "nodebuffer";
  await new Promise<void>((resolve, reject) => {
    ws.once("open", resolve);
    ws.once("error", reject);
  });
  const sent = new Map<number, number>();
  const delays: number[] = [];
  let synced = false;
  ws.on("message", (data: Buffer) => {
    const f = decodeServerFrame(new Uint8Array(data));
    if (f.t === "SYNCED") synced = true;
    if (f.t !== "PONG" || f.id === undefined) return;
    const t = sent.get(f.id);
    if (t === undefined) return;
    delays.push(performance.now() - t);
    sent.delete(f.id);
  });
  ws.send(encodeFrame({ t: "AUTH", v: 1, token: await deviceToken("probe"), device: "probe" }));
  await waitFor("the probe device SYNCED", () => synced);
  let id = 0;
  await new Promise<void>((resolve) => {
    const timer = setInterval(() => {
      if (Date.now() >= untilMs) {
        clearInterval(timer);
        return resolve();
      }
      sent.set(++id, performance.now());
      ws.send(encodeFrame({ t: "PING", id }));
    }, PING_EVERY_MS);
  });
  await new Promise((r) => setTimeout(r, 1000));
  for (const t of sent.values()) delays.push(performance.now() - t);
  ws.close();
  return delays;
}

/** Revoke calls every 5 s until `untilMs`; each one's HTTP time (ms). */
async function revokeEvery(gw: JetgateProcess, untilMs: number): Promise<number[]> {
  const times: number[] = [];
  for (let i = 0; Date.now() < untilMs - REVOKE_EVERY_MS; i++) {
    await new Promise((r) => setTimeout(r, REVOKE_EVERY_MS));
    const t0 = performance.now();
    const res = await fetch(`http://127.0.0.1:${gw.httpPort}/v1/users/probe-r${i}/revoke`, {
      method: "POST", headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" }, body: "{}",
    });
    if (res.status !== 200) throw new Error(`revoke answered ${res.status}: ${await res.text()}`);
    times.push(performance.now() - t0);
  }
  return times;
}

/** From SLOWLOG (every command logged): the revoke scripts' times and the longest command, in µs. */
async function redisTimes(redis: ScriptedTestRedis): Promise<{ revokeUs: number[]; longestUs: number; longest: string }> {
  const log = (await redis.call("SLOWLOG", "GET", "-1")) as [number, number, number, string[]][];
  // a script's own commands are logged too: its EVALSHA is the whole
  const revokeUs = log.filter((e) => /^eval/i.test(e[3][0] ?? "") && e[3].some((a) => a.includes("probe-r"))).map((e) => e[2]);
  const top = log.reduce((m, e) => (e[2] > m[2] ? e : m), log[0] ?? [0, 0, 0, []]);
  return { revokeUs, longestUs: top[2], longest: top[3].slice(0, 2).join(" ") };
}

/**
 * In this process, on an otherwise idle event loop, the work the gateway's sync does in one turn:
 * the longest stretch between two of its Redis round trips while it loads every revocation
 * (parsing and adding a chunk), and one prune step (forgetting PRUNE_STEP expired revocations).
 */
async function syncSteps(redis: ScriptedTestRedis, keys: RedisKeys): Promise<{ load_s: number; load_step_max_ms: number; prune_step_ms: number }> {
  const store = new RevocationStore(redis, keys);
  let resolvedAt = 0;
  let longest = 0;
  const timed = <A extends unknown[], R>(f: (...a: A) => Promise<R>) => async (...a: A): Promise<R> => {
    if (resolvedAt > 0) longest = Math.max(longest, performance.now() - resolvedAt);
    const r = await f(...a);
    resolvedAt = performance.now();
    return r;
  };
  const list = new Revocations();
  const quiet = { loaded: () => undefined, changes: () => undefined, malformed: () => undefined, hashGone: () => undefined };
  const sync = new RevocationSync({ version: timed(() => store.version()), scan: timed((c: string, sink: RevocationSink) => store.scan(c, sink)), logBackwards: timed((id: string | undefined) => store.logBackwards(id)) }, list, quiet);
  const t0 = performance.now();
  await sync.sync();
  const loadS = (performance.now() - t0) / 1000;
  const expiring = new Revocations();
  for (let i = 0; i < Math.max(count, PRUNE_STEP); i++) expiring.add({ user: `e${i}`, before: 1, expires: 1 + (i % 1000) });
  const p0 = performance.now();
  expiring.prune(2000, PRUNE_STEP);
  return { load_s: Number(loadS.toFixed(2)), load_step_max_ms: Number(longest.toFixed(2)), prune_step_ms: Number((performance.now() - p0).toFixed(2)) };
}

const infra = await startInfra({ JETGATE_SERVICE_TOKEN: TOKEN, JETGATE_LOG_LEVEL: "warn" });
const keys = new RedisKeys("jg");
let gw: JetgateProcess | undefined;
try {
  await initStack(infra.env);
  const redis = await redisClient(infra.redis.url);
  let t0 = performance.now();
  await fill(redis, keys);
  const fillS = (performance.now() - t0) / 1000;
  process.env.HARNESS_READY_MS = "300000";
  t0 = performance.now();
  gw = await spawnGateway(infra.env);
  const readyS = (performance.now() - t0) / 1000;
  await redis.config("SET", "slowlog-max-len", "100000");
  await redis.config("SET", "slowlog-log-slower-than", "0");
  await redis.slowlog("RESET");
  const until = Date.now() + seconds * 1000;
  await gw.metric("jetgate_gateway_nodejs_eventloop_lag_max_seconds"); // a scrape resets it
  const [delays, revokeMs] = await Promise.all([pingFor(gw.httpPort, until), revokeEvery(gw, until)]);
  const loopMaxMs = (await gw.metric("jetgate_gateway_nodejs_eventloop_lag_max_seconds")) * 1000;
  const rt = await redisTimes(redis);
  await gw.kill();
  const steps = await syncSteps(redis, keys);
  redis.disconnect();
  const sorted = delays.sort((a, b) => a - b);
  const r = {
    revocations: count, seconds, fill_s: Number(fillS.toFixed(1)), gateway_ready_s: Number(readyS.toFixed(1)),
    pings: sorted.length, pong_p50_ms: quantile(sorted, 0.5), pong_p99_ms: quantile(sorted, 0.99), pong_max_ms: quantile(sorted, 1),
    pongs_over_50ms: sorted.filter((d) => d > 50).length, gateway_loop_delay_max_ms: Number(loopMaxMs.toFixed(1)),
    revoke_http_ms: revokeMs.map((m) => Number(m.toFixed(1))), revoke_script_us: rt.revokeUs,
    redis_longest_us: rt.longestUs, redis_longest: rt.longest,
    ...Object.fromEntries(Object.entries(steps).map(([k, v]) => [`in_process_${k}`, v])),
  };
  if (values.json) console.log(JSON.stringify({ bench: "revocations", ...r }));
  else console.log(`revocations ${Object.entries(r).map(([k, v]) => `${k}=${Array.isArray(v) ? v.join(",") : v}`).join("  ")}`);
} finally {
  await gw?.kill();
  await infra.dispose();
}
