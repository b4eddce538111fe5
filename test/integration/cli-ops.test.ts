import { test } from "node:test";
import assert from "node:assert/strict";
import { AckPolicy, DeliverPolicy, jetstream, jetstreamManager } from "@nats-io/jetstream";
import { REGISTRY_STREAM, bumpEpoch, frozenSubject, claimEpoch, encodeStoredEntry, entrySubject, halfRange, shardStream, shardSubjects, splitShard, workerConsumerName } from "../../protocol/index.js";
import { loadConfig, RegistryClient, logOfStream, newLogId, shardStreamConfig } from "../../protocol/io/index.js";
import { registryRig } from "../harness/registry-rig.js";
import { runCli } from "../harness/cli.js";

const { infra, nc, registry } = await registryRig({ JETGATE_SHARDS: "2" });
const jsm = await jetstreamManager(nc);
const js = jetstream(nc);

async function append(shard: number, n: number, prefix: string): Promise<void> {
  for (let i = 0; i < n; i++) {
    await js.publish(entrySubject(shard, `u${i % 3}`, "default"), encodeStoredEntry({ id: `${prefix}${i}`, d: `${prefix}${i}`, ts: Date.now(), b: new Uint8Array(2) }), { msgID: `${prefix}${i}:u${i % 3}` });
  }
}

test("cli - bad usage exits 64 with the usage text, naming what is wrong", async () => {
  for (const [args, says] of [
    [["shard"], /usage:/],
    [["shard", "split", "abc"], /shard id must be a non-negative integer, got abc/],
    [["shard", "explode", "1"], /usage:/],
    [["failover"], /--to <nats-url> is required/],
    [["failover", "--to", infra.nats.url, "--epoch-margin", "x"], /--epoch-margin must be a non-negative integer/],
    [["replica", "setup", "--to", infra.nats.url], /--source-api <prefix> is required/],
    [["shard", "takeover", "0", "--bogus"], /bogus/],
  ] as const) {
    const r = await runCli(infra.env, [...args]);
    assert.equal(r.code, 64, `${args.join(" ")}: ${r.text}`);
    assert.match(r.text, says);
  }
});

test("cli - refused operations exit 2 with a clear message", async () => {
  let r = await runCli(infra.env, ["shard", "takeover", "9"]);
  assert.equal(r.code, 2, r.text);
  assert.match(r.text, /shard 9 is not in the registry/);
  r = await runCli(infra.env, ["shard", "split", "0", "--child", "1"]);
  assert.equal(r.code, 2, r.text);
  assert.match(r.text, /shard 1 exists already/);
  r = await runCli(infra.env, ["failover", "--to", infra.nats.url, "--epoch-margin", "0"]);
  assert.equal(r.code, 2, r.text);
  assert.match(r.text, /--epoch-margin must be a positive integer/);
});

test("cli - shard takeover on an epoch no worker has claimed: nothing to fence, no epoch spent, no record written", async () => {
  await registry.sync();
  const s = registry.state.shards.get(1)!;
  assert.equal(s.owner, null, "registry init's epoch, unclaimed (no worker runs here)");
  const seq = registry.state.seq;
  const r = await runCli(infra.env, ["shard", "takeover", "1"]);
  assert.equal(r.code, 0, r.text);
  assert.match(r.text, new RegExp(`shard 1: epoch ${s.epoch} is free \\(it is not claimed by any worker yet\\), so there is nothing to fence; no epoch spent`));
  await registry.sync();
  assert.equal(registry.state.seq, seq, "no record");
  assert.equal(registry.state.shards.get(1)!.epoch, s.epoch);
});

test("cli - shard takeover bumps a claimed epoch from the ack floor", async () => {
  // a worker's claim, as a worker taking the shard writes it
  await registry.update((st) => ({ v: 1, op: "takeover", at: Date.now(), by: "w-test", shards: [claimEpoch(st.shards.get(1)!, "w-test")] }));
  const before = registry.state.shards.get(1)!.epoch;
  const r = await runCli(infra.env, ["shard", "takeover", "1"]);
  assert.equal(r.code, 0, r.text);
  assert.match(r.text, new RegExp(`shard 1: epoch ${before} -> ${before + 1}`));
  await registry.sync();
  assert.equal(registry.state.shards.get(1)!.boundaries.at(-1)!.cause, "takeover");
  assert.equal(registry.state.shards.get(1)!.owner, null, "unclaimed: the next worker to take the shard claims this epoch");
});

