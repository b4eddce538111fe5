import { test } from "node:test";
import assert from "node:assert/strict";
import WebSocket from "ws";
import { connect } from "@nats-io/transport-node";
import { type Entry } from "../../protocol/index.js";
import { Dispatcher, RegistryClient } from "../../protocol/io/index.js";
import { JetgateClient, MemoryCursorStore, type WebSocketFactory } from "../../client/index.js";
import { startInfra, initStack, spawnWorker, spawnGateway, type Infra, type JetgateProcess } from "../harness/stack.js";
import { deviceToken } from "../harness/device.js";
import { sleep, waitFor } from "../harness/wait.js";

const USERS = 100;
const DEVICES_PER_USER = 2;
const ENTRIES = 20_000;

interface Device {
  user: string;
  client: JetgateClient;
  applied: Entry[];
}

async function run(opts: { killWorkerMidway: boolean }): Promise<void> {
  const infra: Infra = await startInfra({ JETGATE_SHARDS: "4", JETGATE_LEASE_MS: "1000", JETGATE_LANES: "default,chat", JETGATE_RATE_USER_FRAMES_PER_S: "100000" });
  const procs: JetgateProcess[] = [];
  const devices: Device[] = [];
  const nc = await connect({ servers: infra.nats.url });
  let registry: RegistryClient | undefined;
  let dispatcher: Dispatcher | undefined;
  try {
    await initStack(infra.env);
    let worker = await spawnWorker(infra.env);
    const gateway = await spawnGateway(infra.env);
    procs.push(worker, gateway);
    await waitFor("the worker owns every shard", async () => (await worker.metric("jetgate_worker_lease_held")) === 4, { timeoutMs: 20_000 });
    registry = await RegistryClient.open(nc);
    dispatcher = new Dispatcher(nc, () => registry!.shards, { lanes: ["default", "chat"] });
    for (let u = 0; u < USERS; u++) {
      for (let d = 0; d < DEVICES_PER_USER; d++) {
        const user = `e2e${u}`;
        const applied: Entry[] = [];
        const client = new JetgateClient({
          url: `ws://127.0.0.1:${gateway.httpPort}/v1/ws`, device: `dev${d}`, token: () => deviceToken(user),
          onEntry: (e) => void applied.push(e), store: new MemoryCursorStore(),
          WebSocket: WebSocket as unknown as WebSocketFactory, backoff: { baseMs: 50, capMs: 500 },
        });
        devices.push({ user, client, applied });
        await client.start();
      }
    }
    await waitFor("every device live", () => devices.every((d) => d.client.state.type === "live"), { timeoutMs: 30_000 });

    const sent = new Map<string, string[]>();
    let dispatching = true;
    const chaos = (async () => {
      while (dispatching) {
        for (let i = 0; i < 8; i++) devices[Math.floor(Math.random() * devices.length)]!.client.disconnect();
        await sleep(150);
      }
    })();
    const inFlight = new Set<Promise<unknown>>();
    for (let i = 0; i < ENTRIES; i++) {
      const user = `e2e${Math.floor(Math.random() * USERS)}`;
      const id = `x${i}`;
      sent.set(user, [...(sent.get(user) ?? []), id]);
      const p = dispatcher.dispatch({ dispatch_id: id, message_id: id, lane: Math.random() < 0.5 ? "chat" : "default", recipients: [user], body: new Uint8Array(16) });
      inFlight.add(p);
      void p.finally(() => inFlight.delete(p));
      if (inFlight.size >= 500) await Promise.race(inFlight);
      if (opts.killWorkerMidway && i === ENTRIES / 2) {
        await worker.kill("SIGKILL");
        worker = await spawnWorker(infra.env);
        procs.push(worker);
      }
    }
    await Promise.all(inFlight);
    dispatching = false;
    await chaos;

    // on timeout the assertions below name the device and what it lacks
    await waitFor("every device has every entry of its user", () => devices.every((d) => d.applied.length >= (sent.get(d.user)?.length ?? 0)), { timeoutMs: 120_000, intervalMs: 200 }).catch(() => undefined);
    // a marker per user, dispatched after all that: a repeat the gateway or the SDK would wrongly
    // deliver comes before it, so each device's entries before its marker are checked
    const marker = (user: string) => `mark-${user}`;
    await Promise.all([...new Set(devices.map((d) => d.user))].map((user) =>
      dispatcher!.dispatch({ dispatch_id: marker(user), message_id: marker(user), lane: "default", recipients: [user], body: new Uint8Array(1) })));
    await waitFor("every device has its user's marker", () => devices.every((d) => d.applied.some((e) => e.id === marker(d.user))), { timeoutMs: 30_000, intervalMs: 100 }).catch(() => undefined);
    let total = 0;
    for (const d of devices) {
      const want = sent.get(d.user) ?? [];
      const applied = d.applied.map((e) => e.id);
      const got = applied.filter((id) => id !== marker(d.user));
      const missing = [...want, marker(d.user)].filter((id) => !applied.includes(id));
      if (missing.length > 0) {
        const last = d.applied.at(-1);
        assert.fail(`${d.user}/${devices.indexOf(d) % DEVICES_PER_USER}: ${missing.length} of ${want.length + 1} missing (${missing.slice(0, 5).join(" ")}); last applied ${last?.id}@${last?.seq.toString(16)}; state ${JSON.stringify(d.client.state)} stats ${JSON.stringify(d.client.stats)}\n${procs.map((p) => p.output.slice(-20).join("\n")).join("\n")}`);
      }
      assert.deepEqual(applied.slice(-1), [marker(d.user)], `${d.user}: nothing applied after the marker`);
      assert.equal(got.length, want.length, `${d.user}: each entry exactly once after dedup`);
      assert.deepEqual(new Set(got), new Set(want), `${d.user}: every entry`);
      for (let i = 1; i < d.applied.length; i++) assert.ok(d.applied[i]!.seq > d.applied[i - 1]!.seq, `${d.user}: increasing seqs`);
      assert.equal(d.client.stats.mailboxSeqRegressionCount, 0, `${d.user}: SDK regressions`);
      total += got.length;
    }
    assert.equal(await gateway.metric("jetgate_mailbox_seq_regression_total"), 0, "gateway regressions");
    for (const w of procs.filter((p) => p !== gateway && p.proc.exitCode === null && p.proc.signalCode === null)) {
      assert.equal(await w.metric("jetgate_mailbox_seq_regression_total"), 0, "worker regressions");
    }
    const reconnects = devices.reduce((n, d) => n + d.client.stats.reconnects, 0);
    assert.ok(reconnects > 50, `devices reconnected during the run (${reconnects})`);
    console.log(`e2e${opts.killWorkerMidway ? " with a worker SIGKILL" : ""}: ${total} entries applied by ${devices.length} devices, ${reconnects} reconnects, duplicates dropped ${devices.reduce((n, d) => n + d.client.stats.duplicatesDropped, 0)}`);
  } finally {
    for (const d of devices) await d.client.close();
    dispatcher?.close();
    await registry?.close();
    await nc.close();
    for (const p of procs) await p.kill();
    await infra.dispose();
  }
}

test("e2e - 200 devices of 100 users, 20,000 entries, random reconnects: every entry once, in order, no regression", async () => {
  await run({ killWorkerMidway: false });
});

test("e2e - the same with the worker SIGKILLed halfway (an epoch bump mid-run)", async () => {
  await run({ killWorkerMidway: true });
});

