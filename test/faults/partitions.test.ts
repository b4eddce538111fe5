/**
 * Network partitions: a gateway or a worker runs on a host of its own (a network namespace with a
 * link per peer, test/harness/netns.ts) and one of its links is cut (packets dropped silently, both
 * ways), not the process killed. What each side sees is in docs/operations.md ("Partitions").
 * Without CAP_NET_ADMIN these tests fail with NetnsUnavailableError, naming it.
 */
import { test } from "node:test";
import { spawnSync } from "node:child_process";
import { request } from "node:http";
import { fileURLToPath } from "node:url";
import assert from "node:assert/strict";
import { scenarioOnInfra, type FaultRun, type HostPlacement, type ScenarioOptions, type ScenarioResult } from "../harness/faults.js";
import { NetHost, requireNetns } from "../harness/netns.js";
import { PushCollector, type Infra, type JetgateProcess } from "../harness/stack.js";
import { sleep, waitFor } from "../harness/wait.js";

/** A host with the named links, and how a jetgate process runs there (NATS and Redis over their links). */
function hostFor(infra: Infra, links: ["nats", "redis", string]): { host: NetHost; place: HostPlacement } {
  const host = NetHost.create(links);
  const place: HostPlacement = {
    wrap: host.wrap,
    host: host.link(links[2]).hostIp,
    env: {
      JETGATE_NATS_URL: `nats://${host.link("nats").rootIp}:${infra.nats.port}`,
      JETGATE_REDIS_URL: `redis://${host.link("redis").rootIp}:${infra.redis.port}`,
    },
  };
  return { host, place };
}

/** A WebSocket upgrade request's answer, when it is not an upgrade. */
function upgrade(host: string, port: number): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ host, port, path: "/v1/ws", timeout: 5000, headers: { connection: "Upgrade", upgrade: "websocket", "sec-websocket-version": "13", "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==" } });
    req.on("response", (res) => {
      let body = "";
      res.on("data", (d: Buffer) => (body += d.toString()));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on("upgrade", (_res, socket) => {
      socket.destroy();
      reject(new Error("the upgrade was accepted"));
    });
    req.on("timeout", () => req.destroy(new Error("no answer to the upgrade in 5 s")));
    req.on("error", reject);
    req.end();
  });
}

/** A fault-suite scenario with one process on a host of its own (`hosts` in what `build` returns). */
async function onHost(links: ["nats", "redis", string], build: (infra: Infra, h: { host: NetHost; place: HostPlacement }) => ScenarioOptions): Promise<ScenarioResult> {
  let host: NetHost | undefined;
  try {
    return await scenarioOnInfra((infra) => {
      const h = hostFor(infra, links);
      host = h.host;
      return build(infra, h);
    }, infraOpts);
  } finally {
    host?.dispose();
  }
}

async function ready(p: JetgateProcess): Promise<{ ready: boolean; problems: string[] }> {
  const r = await p.http("/readyz");
  return JSON.parse(r.text) as { ready: boolean; problems: string[] };
}

/** Shards whose lease the worker holds now (its jetgate_worker_lease_held gauge). */
async function held(w: JetgateProcess, shards: number): Promise<number[]> {
  const out: number[] = [];
  for (let s = 0; s < shards; s++) if ((await w.metric("jetgate_worker_lease_held", { shard: String(s) })) === 1) out.push(s);
  return out;
}

const infraOpts = { host: "0.0.0.0" };
const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const CUT_MS = 10_000;

test("partition - namespaces can be made here (CAP_NET_ADMIN, iproute2)", () => {
  requireNetns();
});

test("partition - without CAP_NET_ADMIN the check fails with an error naming it (never a silent pass)", () => {
  // the same check in a process whose capabilities are all dropped (util-linux's setpriv)
  const script = 'import("./test/harness/netns.ts").then((m) => m.requireNetns()).catch((e) => { console.log(e.name + ": " + e.message); process.exit(3); })';
  const r = spawnSync("setpriv", ["--inh-caps=-all", "--bounding-set=-all", process.execPath, "--import", "tsx", "-e", script], { encoding: "utf8", cwd: ROOT });
  assert.equal(r.status, 3, `${r.stdout}${r.stderr}`);
  assert.match(r.stdout, /^NetnsUnavailableError: .*CAP_NET_ADMIN/);
});

