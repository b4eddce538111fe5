import { test, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { NatsServer, OLD_NATS_BIN, RedisServer, freePort } from "../harness/servers.js";
import { waitFor } from "../harness/wait.js";

const ROOT = new URL("../../", import.meta.url);
const [nats, redis] = await Promise.all([NatsServer.start(), RedisServer.start()]);
after(async () => {
  await nats.dispose();
  await redis.dispose();
});

/** `npm start` (scripts/start.ts) against `natsUrl` and the test's Redis, on free ports; `out()` is all it printed. */
async function npmStart(natsUrl: string, extra: Record<string, string> = {}) {
  const env = {
    PATH: process.env.PATH ?? "",
    JETGATE_NATS_URL: natsUrl,
    JETGATE_REDIS_URL: redis.url,
    JETGATE_GATEWAY_PORT: String(await freePort()),
    JETGATE_WORKER_HTTP_PORT: String(await freePort()),
    JETGATE_GATEWAY_METRICS_PORT: String(await freePort()),
    ...extra,
  };
  const start = spawn(process.execPath, ["--import", "tsx", "scripts/start.ts", "--state-dir", mkdtempSync(join(tmpdir(), "jetgate-demo-"))], { cwd: ROOT, env });
  let text = "";
  start.stdout.on("data", (d: Buffer) => (text += d.toString()));
  start.stderr.on("data", (d: Buffer) => (text += d.toString()));
  return { env, start, out: () => text };
}

test("npm start - the whole stack comes up, the demo device prints what npm run dispatch sends, Ctrl-C stops it all", async () => {
  const { env, start, out } = await npmStart(nats.url);
  try {
    await waitFor("the welcome entry at the demo device", () => out().includes('body="welcome to jetgate"'), { timeoutMs: 60_000 });
    assert.match(out(), /using NATS at/);
    assert.match(out(), /registry initialised with 4 shards/);
    const d = spawnSync(process.execPath, ["--import", "tsx", "scripts/dispatch.ts", "--to", "demo", "--text", "hello there"], { cwd: ROOT, env, encoding: "utf8" });
    assert.equal(d.status, 0, d.stderr);
    assert.match(d.stdout, /^demo: shard \d+ seq \d+ \(\d+:\d+\) offset \d+/m, "the seq with its epoch:offset");
    await waitFor("the dispatched entry at the demo device", () => out().includes('body="hello there"'), { timeoutMs: 20_000 });
    const bad = spawnSync(process.execPath, ["--import", "tsx", "scripts/dispatch.ts", "--to", "a.b", "--text", "x"], { cwd: ROOT, env, encoding: "utf8" });
    assert.equal(bad.status, 64);
    assert.match(bad.stderr, /recipients\.0: user id/);
  } finally {
    start.kill("SIGINT");
  }
  const code = await new Promise<number | null>((r) => start.once("exit", r));
  assert.equal(code, 0, out().slice(-2000));
  assert.match(out(), /\[start\] stopping/);
  // a fresh Redis is no loss: the worker set is new, nothing was lost
  assert.doesNotMatch(out(), /lost the worker set/);
});

test("npm start - a nats-server older than 2.12.1 at JETGATE_NATS_URL is named and left alone: the pinned one starts beside it", async () => {
  const old = await NatsServer.start({ bin: OLD_NATS_BIN });
  const { start, out } = await npmStart(old.url, { JETGATE_REDIS_PREFIX: "oldnats" });
  try {
    await waitFor("the welcome entry at the demo device", () => out().includes('body="welcome to jetgate"'), { timeoutMs: 90_000 });
    assert.match(out(), new RegExp(`not using NATS at 127\\.0\\.0\\.1:${old.port}: nats-server 2\\.9\\.\\d+ is too old: jetgate needs 2\\.12\\.1 or later .*; starting the pinned nats-server v2\\.15\\.2 on \\d+ instead`));
    assert.match(out(), /starting nats-server v2\.15\.2 \(JetStream\)/);
  } finally {
    start.kill("SIGINT");
  }
  const code = await new Promise<number | null>((r) => start.once("exit", r));
  await old.dispose();
  assert.equal(code, 0, out().slice(-2000));
});
