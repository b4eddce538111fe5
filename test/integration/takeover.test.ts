import { test } from "node:test";
import assert from "node:assert/strict";
import { connect } from "@nats-io/transport-node";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { decodeFloorRecord, FLOORS_STREAM, floorSubject, shardStream, workerConsumerName } from "../../protocol/index.js";
import { Dispatcher, RegistryClient } from "../../protocol/io/index.js";
import { startInfra, initStack, spawnWorker, redisClient, PushCollector, DispatchLoad, type Infra, type JetgateProcess } from "../harness/stack.js";
import { runCli } from "../harness/cli.js";
import { sleep, waitFor } from "../harness/wait.js";

const LEASE_MS = 1000;

interface Rig {
  infra: Infra;
  registry: RegistryClient;
  dispatcher: Dispatcher;
  pushes: PushCollector;
  procs: JetgateProcess[];
  close(): Promise<void>;
}

const users = Array.from({ length: 40 }, (_, i) => `u${i}`);

async function rig(leaseMs = LEASE_MS): Promise<Rig> {
  const infra = await startInfra({ JETGATE_LEASE_MS: String(leaseMs) });
  await initStack(infra.env);
  const nc = await connect({ servers: infra.nats.url });
  const registry = await RegistryClient.open(nc);
  const dispatcher = new Dispatcher(nc, () => registry.shards, { lanes: ["default"] });
  const pushes = await PushCollector.start(infra.nats.url, infra.redis.url);
  await pushes.watch(...users, "carl", "gail");
  const procs: JetgateProcess[] = [];
  return {
    infra, registry, dispatcher, pushes, procs,
    async close() {
      for (const p of procs) await p.kill();
      dispatcher.close();
      await pushes.close();
      await registry.close();
      await nc.close();
      await infra.dispose();
    },
  };
}

async function ownedShards(w: JetgateProcess): Promise<number[]> {
  const out: number[] = [];
  for (const s of [0, 1]) if ((await w.metric("jetgate_worker_lease_held", { shard: String(s) })) === 1) out.push(s);
  return out;
}

/** Starts A, lets it take both shards, then B, and waits until they hold one each. */
async function twoWorkers(r: Rig, extraA: Record<string, string> = {}): Promise<[JetgateProcess, JetgateProcess]> {
  const a = await spawnWorker(r.infra.env, { JETGATE_WORKER_ID: "a", ...extraA });
  r.procs.push(a);
  await waitFor("A owns both shards", async () => (await ownedShards(a)).length === 2);
  const b = await spawnWorker(r.infra.env, { JETGATE_WORKER_ID: "b" });
  r.procs.push(b);
  await waitFor("A and B hold one shard each", async () => (await ownedShards(a)).length === 1 && (await ownedShards(b)).length === 1, { timeoutMs: 15_000 });
  return [a, b];
}


test("takeover - SIGKILL the owner mid-stream: the survivor takes over within the lease, epoch +1 with its boundary, every entry pushed", async () => {
  const r = await rig();
  try {
    const [a, b] = await twoWorkers(r);
    const [victimShard] = await ownedShards(a) as [number];
    const epochBefore = r.registry.state.shards.get(victimShard)!.epoch;
    const load = new DispatchLoad(r.dispatcher, users, { perTick: 20, everyMs: 10, prefix: "K" });
    await sleep(500);
    const regressionsA = await a.metric("jetgate_mailbox_seq_regression_total");
    const killedAt = Date.now();
    await a.kill("SIGKILL");
    await waitFor("B owns both shards", async () => (await ownedShards(b)).length === 2, { timeoutMs: 10_000 });
    const tookMs = Date.now() - killedAt;
    await sleep(500);
    await load.stop();
    assert.ok(tookMs <= LEASE_MS + 2000, `took over in ${tookMs} ms`);
    const shard = r.registry.state.shards.get(victimShard)!;
    assert.equal(shard.epoch, epochBefore + 1, "exactly one epoch bump");
    const boundary = shard.boundaries.at(-1)!;
    assert.equal(boundary.epoch, epochBefore + 1);
    assert.equal(boundary.cause, "takeover");
    assert.ok(boundary.start_offset >= 1);
    assert.equal(load.failed.length, 0);
    const ids = load.allIds();
    assert.ok(ids.length > 200, `load ran (${ids.length} entries)`);
    await waitFor("every dispatched entry pushed at least once", () => {
      const pushed = new Set(r.pushes.pushes.map((p) => p.push.entry.id));
      return ids.every((id) => pushed.has(id));
    }, { timeoutMs: 15_000 });
    assert.equal(regressionsA, 0);
    assert.equal(await b.metric("jetgate_mailbox_seq_regression_total"), 0);
    // Re-pushed entries (processed by A, not acked) come again under the new epoch, with a higher seq.
    const firstSeq = new Map<string, bigint>();
    for (const { push } of r.pushes.pushes) {
      const seen = firstSeq.get(push.entry.id);
      if (seen !== undefined) assert.ok(push.entry.seq > seen, "a re-push never carries a lower seq");
      else firstSeq.set(push.entry.id, push.entry.seq);
    }
  } finally {
    await r.close();
  }
});

