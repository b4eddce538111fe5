import { test, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { bumpEpoch, composeSeq, encodePush, encodePushBatch, pack, routedPushSubject, type Entry } from "../../protocol/index.js";
import { startStack } from "../harness/stack.js";
import { TestDevice, deviceToken } from "../harness/device.js";
import { waitFor } from "../harness/wait.js";
import { BINARY, brokenUwsPackage } from "../harness/uws.js";

// No worker here: this test publishes the pushes itself, so it can withhold one.
const stack = await startStack({
  env: { JETGATE_MAX_PAYLOAD: "1024", JETGATE_RATE_FRAMES_PER_S: "50", JETGATE_RATE_BURST: "100", JETGATE_MAX_CONNS_PER_USER: "3", JETGATE_DRAIN_MS: "1500" },
  worker: false,
  gateway: { JETGATE_GATEWAY_ID: "edge-gw" },
});
after(() => stack.dispose());
const { infra, nc, registry, dispatcher } = stack;
const gateway = stack.gateway!;

async function authed(user: string, device = "d1"): Promise<TestDevice> {
  const dev = await TestDevice.connect(gateway.httpPort);
  dev.send({ t: "AUTH", v: 1, token: await deviceToken(user), device });
  await dev.next("SYNCED");
  return dev;
}

/** Appends an entry and returns it as the shard's owner would push it (under the registry's epoch). */
async function append(user: string, id: string): Promise<{ entry: Entry; shard: number; offset: number }> {
  const [r] = await dispatcher.dispatch({ dispatch_id: id, message_id: id, lane: "default", recipients: [user], body: new TextEncoder().encode(id) });
  assert.ok(r && "seq" in r);
  return { shard: r.shard, offset: r.offset, entry: { seq: r.seq, id, lane: "default", prev: null, ts: Date.now(), b: new TextEncoder().encode(id) } };
}

function push(user: string, a: { entry: Entry; shard: number }, prevAll: bigint | null, epoch = registry.state.shards.get(a.shard)!.epoch): void {
  nc.publish(routedPushSubject("edge-gw"), encodePushBatch([encodePush({ user, shard: a.shard, epoch, entry: a.entry, prevAll })]));
}

test("gateway edge - a lost push is detected by pa and filled from the stream before the next entry", async () => {
  const gapFills = await gateway.metric("jetgate_gateway_gap_fills_total");
  const duplicates = await gateway.metric("jetgate_gateway_duplicates_dropped_total");
  const dev = await authed("gappy");
  const e1 = await append("gappy", "g1");
  const e2 = await append("gappy", "g2");
  const e3 = await append("gappy", "g3");
  push("gappy", e1, 0n);
  // e2's push is withheld
  push("gappy", e3, e2.entry.seq);
  await waitFor("three entries", () => dev.entries().length === 3);
  assert.deepEqual(dev.entries().map((e) => e.id), ["g1", "g2", "g3"]);
  assert.equal((await gateway.metric("jetgate_gateway_gap_fills_total")) - gapFills, 1);
  // a repeat of an entry already sent is dropped silently: the next push, published after it on
  // the same connection, is the next entry the device gets
  push("gappy", e3, e2.entry.seq);
  const e4 = await append("gappy", "g4");
  push("gappy", e4, e3.entry.seq);
  await waitFor("the entry pushed after the repeat", () => dev.entries().some((e) => e.id === "g4"));
  assert.deepEqual(dev.entries().map((e) => e.id), ["g1", "g2", "g3", "g4"]);
  assert.equal((await gateway.metric("jetgate_gateway_duplicates_dropped_total")) - duplicates, 1);
  assert.equal((await gateway.metric("jetgate_gateway_gap_fills_total")) - gapFills, 1, "the marker needed no fill");
  assert.equal(await gateway.metric("jetgate_mailbox_seq_regression_total"), 0);
  dev.close();
});

test("gateway edge - an epoch change mid-session: CURSOR_REBASED (not fatal) with a new token; the old epoch's pushes are dropped", async () => {
  const dev = await authed("shifty");
  const e1 = await append("shifty", "s1");
  push("shifty", e1, 0n);
  await waitFor("first entry", () => dev.entries().length === 1);
  const before = registry.state.shards.get(e1.shard)!;
  await registry.update((st) => ({
    v: 1, op: "takeover", at: Date.now(), by: "test",
    shards: [bumpEpoch(st.shards.get(e1.shard)!, { cause: "takeover", start_offset: e1.offset + 1 })],
  }));
  const rebased = await waitFor("CURSOR_REBASED", () => dev.frames.find((f) => f.t === "ERROR" && f.code === "CURSOR_REBASED"));
  assert.ok(rebased.t === "ERROR");
  assert.equal(rebased.fatal, false);
  assert.equal(rebased.new_cursor!.epoch, before.epoch + 1);
  assert.ok(rebased.replay_from_seq! >= e1.entry.seq, "never below what the device has");
  await waitFor("synced again", () => dev.frames.filter((f) => f.t === "SYNCED").length === 2);
  const stale = await gateway.metric("jetgate_gateway_stale_pushes_total");
  const e2 = await append("shifty", "s2");
  push("shifty", { ...e2, entry: { ...e2.entry, seq: composeSeq(before.epoch, e2.offset) } }, e1.entry.seq, before.epoch);
  await waitFor("the zombie's push dropped", async () => (await gateway.metric("jetgate_gateway_stale_pushes_total")) === stale + 1);
  assert.equal(dev.entries().length, 1);
  push("shifty", e2, e1.entry.seq);
  await waitFor("the new owner's push delivered", () => dev.entries().length === 2);
  assert.equal(dev.entries()[1]!.seq, composeSeq(before.epoch + 1, e2.offset));
  assert.ok(dev.closed === undefined);
  dev.close();
});

test("gateway edge - every bad frame gets its error and close code, and other sessions keep working", async () => {
  const bystander = await authed("bystander");
  const cases: { name: string; auth: boolean; data: Uint8Array | string; code: number; error?: string }[] = [
    { name: "not msgpack", auth: false, data: new Uint8Array([0xc1]), code: 4400, error: "BAD_FRAME" },
    { name: "text frame", auth: false, data: "hello", code: 4400, error: "BAD_FRAME" },
    { name: "unknown t", auth: false, data: pack({ t: "HELLO" }), code: 4400, error: "BAD_FRAME" },
    { name: "oversize", auth: false, data: pack({ t: "AUTH", v: 1, token: "x".repeat(1500), device: "d" }), code: 4413, error: "TOO_LARGE" },
    { name: "unsafe device id", auth: false, data: pack({ t: "AUTH", v: 1, token: "t", device: "a.b" }), code: 4400, error: "BAD_FRAME" },
    { name: "frame before AUTH", auth: false, data: pack({ t: "PING" }), code: 4401, error: "UNAUTHORIZED" },
    { name: "negative seq", auth: true, data: pack({ t: "ACK", seq: -1 }), code: 4400, error: "BAD_FRAME" },
    { name: "second AUTH", auth: true, data: pack({ t: "AUTH", v: 1, token: "t", device: "d" }), code: 4400, error: "BAD_FRAME" },
  ];
  for (const c of cases) {
    const dev = c.auth ? await authed(`bad${c.name.length}`) : await TestDevice.connect(gateway.httpPort);
    dev.sendRaw(c.data);
    const closed = await dev.waitClosed();
    assert.equal(closed.code, c.code, c.name);
    const err = dev.frames.find((f) => f.t === "ERROR");
    assert.ok(err && err.t === "ERROR" && err.code === c.error && err.fatal, `${c.name}: ${JSON.stringify(err)}`);
  }
  const e = await append("bystander", "b1");
  push("bystander", e, 0n);
  await waitFor("the bystander still gets entries", () => bystander.entries().length === 1);
  assert.equal(bystander.closed, undefined);
  bystander.close();
});

test("gateway edge - a frame flood gets RATE_LIMITED, then close 4429; connections per user are capped", async () => {
  const dev = await authed("flood");
  for (let i = 0; i < 1000; i++) dev.send({ t: "PING", id: i });
  assert.equal((await dev.waitClosed()).code, 4429);
  const err = dev.frames.find((f) => f.t === "ERROR");
  assert.ok(err && err.t === "ERROR" && err.code === "RATE_LIMITED" && !err.fatal, "the first refusal is a non-fatal RATE_LIMITED");
  // the burst (100 tokens, one spent on AUTH) plus what refilled while the flood arrived
  const pongs = dev.frames.filter((f) => f.t === "PONG").length;
  assert.ok(pongs >= 95 && pongs < 300, `${pongs} PONGs`);
  const devices = [await authed("crowd", "a"), await authed("crowd", "b"), await authed("crowd", "c")];
  const fourth = await TestDevice.connect(gateway.httpPort);
  fourth.send({ t: "AUTH", v: 1, token: await deviceToken("crowd"), device: "d" });
  assert.equal((await fourth.waitClosed()).code, 4429);
  for (const d of devices) d.close();
});

test("gateway edge - a token bound to another device is refused; a token's expiry ends the session", async () => {
  const dev = await TestDevice.connect(gateway.httpPort);
  dev.send({ t: "AUTH", v: 1, token: await deviceToken("bound", { device: "phone" }), device: "tablet" });
  assert.equal((await dev.waitClosed()).code, 4401);
  const short = await TestDevice.connect(gateway.httpPort);
  short.send({ t: "AUTH", v: 1, token: await deviceToken("bound", { expiresInS: 2 }), device: "phone" });
  await short.next("SYNCED");
  const closed = await short.waitClosed(10_000);
  assert.equal(closed.code, 4401);
  assert.match(closed.reason, /expired/);
});

test("gateway edge - a gateway serves only on uWebSockets.js's native binary: it reports the one it runs on; one that does not load stops it at start, named", async () => {
  assert.equal(await gateway.metric("jetgate_gateway_uws_binary_info", { binary: BINARY }), 1, `serving on ${BINARY}`);
  // the same gateway, its uWebSockets.js a copy whose binary the C library refuses (test/harness/uws.ts)
  const broken = brokenUwsPackage(mkdtempSync(join(tmpdir(), "jetgate-uws-")), "glibc");
  const p = spawn(process.execPath, ["--import", "tsx", "--import", "./test/harness/uws-redirect.ts", "gateway/main.ts"], {
    cwd: new URL("../../", import.meta.url),
    env: { PATH: process.env.PATH ?? "", ...infra.env, TEST_UWS_PACKAGE: broken, JETGATE_GATEWAY_PORT: "0", JETGATE_GATEWAY_METRICS_PORT: "0" },
  });
  let out = "";
  p.stdout.on("data", (d: Buffer) => (out += d.toString()));
  p.stderr.on("data", (d: Buffer) => (out += d.toString()));
  const timer = setTimeout(() => p.kill("SIGKILL"), 20_000);
  const code = await new Promise<number | null>((r) => p.on("exit", r));
  clearTimeout(timer);
  rmSync(broken, { recursive: true, force: true });
  assert.equal(code, 1, `exits 1 at once (not killed after 20 s):\n${out}`);
  assert.match(out, new RegExp(`^uWebSockets\\.js could not load its native binary ${BINARY.replaceAll(".", "\\.")}`), "its message first, no stack");
  assert.match(out, /its binaries need glibc >= 9\.99; this process runs on glibc \d+\.\d+/);
  assert.match(out, /the loader said: .*GLIBC_9\.99' not found/);
  assert.match(out, /Ways out:\n {2}1\. on this machine, the provisioned runtime[\s\S]*2\. the image[\s\S]*3\. an OS with glibc >= 2\.38/);
  assert.doesNotMatch(out, /\n\s+at /, "no stack trace");
});

test("gateway edge - SIGTERM: readiness false, GOAWAY to every device, closes 1001 in waves, exit 0", async () => {
  const devices = await Promise.all(["x", "y", "z"].map((d) => authed("drainer", d)));
  const exited = gateway.exited;
  gateway.proc.kill("SIGTERM");
  await waitFor("readiness false", async () => (await gateway.http("/readyz")).status === 503, { timeoutMs: 3000 });
  for (const d of devices) {
    const g = await d.next("GOAWAY");
    assert.ok(g.retry_ms >= 750, `retry_ms ${g.retry_ms}`);
    assert.equal((await d.waitClosed()).code, 1001);
  }
  assert.equal(await exited, 0);
});