test("cli - shard takeover takes the floor from the newest epoch's consumer: an older one left behind by a claimer that died does not skip entries", async () => {
  // shard 0 (shard 1's entries are the rebuild test's): an operator's takeover at offset 1, then the owners below
  await registry.update((st) => ({ v: 1, op: "takeover", at: Date.now(), by: "test", shards: [bumpEpoch(st.shards.get(0)!, { cause: "takeover", start_offset: 1, owner: null })] }));
  await append(0, 12, "fl");
  const stream = shardStream(0);
  const epoch = registry.state.shards.get(0)!.epoch;
  // the previous owner (epoch - 1) acked offsets 1..10
  await jsm.consumers.add(stream, { durable_name: workerConsumerName(epoch - 1), ack_policy: AckPolicy.All, deliver_policy: DeliverPolicy.All });
  const old = await js.consumers.get(stream, workerConsumerName(epoch - 1));
  let last;
  for await (const m of await old.fetch({ max_messages: 10, expires: 5000 })) last = m;
  assert.equal(last?.seq, 10);
  await last!.ackAck();
  // the claimer of `epoch` started again at offset 4 (the old owner's entries past the boundary), then died before deleting the older consumer
  await jsm.consumers.add(stream, { durable_name: workerConsumerName(epoch), ack_policy: AckPolicy.All, deliver_policy: DeliverPolicy.StartSequence, opt_start_seq: 4 });
  await registry.update((st) => ({ v: 1, op: "takeover", at: Date.now(), by: "w-dead", shards: [claimEpoch(st.shards.get(0)!, "w-dead")] }));
  try {
    const r = await runCli(infra.env, ["shard", "takeover", "0"]);
    assert.equal(r.code, 0, r.text);
    assert.match(r.text, /takeover from offset 4\)/, "from the newest consumer's floor (3), not the older one's (10)");
    await registry.sync();
    assert.equal(registry.state.shards.get(0)!.boundaries.at(-1)!.start_offset, 4);
  } finally {
    for (const e of [epoch - 1, epoch]) await jsm.consumers.delete(stream, workerConsumerName(e)).catch(() => undefined);
  }
});