test("takeover - planned handoff: rebalancing and SIGTERM release the epoch, the next worker resumes it after the released offset; every entry pushed once, no epoch spent", async () => {
  // leases of 3 s: a 1 s lease can lapse on a machine this loaded (the suite runs two files at
  // once), and a lapsed lease is rightly a fence, not the handoff under test
  const r = await rig(3000);
  const nc = await connect({ servers: r.infra.nats.url });
  try {
    const epochs = () => [0, 1].map((id) => r.registry.state.shards.get(id)!.epoch);
    // A claims both epochs alone; B joins and A releases one to it (rebalancing)
    const [a, b] = await twoWorkers(r);
    await r.registry.sync();
    assert.deepEqual(epochs(), [0, 0], "the rebalancing spent no epoch");
    const said = () => [...a.output, ...b.output].slice(-20).join("\n");
    // the lease gauge is set when a takeover starts, the takeover counter when it is done
    const resumes = (w: JetgateProcess, n: number) => waitFor(`${n} resume(s)`, async () => (await w.metric("jetgate_worker_takeovers_total", { mode: "resume" })) >= n, { timeoutMs: 10_000 }).catch(() => undefined);
    await resumes(b, 1);
    assert.equal(await b.metric("jetgate_worker_takeovers_total", { mode: "resume" }), 1, `B resumed the shard A released; the workers said:\n${said()}`);
    const load = new DispatchLoad(r.dispatcher, users, { perTick: 20, everyMs: 10, prefix: "H" });
    await sleep(500);
    const [aShard] = await ownedShards(a) as [number];
    assert.equal(await a.kill("SIGTERM"), 0, "A exits 0 after releasing");
    await waitFor("B owns both shards", async () => (await ownedShards(b)).length === 2, { timeoutMs: 10_000 });
    await sleep(500);
    const a2 = await spawnWorker(r.infra.env, { JETGATE_WORKER_ID: "a2" });
    r.procs.push(a2);
    await waitFor("B and A2 hold one shard each", async () => (await ownedShards(a2)).length === 1 && (await ownedShards(b)).length === 1, { timeoutMs: 15_000 });
    await resumes(a2, 1);
    await sleep(500);
    await load.stop();
    await r.registry.sync();
    assert.deepEqual(epochs(), [0, 0], "three handoffs under load, no epoch spent");
    for (const id of [0, 1]) {
      const s = r.registry.state.shards.get(id)!;
      assert.equal(s.boundaries.length, 1, `shard ${id}: no boundary written`);
      assert.ok(s.released_offset !== undefined && s.released_offset > 0, `shard ${id}: resumed after a release (${s.released_offset})`);
    }
    assert.equal(await b.metric("jetgate_worker_takeovers_total", { mode: "resume" }), 2, `B resumed A's shard ${aShard} after A's SIGTERM; the workers said:\n${said()}`);
    assert.equal(await a2.metric("jetgate_worker_takeovers_total", { mode: "resume" }), 1, "A2 resumed the shard B released to it");
    assert.equal((await b.metric("jetgate_worker_takeovers_total", { mode: "bump" })) + (await a2.metric("jetgate_worker_takeovers_total", { mode: "bump" })), 0);
    assert.ok((await b.metric("jetgate_worker_releases_total", { outcome: "released" })) >= 1, "B released a shard to A2");
    const shown = await runCli(r.infra.env, ["registry", "show"]);
    assert.equal((shown.text.match(/epoch claimed by (b|a2) \(resumed after a release at offset \d+\)\)/g) ?? []).length, 2, shown.text);
    assert.equal(load.failed.length, 0);
    const ids = load.allIds();
    assert.ok(ids.length > 200, `load ran (${ids.length} entries)`);
    await waitFor("every dispatched entry pushed", () => {
      const pushed = new Set(r.pushes.pushes.map((p) => p.push.entry.id));
      return ids.every((id) => pushed.has(id));
    }, { timeoutMs: 15_000 });
    await sleep(300);
    const times = new Map<string, number>();
    for (const { push } of r.pushes.pushes) times.set(push.entry.id, (times.get(push.entry.id) ?? 0) + 1);
    const twice = [...times].filter(([id, n]) => n > 1 && id.startsWith("H"));
    assert.deepEqual(twice, [], "nothing processed twice: each successor went on after the released offset");
    for (const w of [b, a2]) assert.equal(await w.metric("jetgate_mailbox_seq_regression_total"), 0);
    // one consumer per shard, the epoch's own: a resume makes it again after the released offset
    const jsm = await jetstreamManager(nc);
    for (const id of [0, 1]) {
      const names: string[] = [];
      for await (const c of jsm.consumers.list(shardStream(id))) if (c.name.startsWith("w_")) names.push(c.name);
      assert.deepEqual(names, [workerConsumerName(0)]);
    }
  } finally {
    await nc.close();
    await r.close();
  }
});

