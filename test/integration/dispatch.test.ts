import { test } from "node:test";
import assert from "node:assert/strict";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import {
  decodeStoredEntry,
  parseEntrySubject,
  composeSeq,
  seqEpoch,
  seqOffset,
  shardStream,
  DispatchValidationError,
  MAX_RECIPIENTS,
} from "../../protocol/index.js";
import { Dispatcher } from "../../protocol/io/index.js";
import { spawnGateway, spawnWorker, PushCollector } from "../harness/stack.js";
import { registryRig } from "../harness/registry-rig.js";
import { runCli } from "../harness/cli.js";
import { sleep, waitFor } from "../harness/wait.js";

const { infra, nc, registry } = await registryRig({}, { maxReconnectAttempts: -1, reconnectTimeWait: 100 });

async function streamCount(): Promise<number> {
  const jsm = await jetstreamManager(nc);
  let n = 0;
  for (const s of ["MBX_0", "MBX_1"]) n += (await jsm.streams.info(s)).state.messages;
  return n;
}

const ok = { dispatch_id: "d1", message_id: "m1", lane: "default", recipients: ["alice", "bob"], body: new Uint8Array([1]) };

test("dispatch - bad input gets a named error naming the field, and nothing is published", async () => {
  const d = new Dispatcher(nc, () => registry.shards, { lanes: ["default", "chat"], maxBodyBytes: 1024 });
  const before = await streamCount();
  const cases: [string, object, RegExp][] = [
    ["unsafe dispatch id", { ...ok, dispatch_id: "d.1" }, /^dispatch_id: dispatch id may contain only/],
    ["unsafe message id", { ...ok, message_id: "m*" }, /^message_id: /],
    ["unsafe recipient", { ...ok, recipients: ["alice", "b>b"] }, /^recipients\.1: user id/],
    ["empty recipients", { ...ok, recipients: [] }, /^recipients: must name at least one recipient/],
    ["too many recipients", { ...ok, recipients: Array.from({ length: MAX_RECIPIENTS + 1 }, (_, i) => `u${i}`) }, /^recipients: must name at most/],
    ["repeated recipient", { ...ok, recipients: ["alice", "alice"] }, /^recipients: recipients must be unique/],
    ["oversize body", { ...ok, body: new Uint8Array(1025) }, /^body: 1025 bytes exceeds the limit of 1024/],
    ["body not bytes", { ...ok, body: "hello" }, /^body: must be bytes/],
    ["unknown lane", { ...ok, lane: "gossip" }, /^lane: unknown lane "gossip"; configured lanes: default, chat/],
    ["unknown field", { ...ok, extra: 1 }, /request|extra/],
  ];
  for (const [name, req, re] of cases) {
    await assert.rejects(d.dispatch(req as typeof ok), (e: unknown) => {
      assert.ok(e instanceof DispatchValidationError, name);
      assert.equal(e.name, "DispatchValidationError");
      assert.match(e.message, re, name);
      return true;
    });
  }
  assert.equal(await streamCount(), before, "nothing was published");
  d.close();
});

test("dispatch - one result per recipient; the same dispatch inside the window is a duplicate", async () => {
  const d = new Dispatcher(nc, () => registry.shards, { lanes: ["default"] });
  const first = await d.dispatch(ok);
  assert.deepEqual(first.map((r) => r.user), ["alice", "bob"]);
  for (const r of first) {
    assert.ok("seq" in r && r.duplicate === false && r.shard === registry.shards.shardOf(r.user));
    assert.equal(typeof r.seq, "bigint");
    assert.equal(r.seq, composeSeq(registry.state.shards.get(r.shard)!.epoch, r.offset), "the mailbox_seq of the offset");
  }
  const again = await d.dispatch(ok);
  for (const [i, r] of again.entries()) {
    const f = first[i]!;
    assert.ok("seq" in r && r.duplicate === true && "seq" in f);
    assert.equal(r.seq, f.seq);
    assert.equal(r.offset, f.offset);
  }
  d.close();
});

