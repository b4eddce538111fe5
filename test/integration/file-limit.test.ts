/**
 * A gateway at its open files limit (docs/operations.md, "Connections and the file limit"): started
 * under `prlimit` with 400 files, then given more devices than files. It used to spin on `accept`
 * (EMFILE) at a whole core and answer nothing, /readyz and the HTTP API included. Now devices past
 * its cap are answered 503 with Retry-After, every attempt is answered within seconds, the gateway
 * stays well under a core, connected devices go on receiving, the HTTP API and health answer, and
 * readiness says "capacity". When sockets opened and left without a request take the reserve too,
 * the listener closes (new connections, the HTTP API's too, refused at once) until files are free
 * again; health and metrics answer on their own port meanwhile.
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { connect as tcpConnect, type Socket } from "node:net";
import WebSocket from "ws";
import { spawnGateway, startStack } from "../harness/stack.js";
import { deviceToken, TestDevice } from "../harness/device.js";
import { waitFor, sleep } from "../harness/wait.js";

const FILES = 400;
const TOKEN = "file-limit-service-token";
const stack = await startStack({ env: { JETGATE_SERVICE_TOKEN: TOKEN, JETGATE_MAX_CONNS_PER_IP: "0", JETGATE_LOG_LEVEL: "info" } });
const gw = await spawnGateway(stack.infra.env, {}, [], { wrap: ["prlimit", `--nofile=${FILES}:${FILES}`], host: "127.0.0.1" });
after(async () => {
  await gw.kill();
  await stack.dispose();
});

/** The gateway's CPU seconds so far (utime + stime). */
function cpuSeconds(pid: number): number {
  const f = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
  return (Number(f[11]) + Number(f[12])) / 100;
}

/** One WebSocket attempt: how it ended and how long it took to be answered. */
function attempt(): Promise<{ outcome: string; ms: number; ws?: WebSocket }> {
  const t0 = Date.now();
  return new Promise((resolve) => {
    const ws = new WebSocket(`ws://127.0.0.1:${gw.httpPort}/v1/ws`);
    const done = (outcome: string, keep?: WebSocket) => resolve({ outcome, ms: Date.now() - t0, ...(keep ? { ws: keep } : {}) });
    ws.once("open", () => done("open", ws));
    ws.once("unexpected-response", (_req, res) => {
      done(`${res.statusCode} ${res.headers["retry-after"] !== undefined ? "retry-after" : ""}`.trim());
      ws.terminate();
    });
    ws.once("error", (err: NodeJS.ErrnoException) => done(err.code ?? err.message));
  });
}

const plan = () => gw.output.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.msg === "devices taken at once")!;
const mailbox = () => fetch(`http://127.0.0.1:${gw.httpPort}/v1/users/fl-user/mailbox`, { headers: { authorization: `Bearer ${TOKEN}` } });

test("file limit - the plan: the soft limit logged, the devices taken at once are the limit less the files open at start and a reserve", async () => {
  const limits = gw.output.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.msg === "open files limit")!;
  assert.equal(limits.soft, FILES);
  assert.equal(limits.hard, FILES);
  const p = plan();
  assert.equal(p.limit, FILES);
  assert.equal(p.reserve, 64);
  assert.equal(p.maxConnections, FILES - (p.baseline as number) - 64);
  assert.ok((p.baseline as number) > 10 && (p.baseline as number) < 200, `baseline ${String(p.baseline)}`);
  assert.equal(await gw.metric("jetgate_gateway_max_connections"), p.maxConnections);
  assert.equal(await gw.metric("jetgate_gateway_file_limit"), FILES);
});