test("takeover - the worker's consumer lost (an R1 consumer's NATS node gone): the next takeover starts from the epoch's floor record, not the boundary; every entry pushed", async () => {
  const r = await rig();
  const nc = await connect({ servers: r.infra.nats.url });
  try {
    const jsm = await jetstreamManager(nc);
    const a = await spawnWorker(r.infra.env, { JETGATE_WORKER_ID: "a" });
    r.procs.push(a);
    await waitFor("A owns both shards", async () => (await ownedShards(a)).length === 2);
    const shard = 0;
    const epochBefore = r.registry.state.shards.get(shard)!.epoch;
    const consumer = await jsm.consumers.info(shardStream(shard), workerConsumerName(epochBefore));
    assert.equal(consumer.config.num_replicas, 1, "worker consumers are R1");
    const load = new DispatchLoad(r.dispatcher, users, { perTick: 20, everyMs: 10, prefix: "L" });
    // long enough for records after the takeover's own (one a second while it acks)
    await sleep(2500);
    const record = decodeFloorRecord((await jsm.streams.getMessage(FLOORS_STREAM, { last_by_subj: floorSubject(shard, epochBefore) }))!.data);
    assert.equal(record.epoch, epochBefore);
    assert.ok(record.offset > 100, `recorded while acking (${record.offset})`);
    // what a node's loss does to an R1 consumer: gone, with its ack floor
    await jsm.consumers.delete(shardStream(shard), workerConsumerName(epochBefore));
    await waitFor("the shard taken again under a new epoch", () => r.registry.state.shards.get(shard)!.epoch > epochBefore, { timeoutMs: 10_000 });
    await sleep(500);
    await load.stop();
    const s = r.registry.state.shards.get(shard)!;
    assert.equal(s.epoch, epochBefore + 1, "one bump");
    const start = s.boundaries.at(-1)!.start_offset;
    assert.ok(start > record.offset, `from the record (${record.offset}) or later, not from the boundary's start: ${start}`);
    assert.equal(load.failed.length, 0);
    const ids = load.allIds();
    await waitFor("every dispatched entry pushed", () => {
      const pushed = new Set(r.pushes.pushes.map((p) => p.push.entry.id));
      return ids.every((id) => pushed.has(id));
    }, { timeoutMs: 15_000 });
    assert.equal(await a.metric("jetgate_mailbox_seq_regression_total"), 0);
  } finally {
    await nc.close();
    await r.close();
  }
});

test("takeover - a zombie whose epoch is superseded publishes nothing more for that shard", async () => {
  const r = await rig();
  try {
    const [a, b] = await twoWorkers(r);
    const [shard] = await ownedShards(a) as [number];
    const zombieEpoch = r.registry.state.shards.get(shard)!.epoch;
    a.proc.kill("SIGSTOP");
    // While A sleeps, entries for its shard arrive (some are delivered into A's socket).
    const load = new DispatchLoad(r.dispatcher, users, { perTick: 10, everyMs: 20, prefix: "Z" });
    await waitFor("B took A's shard over", () => r.registry.state.shards.get(shard)!.epoch > zombieEpoch, { timeoutMs: 10_000 });
    await waitFor("B owns both shards", async () => (await ownedShards(b)).length === 2);
    const zombiePushes = () => r.pushes.pushes.filter((p) => p.push.shard === shard && p.push.epoch === zombieEpoch).length;
    const before = zombiePushes();
    a.proc.kill("SIGCONT");
    await sleep(2000);
    assert.equal(a.proc.exitCode ?? a.proc.signalCode, null, `the zombie must survive being fenced:\n${a.output.slice(-30).join("\n")}`);
    await load.stop();
    assert.equal(zombiePushes(), before, "no push under the superseded epoch after the zombie woke up");
    assert.ok((await a.metric("jetgate_worker_fenced_total")) >= 1, "the zombie noticed it was fenced");
    const ids = load.allIds();
    await waitFor("every entry pushed by the new owner", () => {
      const pushed = new Set(r.pushes.pushes.map((p) => p.push.entry.id));
      return ids.every((id) => pushed.has(id));
    }, { timeoutMs: 15_000 });
  } finally {
    await r.close();
  }
});