test("dispatch - each user's entries stay in dispatch order while nats-server stops and publishes time out", async () => {
  const d = new Dispatcher(nc, () => registry.shards, { lanes: ["default"], ackTimeoutMs: 150, attempts: 30, minBatch: 2 });
  const users = Array.from({ length: 20 }, (_, i) => `ord${i}`);
  const perUser = 40;
  const sent = new Map<string, string[]>(users.map((u) => [u, []]));
  const pending: Promise<unknown>[] = [];
  const pauses = (async () => {
    for (let i = 0; i < 3; i++) {
      await sleep(60);
      infra.nats.pause(); // nats-server stops answering: in-flight publishes time out
      await sleep(400);
      infra.nats.resume();
    }
  })();
  for (let n = 0; n < perUser; n++) {
    for (const u of users) {
      const id = `${u}-${n}`;
      sent.get(u)!.push(id);
      pending.push(d.dispatch({ dispatch_id: `o${id}`, message_id: id, lane: "default", recipients: [u], body: new Uint8Array(0) }));
    }
    if (n % 10 === 0) await sleep(30);
  }
  const results = (await Promise.all(pending)).flat() as { error?: unknown }[];
  await pauses;
  assert.equal(results.filter((r) => r.error !== undefined).length, 0, "every entry was appended");
  // a stopped nats-server reads nothing: a publish is held at its deadline, not sent again
  assert.ok(d.stats.held > 0, `ack deadlines passed (${d.stats.held} held, ${d.stats.retries} sent again)`);
  // batches form behind the pauses' backlog; those caught by a pause fall back to one at a time
  assert.ok(d.stats.batches + d.stats.batchFallbacks > 0, `queued entries went in batches (${d.stats.batches} committed, ${d.stats.batchFallbacks} fell back to one at a time)`);
  // Read both shard streams in order and compare each user's sequence with the dispatch order.
  const js = jetstream(nc);
  const seen = new Map<string, string[]>(users.map((u) => [u, []]));
  for (const stream of ["MBX_0", "MBX_1"]) {
    const jsm = await jetstreamManager(nc);
    const last = (await jsm.streams.info(stream)).state.last_seq;
    const c = await js.consumers.get(stream);
    const it = await c.fetch({ max_messages: last });
    for await (const m of it) {
      const user = parseEntrySubject(m.subject)!.user;
      if (seen.has(user)) seen.get(user)!.push(decodeStoredEntry(m.data).id);
      if (m.seq >= last) break;
    }
  }
  for (const u of users) assert.deepEqual(seen.get(u), sent.get(u), `order of ${u}`);
  d.close();
});