test("partition - a gateway cut off from NATS and Redis for 10 s, its devices still connected: all arrives after, 0 regressions", async () => {
  await onHost(["nats", "redis", "devices"], (infra, h) => ({
    name: "gateway cut from NATS+Redis",
    env: infra.env,
    duplicates: "none",
    hosts: { gateways: [h.place] },
    fault: async (run) => {
      const gw = run.gateways[0]!;
      const before = await gw.metric("jetgate_gateway_connections");
      assert.ok(before > 0, "the cut gateway has devices");
      h.host.cut("nats");
      h.host.cut("redis");
      const t0 = Date.now();
      await waitFor("the cut gateway not ready, naming both", async () => (await ready(gw)).problems.join() === "nats,redis", { timeoutMs: 8000, intervalMs: 100 });
      const notReadyAfter = Date.now() - t0;
      await sleep(CUT_MS - (Date.now() - t0));
      // a new device is turned away, naming why, to try another gateway
      assert.deepEqual(await upgrade(h.place.host, gw.httpPort), { status: 503, body: `${JSON.stringify({ error: "dependency not answering: nats, redis" })}\n` });
      const during = await gw.metric("jetgate_gateway_connections");
      const refused = await gw.metric("jetgate_gateway_refused_upgrades_total", { reason: "dependency" });
      h.host.heal("nats");
      h.host.heal("redis");
      await waitFor("the gateway ready again", async () => (await ready(gw)).ready, { timeoutMs: 15_000, intervalMs: 100 });
      console.log(`  cut gateway: not ready ${notReadyAfter} ms after the cut; ${before} devices before, ${during} still connected at its end; ${refused} new devices turned away (503); ready ${Date.now() - t0 - CUT_MS} ms after the heal`);
      assert.ok(during > 0, "devices stay connected to the cut gateway");
    },
  }));
});

/**
 * Fencing across a partition: the cut worker publishes nothing for a shard once the other worker's
 * takeover of it is visible (its pushed counter stands still), and the lease moves within a few
 * lease periods; after the heal the shards spread over both workers again.
 */
async function leaseMoves(run: FaultRun, cut: () => void, heal: () => void, label: string): Promise<void> {
  const [away, here] = [run.workers[0]!, run.workers[1]!];
  const shards = run.shardCount;
  const mine = await held(away, shards);
  assert.ok(mine.length > 0, "the worker to cut holds a shard");
  const epochs = new Map(mine.map((s) => [s, run.registry.state.shards.get(s)!.epoch]));
  const t0 = Date.now();
  cut();
  await waitFor("the other worker holds every shard under a newer epoch", async () =>
    (await held(here, shards)).length === shards && mine.every((s) => run.registry.state.shards.get(s)!.epoch > epochs.get(s)!), { timeoutMs: 15_000, intervalMs: 100 });
  const movedMs = Date.now() - t0;
  const pushed = await Promise.all(mine.map((s) => away.metric("jetgate_worker_entries_pushed_total", { shard: String(s) }).catch(() => NaN)));
  await sleep(Math.max(0, CUT_MS - (Date.now() - t0)));
  const pushedLater = await Promise.all(mine.map((s) => away.metric("jetgate_worker_entries_pushed_total", { shard: String(s) }).catch(() => NaN)));
  heal();
  await waitFor("the cut worker ready again", async () => (await ready(away)).ready, { timeoutMs: 20_000, intervalMs: 100 });
  await waitFor("shards spread over both workers again", async () => (await held(away, shards)).length > 0 && (await held(here, shards)).length > 0, { timeoutMs: 20_000, intervalMs: 200 });
  console.log(`  ${label}: shards ${mine.join(",")} moved ${movedMs} ms after the cut (epochs ${mine.map((s) => `${epochs.get(s)}->${run.registry.state.shards.get(s)!.epoch}`).join(", ")}); the cut worker's pushes for them after the move: ${pushedLater.map((n, i) => n - pushed[i]!).join(",")}`);
  if (pushed.every((n) => !Number.isNaN(n))) assert.deepEqual(pushedLater, pushed, "the cut worker published nothing for its old shards after they moved");
}

test("partition - a worker cut off from NATS (Redis still reached): it lets its leases go, the other worker takes over, fencing holds", async () => {
  await onHost(["nats", "redis", "ops"], (infra, h) => ({
    name: "worker cut from NATS",
    env: infra.env,
    duplicates: "allowed", // the takeover's epoch replays what the cut worker had not acked
    hosts: { workers: [h.place] },
    fault: (run) => leaseMoves(run, () => h.host.cut("nats"), () => h.host.heal("nats"), "worker cut from NATS"),
  }));
});