test("cli - shard split: a run that stopped after the registry write is finished by the next run", async () => {
  await append(0, 5, "s");
  const cut = (await jsm.streams.info(shardStream(0))).state.last_seq;
  // what a crashed run leaves: the record, no child stream
  const childLog = newLogId();
  await registry.update((st) => ({ v: 1, op: "split", at: Date.now(), by: "test", shards: splitShard(st.shards.get(0)!, { child: 5, childLog, moved: halfRange(st.shards.get(0)!.range, true), cutOffset: cut }) }));
  const r = await runCli(infra.env, ["shard", "split", "0"]);
  assert.equal(r.code, 0, r.text);
  assert.match(r.text, /resuming/);
  assert.equal(logOfStream(await jsm.streams.info(shardStream(5))), childLog, "the child's stream, on the recorded log");
  // a complete split run: the record and the stream, and a new child id
  const again = await runCli(infra.env, ["shard", "split", "0"]);
  assert.equal(again.code, 0, again.text);
  assert.match(again.text, /split recorded; hashes 0x[0-9a-f]{8}-0x[0-9a-f]{8} move to shard 6/);
  // what it changed, seqs with their epoch:offset
  assert.match(again.text, /parent epoch \d+ -> \d+, keeps 0x[0-9a-f]{8}-0x[0-9a-f]{8}; split_at_seq \d+ \(\d+:\d+\)/);
  assert.match(again.text, /child 6 starts at epoch \d+, seq \d+ \(\d+:1\), log \S+/);
  assert.match(again.text, /parent boundary: epoch \d+ from offset \d+ \(seq \d+ \(\d+:\d+\)\); offsets up to \d+ stay the parent's for moved users/);
  assert.ok((await jsm.streams.info(shardStream(6))).config.subjects?.includes(shardSubjects(6)));
});

/** An RFC 3339 timestamp with nanoseconds (what NATS reports) as nanoseconds since the epoch. */
function nanosOf(iso: string): bigint {
  const m = /^(.*T\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)$/.exec(iso);
  assert.ok(m, `a timestamp: ${iso}`);
  return BigInt(Date.parse(`${m[1]}${m[3]}`)) * 1_000_000n + BigInt((m[2] ?? "").padEnd(9, "0"));
}

test("cli - shard split: the child's stream exists before any process can see the child in the registry", async () => {
  await append(0, 4, "o");
  await registry.sync();
  const child = Math.max(...registry.state.shards.keys()) + 1;
  // a process following the registry, as every gateway and worker does
  const follower = await RegistryClient.open(nc);
  let recordSeq = 0;
  let existsAtApply: Promise<boolean> | undefined;
  follower.onChange((st) => {
    if (existsAtApply !== undefined || !st.shards.has(child)) return;
    recordSeq = st.seq;
    existsAtApply = jsm.streams.info(shardStream(child)).then(() => true, () => false);
  });
  try {
    const r = await runCli(infra.env, ["shard", "split", "0"]);
    assert.equal(r.code, 0, r.text);
    assert.match(r.text, new RegExp(`move to shard ${child}`));
    await follower.sync();
    assert.ok(existsAtApply !== undefined, "the follower applied the split record");
    assert.equal(await existsAtApply, true, "the child's stream existed when the record was applied");
    // and on the server's clock: the stream was created before the record was stored
    const info = await jsm.streams.info(shardStream(child));
    const record = await jsm.streams.getMessage(REGISTRY_STREAM, { seq: recordSeq });
    assert.ok(record !== null);
    assert.ok(nanosOf(info.created) < nanosOf(record.timestamp), `stream created ${info.created}, record stored ${record.timestamp}`);
    assert.equal(logOfStream(info), follower.state.shards.get(child)!.log, "the stream is the child's log");
    assert.deepEqual([follower.state.shards.get(0)!.owner, follower.state.shards.get(child)!.owner], [null, null], "both epochs unclaimed");
    assert.ok(r.text.indexOf(`stream ${shardStream(child)}: created`) < r.text.indexOf("split recorded"), r.text);
  } finally {
    await follower.close();
  }
});

test("cli - shard split: a run that stopped after creating the child's stream is finished by the next run; a used stream is refused", async () => {
  const settings = loadConfig(infra.env);
  await registry.sync();
  const child = Math.max(...registry.state.shards.keys()) + 1;
  // what a run that crashed between its two steps leaves: the child's empty stream, no record
  const log = newLogId();
  const left = await jsm.streams.add(shardStreamConfig(child, log, settings));
  const r = await runCli(infra.env, ["shard", "split", "0"]);
  assert.equal(r.code, 0, r.text);
  assert.match(r.text, /resuming/);
  assert.match(r.text, new RegExp(`move to shard ${child}`));
  await registry.sync();
  assert.equal(registry.state.shards.get(child)!.log, log, "the registry adopted the stream's log");
  const info = await jsm.streams.info(shardStream(child));
  assert.equal(info.created, left.created, "the same stream, not a new one");
  assert.equal(logOfStream(info), log);

  // a stream of the next child's name that has entries in it: refused, nothing written
  const next = child + 1;
  await jsm.streams.add(shardStreamConfig(next, newLogId(), settings));
  await js.publish(entrySubject(next, "u0", "default"), encodeStoredEntry({ id: "x", d: "x", ts: 0, b: new Uint8Array(1) }));
  const head = registry.state.seq;
  const refused = await runCli(infra.env, ["shard", "split", "0"]);
  assert.equal(refused.code, 2, refused.text);
  assert.match(refused.text, new RegExp(`stream ${shardStream(next)} exists and has had entries appended .* shard ${next} is not in the registry`));
  assert.equal((await registry.sync()).seq, head, "no registry record");
  await jsm.streams.delete(shardStream(next));
});

test("cli - shard rebuild: a new log holding the old entries in order; a crashed run is resumed", async () => {
  await append(1, 7, "r");
  const old = await jsm.streams.info(shardStream(1));
  let r = await runCli(infra.env, ["shard", "rebuild", "1"]);
  assert.equal(r.code, 0, r.text);
  await registry.sync();
  let s = registry.state.shards.get(1)!;
  let info = await jsm.streams.info(shardStream(1));
  assert.equal(logOfStream(info), s.log);
  assert.equal(info.state.messages, old.state.messages, "every old entry re-appended");
  // at the end it says what changed: epoch and log, the boundary, the offsets the new log holds
  const was = s.boundaries.at(-2)!;
  assert.match(r.text, new RegExp(`shard 1: rebuilt: epoch ${was.epoch} -> ${s.epoch}, log ${was.log} -> ${s.log}`));
  assert.match(r.text, new RegExp(`boundary: epoch ${s.epoch} from offset 1 \\(seq \\d+ \\(${s.epoch}:1\\)\\), prev_end_seq \\d+ \\(${was.epoch}:${old.state.last_seq}\\)`));
  assert.match(r.text, new RegExp(`stream ${shardStream(1)}: offsets 1\\.\\.${old.state.messages} \\(${old.state.messages} messages\\) on the new log`));
  assert.equal(info.state.first_seq, 1, "offsets restart at 1");
  const first = await jsm.streams.getMessage(shardStream(1), { seq: 1 });
  assert.equal(first?.subject, entrySubject(1, "u0", "default"));
  assert.equal(first?.header.get("Nats-Msg-Id"), "r0:u0", "re-appended with its Nats-Msg-Id");
  await js.publish(entrySubject(1, "u1", "default"), encodeStoredEntry({ id: "after", d: "after", ts: 0, b: new Uint8Array(1) }));
  assert.equal((await jsm.streams.info(shardStream(1))).state.messages, old.state.messages + 1, "takes appends again");

  // a run that crashed after freezing and writing the registry
  const frozen = await jsm.streams.info(shardStream(1));
  await jsm.streams.update(shardStream(1), { ...frozen.config, subjects: [frozenSubject(1)] });
  await registry.update((st) => ({ v: 1, op: "rebuild", at: Date.now(), by: "test", shards: [bumpEpoch(st.shards.get(1)!, { cause: "rebuild", log: newLogId(), start_offset: 1, prev_end_offset: frozen.state.last_seq })] }));
  r = await runCli(infra.env, ["shard", "rebuild", "1"]);
  assert.equal(r.code, 0, r.text);
  assert.match(r.text, /resuming/);
  await registry.sync();
  s = registry.state.shards.get(1)!;
  info = await jsm.streams.info(shardStream(1));
  assert.equal(logOfStream(info), s.log);
  assert.equal(info.state.messages, frozen.state.messages);
  assert.ok(info.config.subjects?.includes(shardSubjects(1)));
  await assert.rejects(jsm.streams.info(`${shardStream(1)}_REBUILD`), "the holding stream is gone");
});
