import { test, after } from "node:test";
import assert from "node:assert/strict";
import { connect } from "@nats-io/transport-node";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { Dispatcher, DispatchValidationError, RegistryClient, decodeStoredEntry, parseEntrySubject, MAX_RECIPIENTS } from "../../protocol/index.js";
import { startInfra, initStack } from "../harness/stack.js";
import { sleep } from "../harness/wait.js";

const infra = await startInfra();
await initStack(infra.env);
const nc = await connect({ servers: infra.nats.url, maxReconnectAttempts: -1, reconnectTimeWait: 100 });
const registry = await RegistryClient.open(nc);
after(async () => {
  await registry.close();
  await nc.close();
  await infra.dispose();
});

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
  for (const r of first) assert.ok("seq" in r && r.duplicate === false && r.shard === registry.shards.shardOf(r.user));
  const again = await d.dispatch(ok);
  for (const [i, r] of again.entries()) {
    assert.ok("seq" in r && r.duplicate === true);
    assert.equal(r.seq, (first[i] as { seq: number }).seq);
  }
  d.close();
});

test("dispatch - each user's entries stay in dispatch order while publishes time out and are retried", async () => {
  const d = new Dispatcher(nc, () => registry.shards, { lanes: ["default"], ackTimeoutMs: 150, attempts: 30 });
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
  assert.ok(d.stats.retries > 0, `publishes were retried (${d.stats.retries})`);
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