test("dispatch - the result's seq is the mailbox_seq the entry is pushed with (a decimal string over HTTP), offset the stream offset", async () => {
  const pushes = await PushCollector.start(infra.nats.url, infra.redis.url);
  const worker = await spawnWorker(infra.env, { JETGATE_WORKER_ID: "dw", JETGATE_LEASE_MS: "1000" });
  const gateway = await spawnGateway(infra.env, { JETGATE_SERVICE_TOKEN: "svc-secret" });
  const d = new Dispatcher(nc, () => registry.shards, { lanes: ["default"] });
  try {
    await waitFor("the worker runs both shards", async () => (await worker.metric("jetgate_worker_lease_held")) === 2, { timeoutMs: 20_000 });
    const user = "hana";
    await pushes.watch(user);
    const shard = registry.shards.shardOf(user)!;
    const post = async (id: string) => {
      const res = await fetch(`http://127.0.0.1:${gateway.httpPort}/v1/dispatch`, {
        method: "POST",
        headers: { authorization: "Bearer svc-secret", "content-type": "application/json" },
        body: JSON.stringify({ dispatch_id: id, message_id: id, lane: "default", recipients: [user], body: id }),
      });
      assert.equal(res.status, 200);
      const [r] = ((await res.json()) as { results: { user: string; shard: number; seq: unknown; offset: unknown; duplicate: boolean }[] }).results;
      assert.ok(r !== undefined && r.user === user && r.shard === shard);
      assert.equal(typeof r.seq, "string", "a mailbox_seq passes 2^53: JSON carries it as a decimal string");
      assert.match(r.seq as string, /^\d+$/);
      assert.equal(typeof r.offset, "number");
      return { seq: BigInt(r.seq as string), offset: r.offset as number };
    };
    const pushed = (id: string) => waitFor(`${id} pushed`, () => pushes.pushes.find((p) => p.push.entry.id === id)?.push.entry.seq, { timeoutMs: 15_000 });

    const r1 = await post("hs1");
    assert.equal(r1.seq, await pushed("hs1"), "the seq the device gets");
    assert.equal(seqOffset(r1.seq), BigInt(r1.offset));

    // an epoch change (the worker claims the operator's epoch): the seq carries the epoch bits
    const before = registry.state.shards.get(shard)!.epoch;
    const out = await runCli(infra.env, ["shard", "takeover", String(shard)]);
    assert.equal(out.code, 0, out.text);
    await waitFor("the worker took the shard again", () => {
      const s = registry.state.shards.get(shard)!;
      return s.epoch === before + 1 && s.owner === "dw";
    }, { timeoutMs: 15_000 });
    const r2 = await post("hs2");
    assert.equal(seqEpoch(r2.seq), before + 1);
    assert.ok(r2.seq > BigInt(r2.offset), "a mailbox_seq (epoch << 48 | offset), not the offset");
    assert.equal(seqOffset(r2.seq), BigInt(r2.offset));
    assert.equal(r2.seq, await pushed("hs2"), "the seq the device gets");
    const stored = await (await jetstreamManager(nc)).streams.getMessage(shardStream(shard), { seq: r2.offset });
    assert.equal(stored !== null && decodeStoredEntry(stored.data).id, "hs2", "offset is the entry's stream sequence");

    // the library result: seq a bigint, offset a number
    const [r3] = await d.dispatch({ dispatch_id: "hs3", message_id: "hs3", lane: "default", recipients: [user], body: new Uint8Array(1) });
    assert.ok(r3 !== undefined && "seq" in r3);
    assert.equal(typeof r3.seq, "bigint");
    assert.equal(r3.seq, composeSeq(before + 1, r3.offset));
    assert.equal(r3.seq, await pushed("hs3"));

    // a batch request of 100 dispatches to one user: the first goes alone, the 99 behind it as one atomic batch
    const many = Array.from({ length: 100 }, (_, i) => ({ dispatch_id: `hm${i}`, message_id: `hm${i}`, lane: "default", recipients: [user], body: `hm${i}` }));
    const res = await fetch(`http://127.0.0.1:${gateway.httpPort}/v1/dispatch/batch`, {
      method: "POST",
      headers: { authorization: "Bearer svc-secret", "content-type": "application/json" },
      body: JSON.stringify({ dispatches: many }),
    });
    assert.equal(res.status, 200, await res.clone().text());
    const offsets = ((await res.json()) as { dispatches: { results: { offset: number }[] }[] }).dispatches.map((a) => a.results[0]!.offset);
    assert.ok(offsets.every((o, i) => i === 0 || o === offsets[i - 1]! + 1), `consecutive offsets, in order: ${offsets.join(",")}`);
    // one batch, committed (or, on a box so loaded that its answer took over the 2 s ack wait, fallen back)
    const batches = await gateway.metric("jetgate_gateway_dispatch_batches_total");
    assert.equal(batches + (await gateway.metric("jetgate_gateway_dispatch_batch_fallbacks_total")), 1);
    assert.equal(await gateway.metric("jetgate_gateway_dispatch_batched_entries_total"), 99 * batches);
    assert.equal(await gateway.metric("jetgate_gateway_dispatch_entries_total"), 102, "hs1, hs2 and the 100");
  } finally {
    d.close();
    await gateway.kill();
    await worker.kill();
    await pushes.close();
  }
});