test("takeover - a worker killed after its Redis step and before its push: the entry is still pushed after takeover", async () => {
  const r = await rig();
  try {
    const a = await spawnWorker(r.infra.env, { JETGATE_WORKER_ID: "a", JETGATE_FAULT_EXIT_AFTER: "redis" });
    r.procs.push(a);
    await waitFor("A owns both shards", async () => (await ownedShards(a)).length === 2);
    await r.dispatcher.dispatch({ dispatch_id: "crash1", message_id: "crash1", lane: "default", recipients: ["carl"], body: new Uint8Array(1) });
    const signal = await waitFor("A to die by its fault hook", () => a.proc.signalCode ?? undefined);
    assert.equal(signal, "SIGKILL");
    assert.equal(r.pushes.pushes.length, 0, "A wrote dedup/watermark/cache but pushed nothing");
    const b = await spawnWorker(r.infra.env, { JETGATE_WORKER_ID: "b" });
    r.procs.push(b);
    const p = await waitFor("the entry pushed by B", () => r.pushes.pushes.find((x) => x.push.entry.id === "crash1"), { timeoutMs: 10_000 });
    assert.equal(p.user, "carl");
    assert.equal(await b.metric("jetgate_worker_duplicates_total"), 0, "the dedup record of the same offset is not a duplicate");
    assert.equal(p.push.epoch, r.registry.state.shards.get(p.push.shard)!.epoch);
  } finally {
    await r.close();
  }
});

test("takeover - Redis loses the worker set and every lease (FLUSHALL, five times): each worker re-takes its own shard, no epoch changes", async () => {
  const r = await rig();
  const redis = await redisClient(r.infra.redis.url);
  try {
    const [a, b] = await twoWorkers(r);
    const owners = [await ownedShards(a), await ownedShards(b)];
    const epochs = () => [...r.registry.state.shards.values()].map((s) => `${s.shard}@${s.epoch}`).join(" ");
    const before = epochs();
    for (let i = 0; i < 5; i++) {
      await redis.flushall();
      // a flush right after a tick and one right before the next: both orders of the two workers
      await sleep(LEASE_MS / 3 + (i % 2) * 150);
    }
    await sleep(2 * LEASE_MS);
    await r.registry.sync();
    assert.equal(epochs(), before, "no takeover: the empty worker set did not make one worker take the other's shard");
    assert.deepEqual([await ownedShards(a), await ownedShards(b)], owners);
    assert.ok(a.output.concat(b.output).some((l) => l.includes("Redis lost the worker set")), "the workers said why they held back");
  } finally {
    redis.disconnect();
    await r.close();
  }
});

test("takeover - a delivery lost in flight (the consumer moved past an offset the worker never got): the worker fetches it before acking past it", async () => {
  const r = await rig();
  const nc = await connect({ servers: r.infra.nats.url });
  try {
    const w = await spawnWorker(r.infra.env, { JETGATE_WORKER_ID: "solo" });
    r.procs.push(w);
    await waitFor("it owns both shards", async () => (await ownedShards(w)).length === 2);
    const shard = r.registry.shards.shardOf("gail")!;
    const epoch = r.registry.state.shards.get(shard)!.epoch;
    const send = async (id: string) => {
      const [res] = await r.dispatcher.dispatch({ dispatch_id: id, message_id: id, lane: "default", recipients: ["gail"], body: new Uint8Array(1) });
      assert.ok(res && !("error" in res));
    };
    await send("g1");
    await waitFor("g1 pushed", () => r.pushes.pushes.some((p) => p.push.entry.id === "g1"));
    // the worker sleeps until its pull request has expired (10 s), so the next message goes to
    // whoever pulls next: this test, which never acks it, as if the response was lost on the way
    w.proc.kill("SIGSTOP");
    await sleep(11_000);
    await send("g2");
    const consumer = await jetstream(nc).consumers.get(shardStream(shard), workerConsumerName(epoch));
    const stolen = await consumer.next({ expires: 2000 });
    assert.ok(stolen !== null, "the test took the delivery of g2");
    await send("g3");
    w.proc.kill("SIGCONT");
    await waitFor("g3 pushed", () => r.pushes.pushes.some((p) => p.push.entry.id === "g3"), { timeoutMs: 15_000 });
    const ids = r.pushes.pushes.filter((p) => p.user === "gail").map((p) => p.push.entry.id);
    assert.deepEqual(ids, ["g1", "g2", "g3"], "g2 fetched by offset and pushed in order");
    assert.equal(await w.metric("jetgate_worker_delivery_gaps_total"), 1);
  } finally {
    await nc.close();
    await r.close();
  }
});

