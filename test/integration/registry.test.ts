import { test, after } from "node:test";
import assert from "node:assert/strict";
import { connect } from "@nats-io/transport-node";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { bumpEpoch, deriveSeq, encodeStoredEntry, entrySubject, type RegistryState } from "../../protocol/index.js";
import { loadConfig, RegistryClient, logOfStream, newLogId, shardStreamConfig } from "../../protocol/io/index.js";
import { initRegistry } from "../../worker/index.js";
import { cli } from "../../worker/cli.js";
import { NatsServer } from "../harness/servers.js";

const nats = await NatsServer.start();
const config = loadConfig({ JETGATE_NATS_URL: nats.url, JETGATE_SHARDS: "2" });
const nc = await connect({ servers: nats.url });
after(async () => {
  await nc.close();
  await nats.dispose();
});

test("registry - init creates registry, shard streams, INGRESS and the floors stream; a second run changes nothing", async () => {
  const first = await initRegistry(nc, { ...config, shards: 2, by: "test" });
  assert.equal(first.layoutWritten, true);
  assert.deepEqual(first.streamsCreated.sort(), ["INGRESS", "JETGATE_FLOORS", "MBX_0", "MBX_1"]);
  const second = await initRegistry(nc, { ...config, shards: 5, by: "test" });
  assert.equal(second.layoutWritten, false);
  assert.equal(second.shards, 2, "the existing layout wins");
  assert.deepEqual(second.streamsCreated, []);
  assert.deepEqual(second.mismatched, []);
  assert.deepEqual(second.atomicEnabled, []);
  const reg = await RegistryClient.open(nc);
  try {
    assert.equal(reg.state.seq, 1, "exactly one record");
    const jsm = await jetstreamManager(nc);
    const info = await jsm.streams.info("MBX_0");
    assert.equal(logOfStream(info), reg.state.shards.get(0)!.log);
    assert.equal(info.config.allow_direct, true);
    assert.equal(info.config.allow_atomic, true, "the Dispatcher's atomic batches");
    assert.deepEqual(info.config.subjects, ["mbx.0.>"]);
    // a stream an older jetgate made, without atomic batches: the next init allows them, and only that
    await jsm.streams.update("MBX_1", { ...(await jsm.streams.info("MBX_1")).config, allow_atomic: false });
    const third = await initRegistry(nc, { ...config, shards: 2, by: "test" });
    assert.deepEqual(third.atomicEnabled, ["MBX_1"]);
    const after1 = await jsm.streams.info("MBX_1");
    assert.equal(after1.config.allow_atomic, true);
    assert.equal(logOfStream(after1), reg.state.shards.get(1)!.log);
  } finally {
    await reg.close();
  }
});

test("registry - the CLI prints what it did, and refuses unknown commands with usage", async () => {
  const lines: string[] = [];
  const saved = process.env.JETGATE_NATS_URL;
  process.env.JETGATE_NATS_URL = nats.url;
  try {
    assert.equal(await cli(["registry", "init"], (l) => lines.push(l)), 0);
    assert.match(lines[0]!, /already initialised \(2 shards\); nothing changed/);
    lines.length = 0;
    assert.equal(await cli(["registry", "show"], (l) => lines.push(l)), 0);
    assert.ok(lines.some((l) => /^shard 0 active range 0x00000000-0x7fffffff epoch 0 log \S+ \(1 boundaries, 0 splits; epoch unclaimed\)$/.test(l)), lines.join("\n"));
    assert.ok(lines.some((l) => /^ {2}epoch 0 init log \S+ start_offset 1 start_seq 1 \(0:1\) prev_end_seq 0 \(0:0\)$/.test(l)), `boundaries with epoch:offset: ${lines.join("\n")}`);
    await assert.rejects(cli(["registry", "explode"]), { name: "UsageError" });
    await assert.rejects(cli(["registry", "init", "--shards", "x"]), { name: "ConfigError", message: /JETGATE_SHARDS/ });
  } finally {
    process.env.JETGATE_NATS_URL = saved;
  }
});