test("partition - a worker cut off from NATS during its release (SIGTERM while cut): its shards are fenced by a new epoch, never released; 0 lost", async () => {
  await onHost(["nats", "redis", "ops"], (infra, h) => ({
    name: "release cut from NATS",
    env: infra.env,
    duplicates: "allowed", // the fence's epoch replays what the cut worker had not acked
    hosts: { workers: [h.place] },
    fault: async (run) => {
      const [away, here] = [run.workers[0]!, run.workers[1]!];
      const shards = run.shardCount;
      const mine = await held(away, shards);
      assert.ok(mine.length > 0, "the worker to cut holds a shard");
      const before = new Map(mine.map((s) => [s, run.registry.state.shards.get(s)!]));
      h.host.cut("nats");
      const t0 = Date.now();
      const code = await away.kill("SIGTERM");
      const exitMs = Date.now() - t0;
      await waitFor("the other worker holds every shard", async () => (await held(here, shards)).length === shards, { timeoutMs: 15_000, intervalMs: 100 });
      await run.registry.sync();
      h.host.heal("nats");
      for (const s of mine) {
        const was = before.get(s)!;
        const now = run.registry.state.shards.get(s)!;
        assert.equal(now.epoch, was.epoch + 1, `shard ${s}: fenced by exactly one new epoch`);
        assert.equal(now.boundaries.at(-1)!.cause, "takeover");
        assert.equal(now.released_offset, undefined, `shard ${s}: no release recorded`);
      }
      const said = away.output.filter((l) => l.includes("not released")).length;
      console.log(`  release cut from NATS: the cut worker exited ${code} after ${exitMs} ms; shards ${mine.join(",")} fenced (epochs ${mine.map((s) => `${before.get(s)!.epoch}->${run.registry.state.shards.get(s)!.epoch}`).join(", ")}); ${said} "not released" warnings`);
      assert.equal(said, mine.length, `the cut worker said each release failed:\n${away.output.slice(-10).join("\n")}`);
    },
  }));
});

test("partition - a worker cut off from Redis (NATS still reached): its lease expires, the takeover fences it, no push of an older epoch after a newer one", async () => {
  let collector: PushCollector | undefined;
  try {
    await onHost(["nats", "redis", "ops"], (infra, h) => ({
      name: "worker cut from Redis",
      env: infra.env,
      duplicates: "allowed",
      hosts: { workers: [h.place] },
      prepare: async () => {
        collector = await PushCollector.start(infra.nats.url);
      },
      fault: (run) => leaseMoves(run, () => h.host.cut("redis"), () => h.host.heal("redis"), "worker cut from Redis"),
    }));
    // a push of an older epoch after one of a newer epoch of the same shard: two owners at once
    const newest = new Map<number, number>();
    let late = 0;
    for (const { push } of collector!.pushes) {
      if (push.epoch < (newest.get(push.shard) ?? 0)) late++;
      newest.set(push.shard, Math.max(push.epoch, newest.get(push.shard) ?? 0));
    }
    assert.equal(late, 0, "pushes of an older epoch after a newer one");
  } finally {
    await collector?.close();
  }
});

test("partition - a gateway cut off from its devices only: they notice by heartbeat and resume on the other gateway with their cursors", async () => {
  await onHost(["nats", "redis", "devices"], (infra, h) => ({
    name: "gateway cut from devices",
    env: { ...infra.env, JETGATE_HEARTBEAT_MS: "1000" },
    duplicates: "none",
    hosts: { gateways: [h.place] },
    fault: async (run) => {
      const other = run.gateways[1]!;
      const total = run.devices.length;
      const resumedBefore = await other.metric("jetgate_gateway_auth_outcomes_total", { case: "normal" });
      const t0 = Date.now();
      h.host.cut("devices");
      await waitFor("every device on the other gateway", async () => (await other.metric("jetgate_gateway_connections")) === total, { timeoutMs: 30_000, intervalMs: 200 });
      const movedMs = Date.now() - t0;
      const resumed = (await other.metric("jetgate_gateway_auth_outcomes_total", { case: "normal" })) - resumedBefore;
      h.host.heal("devices");
      console.log(`  gateway cut from devices: all ${total} devices on the other gateway ${movedMs} ms after the cut (heartbeat 1 s: silence noticed after 7 s); ${resumed} resumed with their cursor`);
      assert.ok(resumed > 0, "devices resumed with their cursors");
    },
  }));
});