test("takeover - one epoch per ownership change: a worker claims the epoch init, `shard takeover` and `shard split` wrote; after a crash the next worker bumps", async () => {
  const r = await rig();
  try {
    const shard = (id: number) => r.registry.state.shards.get(id)!;
    const epochs = (ids: number[]) => ids.map((id) => shard(id).epoch);
    /** Waits until the worker has taken shards over `n` times in all (claims and bumps), then for the registry. */
    const takeovers = async (w: JetgateProcess, n: number) => {
      await waitFor(`${n} takeovers`, async () => (await w.metric("jetgate_worker_takeovers_total")) >= n, { timeoutMs: 15_000 });
      await r.registry.sync();
    };
    const w = await spawnWorker(r.infra.env, { JETGATE_WORKER_ID: "solo" });
    r.procs.push(w);
    await takeovers(w, 2);
    assert.deepEqual(epochs([0, 1]), [0, 0], "init's epoch 0 is claimed, not bumped");
    assert.deepEqual([shard(0).owner, shard(1).owner], ["solo", "solo"]);
    assert.deepEqual([shard(0).boundaries.length, shard(1).boundaries.length], [1, 1]);

    // E1 by hand: the CLI's bump fences solo; solo takes the shard again and claims that epoch
    const out = await runCli(r.infra.env, ["shard", "takeover", "0"]);
    assert.equal(out.code, 0, out.text);
    assert.match(out.text, /shard 0: epoch 0 -> 1/);
    await takeovers(w, 3);
    assert.equal(shard(0).epoch, 1, "`shard takeover` and the worker taking the shard spent one epoch");
    assert.equal(shard(0).owner, "solo");
    assert.deepEqual(shard(0).boundaries.map((b) => [b.epoch, b.cause]), [[0, "init"], [1, "takeover"]]);
    const user0 = users.find((u) => r.registry.shards.shardOf(u) === 0)!;
    await r.dispatcher.dispatch({ dispatch_id: "one1", message_id: "one1", lane: "default", recipients: [user0], body: new Uint8Array(1) });
    const p = await waitFor("an entry pushed after the takeover", () => r.pushes.pushes.find((x) => x.push.entry.id === "one1"), { timeoutMs: 10_000 });
    assert.equal(p.push.epoch, 1, "pushed under the operator's epoch");

    // E2: parent and child start at epoch 1; solo claims both
    const split = await runCli(r.infra.env, ["shard", "split", "1"]);
    assert.equal(split.code, 0, split.text);
    await takeovers(w, 5);
    assert.deepEqual(epochs([1, 2]), [1, 1], "the split spent one epoch on the parent, and the child starts at it");
    assert.deepEqual([shard(1).owner, shard(2).owner], ["solo", "solo"]);
    assert.deepEqual(shard(1).boundaries.map((b) => b.cause), ["init", "split"]);
    await sleep(2 * LEASE_MS);
    await r.registry.sync();
    assert.deepEqual(epochs([0, 1, 2]), [1, 1, 1], "nothing more while solo keeps its shards");

    // a crash: the epochs solo claimed are bumped by the next worker, once each
    await w.kill("SIGKILL");
    const next = await spawnWorker(r.infra.env, { JETGATE_WORKER_ID: "next" });
    r.procs.push(next);
    await takeovers(next, 3);
    assert.deepEqual(epochs([0, 1, 2]), [2, 2, 2]);
    assert.deepEqual([0, 1, 2].map((id) => [shard(id).owner, shard(id).boundaries.at(-1)!.cause]), [["next", "takeover"], ["next", "takeover"], ["next", "takeover"]]);
    assert.equal(await next.metric("jetgate_mailbox_seq_regression_total"), 0);
  } finally {
    await r.close();
  }
});
