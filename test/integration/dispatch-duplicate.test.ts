/**
 * What `duplicate` means against nats-server (issue 39, item 6): an entry whose answer was lost
 * is sent again and JetStream answers duplicate; the Dispatcher reads the stored entry from the
 * stream's leader and reports `duplicate: true` only when a caller's earlier request appended it,
 * never for its own earlier attempt (an entry, or an atomic batch). The link loses answers on
 * purpose (a reply lost with a connection); everything else is the real NatsDispatchLink.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { entryMsgId, type DispatchRequest, type DispatchResult } from "../../protocol/index.js";
import type { AckAnswer } from "../../protocol/dispatch-ack.js";
import { LinkDispatcher } from "../../protocol/io/index.js";
import { NatsDispatchLink, type BatchPlace, type DispatchLink } from "../../protocol/io/dispatch-link.js";
import { registryRig } from "../harness/registry-rig.js";
import { sleep } from "../harness/wait.js";

const { nc, registry } = await registryRig();

/** The NATS link, but the first answer to a publish of each Nats-Msg-Id in `lose` never arrives. */
class LosingLink implements DispatchLink {
  readonly inner = new NatsDispatchLink(nc);
  readonly name = this.inner.name;
  readonly lose = new Set<string>();
  private readonly lost = new Set<string>();
  listen(onAnswer: (token: string, answer: AckAnswer) => void): void {
    this.inner.listen((token, answer) => (this.lost.delete(token) ? undefined : onAnswer(token, answer)));
  }
  publish(subject: string, data: Uint8Array, msgId: string, token: string): void {
    if (this.lose.delete(msgId)) this.lost.add(token);
    this.inner.publish(subject, data, msgId, token);
  }
  publishInBatch(subject: string, data: Uint8Array, msgId: string, batch: BatchPlace): void {
    if (batch.commit !== undefined && this.lose.delete(msgId)) this.lost.add(batch.commit);
    this.inner.publishInBatch(subject, data, msgId, batch);
  }
  flush = () => this.inner.flush();
  stored = (shard: number, offset: number, timeoutMs: number) => this.inner.stored(shard, offset, timeoutMs);
  unavailable = () => this.inner.unavailable();
  close = () => this.inner.close();
}

function rig() {
  const link = new LosingLink();
  const d = new LinkDispatcher(link, () => registry.shards, { lanes: ["default"], ackTimeoutMs: 300, minBatch: 3 });
  return { link, d };
}
const req = (id: string, user: string): DispatchRequest => ({ dispatch_id: id, message_id: id, lane: "default", recipients: [user], body: new TextEncoder().encode(id) });
const ok = (r: DispatchResult | undefined) => {
  assert.ok(r !== undefined && "seq" in r, JSON.stringify(r, (_, v: unknown) => (typeof v === "bigint" ? String(v) : v)));
  return r;
};

test("dispatch duplicate - an answer lost: the retry answers duplicate, the stored entry is this call's own: duplicate false", async () => {
  const { link, d } = rig();
  link.lose.add(entryMsgId("own1", "dana"));
  const [r] = await d.dispatch(req("own1", "dana"));
  assert.equal(ok(r).duplicate, false);
  assert.equal(d.stats.retries, 1, "sent again once nats-server had read the first");
  d.close();
});

test("dispatch duplicate - an atomic batch's answer lost: its entries one at a time answer duplicate, all its own: duplicate false", async () => {
  const { link, d } = rig();
  const ids = ["ob0", "ob1", "ob2", "ob3"];
  // ob0 goes alone; ob1-ob3 queue behind it and go as one batch, whose commit (ob3) is answered to no one
  link.lose.add(entryMsgId("ob3", "dora"));
  const results = (await Promise.all(ids.map((id) => d.dispatch(req(id, "dora"))))).map((r) => ok(r[0]));
  assert.deepEqual(results.map((r) => r.duplicate), [false, false, false, false]);
  assert.equal(d.stats.batchFallbacks, 1);
  assert.deepEqual(results.map((r) => r.offset), [1, 2, 3, 4].map((i) => results[0]!.offset + i - 1), "the batch landed whole, in order");
  d.close();
});

test("dispatch duplicate - a caller's earlier request appended it: duplicate true, also when this call's first answer was lost", async () => {
  const { link, d } = rig();
  const first = ok((await d.dispatch(req("again1", "dima")))[0]);
  assert.equal(first.duplicate, false);
  await sleep(5); // another millisecond: another call's bytes (the entry carries the call's time)
  const plain = ok((await d.dispatch(req("again1", "dima")))[0]);
  assert.deepEqual([plain.duplicate, plain.offset], [true, first.offset]);
  link.lose.add(entryMsgId("again1", "dima"));
  const lost = ok((await d.dispatch(req("again1", "dima")))[0]);
  assert.deepEqual([lost.duplicate, lost.offset], [true, first.offset], "the stored bytes are the first call's");
  d.close();
});

test("dispatch duplicate - the link reads a stored entry's bytes from the stream's leader; none at an offset past the end; flush answers", async () => {
  const { link, d } = rig();
  const r = ok((await d.dispatch(req("read1", "ella")))[0]);
  const bytes = await link.inner.stored(r.shard, r.offset, 2000);
  assert.ok(bytes !== undefined);
  assert.ok(new TextDecoder().decode(bytes).includes("read1"), "the stored entry");
  assert.equal(await link.inner.stored(r.shard, r.offset + 1000, 2000), undefined);
  await link.inner.flush();
  d.close();
});