test("dispatch - dispatchMany: all validated before any is appended; then each user's entries in array order", async () => {
  const d = new Dispatcher(nc, () => registry.shards, { lanes: ["default", "chat"] });
  const before = await streamCount();
  const one = (id: string, recipients: string[]) => ({ dispatch_id: id, message_id: id, lane: "default", recipients, body: new Uint8Array([1]) });
  await assert.rejects(d.dispatchMany([one("dm1", ["ann"]), one("dm2", ["ann", "b.b"])]), (e: unknown) => {
    assert.ok(e instanceof DispatchValidationError);
    assert.equal(e.field, "dispatches.1.recipients.1");
    assert.match(e.message, /^dispatches\.1\.recipients\.1: user id may contain only/);
    return true;
  });
  assert.equal(await streamCount(), before, "nothing of the refused batch was published");
  // one dispatch_id twice with another body: one would be dropped as a duplicate, silently
  const other = { ...one("dm3", ["ann"]), body: new Uint8Array([2]) };
  await assert.rejects(d.dispatchMany([one("dm3", ["ann"]), one("dm4", ["ben"]), other]), (e: unknown) => {
    assert.ok(e instanceof DispatchValidationError);
    assert.equal(e.field, "dispatches.2.dispatch_id");
    assert.match(e.message, /^dispatches\.2\.dispatch_id: repeats the dispatch_id of dispatches\.0 with another body/);
    return true;
  });
  for (const [field, value] of [["message_id", "x"], ["lane", "chat"], ["recipients", ["ben"]]] as const) {
    await assert.rejects(d.dispatchMany([one("dm5", ["ann"]), { ...one("dm5", ["ann"]), [field]: value }]), new RegExp(`another ${field}`));
  }
  assert.equal(await streamCount(), before, "nothing of those batches was published");
  // the same dispatch twice is a retry: the second is the first's duplicate
  const twice = await d.dispatchMany([one("dm6", ["ann"]), one("dm6", ["ann"])]);
  assert.ok("seq" in twice[0]![0]! && "seq" in twice[1]![0]! && twice[1]![0]!.duplicate && twice[1]![0]!.seq === twice[0]![0]!.seq);
  const all = await d.dispatchMany(Array.from({ length: 20 }, (_, i) => one(`dm-ok${i}`, ["ann", "ben"])));
  const seqs = all.map((results) => {
    const r = results[0]!;
    assert.ok("seq" in r);
    return r.seq;
  });
  assert.ok(seqs.every((s, i) => i === 0 || s > seqs[i - 1]!), "ann's entries in array order");
  d.close();
});

test("dispatch - a dispatch many times the byte window goes out through it: never more in flight, every entry acknowledged within its wait", async () => {
  // 1,000 x 64 KiB (65.5 MB) at a 1 MiB window, one attempt of 500 ms each: published all at once, the
  // later acks came after their wait and the answer said DISPATCH_TIMEOUT for entries that landed
  const window = 1024 * 1024;
  const d = new Dispatcher(nc, () => registry.shards, { lanes: ["default"], ackTimeoutMs: 500, attempts: 1, maxInFlightBytes: window });
  const recipients = Array.from({ length: 1000 }, (_, i) => `win${i}`);
  let peak = 0;
  const sample = setInterval(() => (peak = Math.max(peak, d.inFlightBytes)), 1);
  const before = await streamCount();
  try {
    const results = await d.dispatch({ dispatch_id: "win", message_id: "win", lane: "default", recipients, body: new Uint8Array(64 * 1024) });
    assert.deepEqual(results.filter((r) => "error" in r), [], "every entry confirmed");
    assert.equal(await streamCount(), before + recipients.length, "each appended once");
  } finally {
    clearInterval(sample);
    d.close();
  }
  assert.ok(peak > 0 && peak <= window, `in flight at most the window (peak ${peak})`);
  assert.equal(d.inFlightBytes, 0);
});

test("dispatch - a large dispatch is sliced; a smaller call made after it still lands after it for a shared user", async () => {
  const d = new Dispatcher(nc, () => registry.shards, { lanes: ["default"] });
  const many = Array.from({ length: 3000 }, (_, i) => `slc${i}`);
  // the big one (sliced over turns), then at once a one-recipient dispatch to its last user
  const big = d.dispatch({ dispatch_id: "slice-big", message_id: "slice-big", lane: "default", recipients: many, body: new Uint8Array(8) });
  const small = d.dispatch({ dispatch_id: "slice-small", message_id: "slice-small", lane: "default", recipients: ["slc2999"], body: new Uint8Array(8) });
  let turns = 0;
  const counting = setInterval(() => turns++, 0);
  const [b, s] = await Promise.all([big, small]);
  clearInterval(counting);
  const last = b[2999]!;
  const after = s[0]!;
  assert.ok("seq" in last && "seq" in after && after.seq > last.seq, "the later call's entry comes after the earlier call's for the same user");
  assert.ok(turns > 0, "timers ran while it was validated, scheduled and published");
  d.close();
});

/** The entry id and user stored at each offset of a user's shard stream, read back by direct get. */
async function storedAt(user: string, offsets: number[]): Promise<string[]> {
  const jsm = await jetstreamManager(nc);
  const stream = shardStream(registry.shards.shardOf(user)!);
  const ids: string[] = [];
  for (const seq of offsets) {
    const m = await jsm.direct.getMessage(stream, { seq });
    assert.ok(m !== null, `offset ${seq} of ${stream}`);
    assert.equal(parseEntrySubject(m.subject)?.user, user, `offset ${seq} holds ${user}'s entry`);
    ids.push(decodeStoredEntry(m.data).id);
  }
  return ids;
}