test("file limit - more devices than files: every attempt answered within seconds (503 with Retry-After past the cap), the gateway under 30% of a core, connected devices, the HTTP API and health unaffected", async () => {
  const max = plan().maxConnections as number;
  // a device connected before, receiving entries throughout
  const d = await TestDevice.connect(gw.httpPort);
  d.send({ t: "AUTH", v: 1, token: await deviceToken("fl-user"), device: "phone" });
  await d.next("SYNCED");
  const cpu0 = cpuSeconds(gw.pid);
  const t0 = Date.now();
  const attempts = await Promise.all(Array.from({ length: 450 }, () => attempt()));
  const outcomes = new Map<string, number>();
  for (const a of attempts) outcomes.set(a.outcome, (outcomes.get(a.outcome) ?? 0) + 1);
  const slowest = Math.max(...attempts.map((a) => a.ms));
  assert.ok(slowest < 5000, `every attempt answered within 5 s (slowest ${slowest} ms): ${JSON.stringify([...outcomes])}`);
  assert.equal(outcomes.get("open"), max - 1, `the cap, less the device already there: ${JSON.stringify([...outcomes])}`);
  assert.equal((outcomes.get("503 retry-after") ?? 0) + (outcomes.get("ECONNREFUSED") ?? 0) + (outcomes.get("ECONNRESET") ?? 0), 450 - (max - 1), JSON.stringify([...outcomes]));
  assert.ok((outcomes.get("503 retry-after") ?? 0) > 0, "past the cap: 503 with Retry-After");
  // a few seconds at capacity: no busy loop
  await sleep(3000);
  const share = (cpuSeconds(gw.pid) - cpu0) / ((Date.now() - t0) / 1000);
  assert.ok(share < 0.3, `the gateway used ${Math.round(share * 100)}% of a core at its limit`);
  // the device connected before still gets its entries; the HTTP API and health answer
  await stack.dispatcher.dispatch({ dispatch_id: "fl-1", message_id: "fl-1", lane: "default", recipients: ["fl-user"], body: new TextEncoder().encode("still here") });
  await waitFor("the entry at the connected device", () => d.entries().some((e) => e.id === "fl-1"));
  assert.equal((await mailbox()).status, 200);
  assert.equal((await gw.http("/healthz")).status, 200);
  const ready = await gw.http("/readyz");
  assert.equal(ready.status, 503);
  const body = JSON.parse(ready.text) as { problems: string[]; detail: Record<string, string> };
  assert.deepEqual(body.problems, ["capacity"]);
  assert.match(body.detail.capacity!, new RegExp(`^${max} of ${max} connections \\(JETGATE_MAX_CONNECTIONS`));
  assert.ok((await gw.metric("jetgate_gateway_refused_upgrades_total", { reason: "capacity" })) >= (outcomes.get("503 retry-after") ?? 0));
  // room again: ready, and a new device connects
  for (const a of attempts) a.ws?.terminate();
  await waitFor("ready again", async () => (await gw.http("/readyz")).status === 200);
  const later = await attempt();
  assert.equal(later.outcome, "open");
  later.ws!.terminate();
  d.close();
});

test("file limit - sockets opened and left without a request take the reserve: the listener closes (new connections refused at once, no spin), and opens again once they are gone", async () => {
  // more sockets than the files left: each waits for a request that never comes
  const idle: Socket[] = [];
  for (let i = 0; i < FILES; i++) {
    const s = tcpConnect({ host: "127.0.0.1", port: gw.httpPort });
    s.on("error", () => undefined);
    idle.push(s);
  }
  await waitFor("the listener paused", async () => (await gw.metric("jetgate_gateway_accept_pauses_total")) >= 1, { timeoutMs: 10_000 });
  // out of files from here on, and not spinning
  const cpu0 = cpuSeconds(gw.pid);
  const t0 = Date.now();
  await sleep(2000);
  const refused = await attempt();
  assert.ok(["ECONNREFUSED", "ECONNRESET"].includes(refused.outcome) && refused.ms < 1000, `a new connection while paused: ${refused.outcome} in ${refused.ms} ms`);
  const ready = JSON.parse((await gw.http("/readyz")).text) as { problems: string[]; detail: Record<string, string> };
  assert.deepEqual(ready.problems, ["capacity"]);
  assert.match(ready.detail.capacity!, /^out of files: (\d+|all) of 400 open; not accepting connections$/);
  assert.equal((await gw.http("/healthz")).status, 200, "health answers on its own port");
  const share = (cpuSeconds(gw.pid) - cpu0) / ((Date.now() - t0) / 1000);
  assert.ok(share < 0.3, `the gateway used ${Math.round(share * 100)}% of a core out of files`);
  for (const s of idle) s.destroy();
  await waitFor("accepting again", async () => (await attempt()).outcome === "open", { timeoutMs: 15_000 });
  assert.ok(gw.output.some((l) => l.includes("out of files: not accepting connections")));
  assert.ok(gw.output.some((l) => l.includes("files free again: accepting connections")));
});