test("registry - two writers racing to bump one shard: one wins each round, epochs never repeat", async () => {
  const a = await RegistryClient.open(nc);
  const b = await RegistryClient.open(nc);
  try {
    const start = a.state.shards.get(1)!.epoch;
    const rounds = 15;
    for (let round = 0; round < rounds; round++) {
      const base = a.state.shards.get(1)!.epoch;
      // Each writer bumps only if the epoch is still the one it saw: a takeover's rule.
      const attempt = (c: RegistryClient, by: string) =>
        c.update((s: RegistryState) => {
          const cur = s.shards.get(1)!;
          if (cur.epoch !== base) return null;
          return { v: 1, op: "takeover", at: Date.now(), by, shards: [bumpEpoch(cur, { cause: "takeover", start_offset: 1 + round })] };
        });
      const results = await Promise.all([attempt(a, "a"), attempt(b, "b")]);
      assert.equal(results.filter((r) => r !== null).length, 1, `round ${round}: exactly one winner`);
      await b.waitFor(a.state.seq);
    }
    const shard = b.state.shards.get(1)!;
    assert.equal(shard.epoch, start + rounds);
    const epochs = shard.boundaries.map((x) => x.epoch);
    assert.deepEqual(epochs, [...new Set(epochs)].sort((x, y) => x - y), "ascending, no repeats");
    assert.equal(shard.boundaries.length, start + rounds + 1, "every bump has its boundary");
    assert.ok(shard.boundaries.slice(1).every((x) => x.cause === "takeover"));
  } finally {
    await a.close();
    await b.close();
  }
});

test("registry - seqs keep increasing across a bump in one stream and across a deleted and recreated stream", async () => {
  const reg = await RegistryClient.open(nc);
  const js = jetstream(nc);
  const jsm = await jetstreamManager(nc);
  const body = encodeStoredEntry({ id: "m", d: "d", ts: 1, b: new Uint8Array(0) });
  const seqs: bigint[] = [];
  const publishAndDerive = async (n: number) => {
    for (let i = 0; i < n; i++) {
      const ack = await js.publish(entrySubject(0, "alice", "default"), body);
      const s = reg.state.shards.get(0)!;
      seqs.push(deriveSeq(s, s.log, ack.seq)!);
    }
  };
  try {
    await publishAndDerive(5);
    let s = reg.state.shards.get(0)!;
    await reg.update(() => ({ v: 1, op: "takeover", at: 0, by: "t", shards: [bumpEpoch(s, { cause: "takeover", start_offset: 4 })] }));
    await publishAndDerive(5);
    // E3: delete and recreate the stream; offsets restart at 1 under a new log and a new epoch.
    s = reg.state.shards.get(0)!;
    const oldLast = (await jsm.streams.info("MBX_0")).state.last_seq;
    const log = newLogId();
    await reg.update(() => ({ v: 1, op: "rebuild", at: 0, by: "t", shards: [bumpEpoch(s, { cause: "rebuild", log, start_offset: 1, prev_end_offset: oldLast })] }));
    await jsm.streams.delete("MBX_0");
    await jsm.streams.add(shardStreamConfig(0, log, config));
    await publishAndDerive(5);
    const first = await jsm.streams.info("MBX_0");
    assert.equal(first.state.first_seq, 1, "offsets restarted");
    for (let i = 1; i < seqs.length; i++) assert.ok(seqs[i]! > seqs[i - 1]!, `seq ${i} increases: ${seqs[i - 1]} -> ${seqs[i]}`);
    const b = reg.state.shards.get(0)!.boundaries.at(-1)!;
    assert.equal(b.prev_end_seq, seqs[9], "the rebuild boundary records the old log's last seq");
  } finally {
    await reg.close();
  }
});

test("registry - a follower keeps following across a nats-server SIGKILL and restart", async () => {
  const follower = await RegistryClient.open(nc);
  try {
    const before = follower.state.seq;
    await nats.kill();
    await nats.start();
    const writerNc = await connect({ servers: nats.url });
    const writer = await RegistryClient.open(writerNc);
    await writer.update((st) => ({ v: 1, op: "takeover", at: Date.now(), by: "t", shards: [bumpEpoch(st.shards.get(1)!, { cause: "takeover", start_offset: 1 })] }));
    await follower.waitFor(writer.state.seq, 20_000);
    assert.ok(follower.state.seq > before);
    assert.equal(follower.state.shards.get(1)!.epoch, writer.state.shards.get(1)!.epoch);
    await writer.close();
    await writerNc.close();
  } finally {
    await follower.close();
  }
});