const entry = (id: string, user: string) => ({ dispatch_id: id, message_id: id, lane: "default", recipients: [user], body: new Uint8Array([7]) });

test("dispatch - a hot user's entries queued behind one in flight go out as atomic batches: in order, each result's offset holding that entry; fewer than minBatch go one at a time", async () => {
  const d = new Dispatcher(nc, () => registry.shards, { lanes: ["default"], maxBatch: 50, minBatch: 2, ackTimeoutMs: 15_000 });
  const user = "hot-batch";
  const ids = Array.from({ length: 300 }, (_, i) => `hb${i}`);
  const results = (await Promise.all(ids.map((id) => d.dispatch(entry(id, user))))).map((r) => r[0]!);
  const offsets = results.map((r) => {
    assert.ok("offset" in r && r.duplicate === false, JSON.stringify(r, (_, v: unknown) => (typeof v === "bigint" ? String(v) : v)));
    return r.offset;
  });
  assert.ok(offsets.every((o, i) => i === 0 || o > offsets[i - 1]!), "offsets in call order");
  assert.deepEqual(await storedAt(user, offsets), ids, "each result's offset holds its entry");
  assert.ok(d.stats.batches >= 6, `batches committed (${d.stats.batches}), at most 50 entries each`);
  assert.ok(d.stats.batchedEntries >= 250 && d.stats.batchedEntries <= 299, `entries in batches (${d.stats.batchedEntries}), the first went alone`);
  assert.equal(d.stats.batchFallbacks, 0);
  d.close();
  // the default minBatch (64): 40 queued behind one go one at a time
  const d2 = new Dispatcher(nc, () => registry.shards, { lanes: ["default"] });
  const few = (await Promise.all(Array.from({ length: 41 }, (_, i) => d2.dispatch(entry(`hf${i}`, user))))).map((r) => r[0]!);
  assert.ok(few.every((r) => "offset" in r));
  assert.equal(d2.stats.batches, 0, "no batch under minBatch");
  d2.close();
});

test("dispatch - batches sent again after their entries landed (a retry after a lost answer) are refused whole; each entry then answers duplicate at its offset", async () => {
  const d = new Dispatcher(nc, () => registry.shards, { lanes: ["default"], minBatch: 2, ackTimeoutMs: 15_000 });
  const user = "hot-retry";
  const ids = Array.from({ length: 60 }, (_, i) => `hr${i}`);
  const first = (await Promise.all(ids.map((id) => d.dispatch(entry(id, user))))).map((r) => r[0]!);
  assert.ok(d.stats.batches >= 1);
  const again = (await Promise.all(ids.map((id) => d.dispatch(entry(id, user))))).map((r) => r[0]!);
  assert.ok(d.stats.batchFallbacks >= 1, "the repeated batch was refused (it holds Nats-Msg-Ids already appended)");
  for (const [i, r] of again.entries()) {
    const f = first[i]!;
    assert.ok("offset" in r && "offset" in f && r.duplicate === true && r.offset === f.offset, `entry ${i}: duplicate at the first offset`);
  }
  d.close();
});

test("dispatch - a stream that refuses atomic batches (made before they were allowed): the batch's entries go one at a time, in order, and no more batches go there", async () => {
  const user = "no-atomic";
  const stream = shardStream(registry.shards.shardOf(user)!);
  const jsm = await jetstreamManager(nc);
  await jsm.streams.update(stream, { ...(await jsm.streams.info(stream)).config, allow_atomic: false });
  const d = new Dispatcher(nc, () => registry.shards, { lanes: ["default"], minBatch: 2, ackTimeoutMs: 15_000 });
  try {
    const ids = Array.from({ length: 40 }, (_, i) => `na${i}`);
    const results = (await Promise.all(ids.map((id) => d.dispatch(entry(id, user))))).map((r) => r[0]!);
    const offsets = results.map((r) => (assert.ok("offset" in r && !r.duplicate), r.offset));
    assert.deepEqual(await storedAt(user, offsets), ids, "all appended once, in order");
    assert.equal(d.stats.batches, 0);
    assert.equal(d.stats.batchFallbacks, 1, "one batch refused, then none tried on that stream");
  } finally {
    d.close();
    await jsm.streams.update(stream, { ...(await jsm.streams.info(stream)).config, allow_atomic: true });
  }
});
