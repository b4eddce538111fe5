import { test } from "node:test";
import assert from "node:assert/strict";
import fc from "fast-check";
import { BROADCAST_PUSH_SUBJECT, composeSeq, decodePushBatch, routedPushSubject, type Push } from "../../protocol/index.js";
import { PushRouter } from "../../worker/push-router.js";
import { GatewayBeats } from "../../worker/gateway-beats.js";
import { GATEWAY_LIVENESS } from "../../protocol/index.js";
const SILENT_AFTER_S = GATEWAY_LIVENESS.silentAfterS;

const push = (user: string, o: number): Push => ({
  user, shard: 1, epoch: 2, prevAll: o > 1 ? composeSeq(2, o - 1) : null,
  entry: { seq: composeSeq(2, o), id: `m${o}`, lane: "default", prev: null, ts: 1, b: new Uint8Array(8) },
});

function rig(silent: string[] = []) {
  const published: { subject: string; pushes: Push[] }[] = [];
  const drops: [string, string[]][] = [];
  const notes: string[] = [];
  const router = new PushRouter(
    {
      publish: (subject, data) => published.push({ subject, pushes: decodePushBatch(data).pushes }),
      dropRoutes: (user, gws) => void drops.push([user, gws]),
      note: (what) => void notes.push(what),
    },
    { isSilent: (gw) => silent.includes(gw) },
  );
  return { router, published, drops, notes };
}

test("push router - one message per gateway per flush, each with every push for it, in order", () => {
  const { router, published, notes } = rig();
  router.route(push("ann", 1), ["g1"]);
  router.route(push("bob", 2), ["g1", "g2"]);
  router.route(push("ann", 3), ["g1"]);
  router.route(push("cy", 4), []);
  assert.equal(published.length, 0, "nothing leaves before the flush");
  router.flush();
  assert.deepEqual(published.map((p) => [p.subject, p.pushes.map((x) => x.entry.id)]), [
    [routedPushSubject("g1"), ["m1", "m2", "m3"]],
    [routedPushSubject("g2"), ["m2"]],
  ]);
  assert.deepEqual(notes, ["unrouted"], "a user with no session anywhere costs no message");
  router.flush();
  assert.equal(published.length, 2, "an empty flush publishes nothing");
});

test("push router - routes Redis did not have: the push goes to every gateway, batched like the others", () => {
  const { router, published, notes } = rig();
  router.route(push("ann", 1), undefined);
  router.route(push("bob", 2), undefined);
  router.route(push("cy", 3), ["g1"]);
  router.flush();
  assert.deepEqual(published.map((p) => [p.subject, p.pushes.map((x) => x.entry.id)]), [
    [BROADCAST_PUSH_SUBJECT, ["m1", "m2"]],
    [routedPushSubject("g1"), ["m3"]],
  ]);
  assert.deepEqual(notes, ["broadcast", "broadcast"]);
});

test("push router - a gateway's message stays under its byte bound; order is kept across the split", () => {
  const { router, published } = rig();
  const big = (o: number): Push => ({ ...push("ann", o), entry: { ...push("ann", o).entry, b: new Uint8Array(200_000) } });
  for (let o = 1; o <= 7; o++) router.route(big(o), ["g1"]);
  router.flush();
  assert.ok(published.length >= 3, `${published.length} messages`);
  assert.deepEqual(published.flatMap((p) => p.pushes.map((x) => x.entry.id)), ["m1", "m2", "m3", "m4", "m5", "m6", "m7"]);
});

test("push router - a silent gateway gets nothing and is dropped from the user's routes once", () => {
  const { router, published, drops, notes } = rig(["dead"]);
  router.route(push("ann", 1), ["dead", "g1"]);
  router.route(push("ann", 2), ["dead", "g1"]);
  router.flush();
  assert.deepEqual(published.map((p) => p.subject), [routedPushSubject("g1")]);
  assert.deepEqual(drops, [["ann", ["dead"]]], "dropped once, not at every entry");
  assert.deepEqual(notes, ["silent", "silent"]);
  router.forgetDrops();
  router.route(push("ann", 3), ["dead"]);
  assert.deepEqual(drops.length, 2, "after the view changed it is dropped again");
});

test("push router - property: every push reaches exactly its live routes, in per-gateway order", () => {
  fc.assert(
    fc.property(
      fc.array(fc.tuple(fc.constantFrom("a", "b", "c", "d"), fc.subarray(["g1", "g2", "g3", "dead"])), { maxLength: 60 }),
      fc.array(fc.nat(60), { maxLength: 5 }),
      (routed, flushes) => {
        const { router, published } = rig(["dead"]);
        const want = new Map<string, string[]>();
        routed.forEach(([user, gws], i) => {
          router.route(push(user, i + 1), gws);
          for (const g of gws) if (g !== "dead") want.set(routedPushSubject(g), [...(want.get(routedPushSubject(g)) ?? []), `m${i + 1}`]);
          if (flushes.includes(i)) router.flush();
        });
        router.flush();
        const got = new Map<string, string[]>();
        for (const p of published) got.set(p.subject, [...(got.get(p.subject) ?? []), ...p.pushes.map((x) => x.entry.id)]);
        assert.deepEqual(got, want);
      },
    ),
  );
});

test("gateway beats - silent after SILENT_AFTER_S by Redis's clock; missing is not silent; a stale view calls nobody silent", async () => {
  let now = 0;
  let reply: string[] = [];
  let fail = false;
  let changes = 0;
  const beats = new GatewayBeats(async () => {
    if (fail) throw new Error("redis away");
    return reply;
  }, () => changes++, () => now);
  reply = ["1000", "old", String(1000 - SILENT_AFTER_S - 1), "fresh", "999"];
  await beats.refresh();
  assert.equal(beats.isSilent("old"), true);
  assert.equal(beats.isSilent("fresh"), false);
  assert.equal(beats.isSilent("unknown"), false, "not in the set (evicted, flushed): still sent to");
  assert.equal(changes, 1);
  await beats.refresh();
  assert.equal(changes, 1, "the same view is no change");
  fail = true;
  now = 10_000;
  await beats.refresh();
  assert.equal(beats.isSilent("old"), true, "a failed read keeps the last view for a while");
  now = 31_000;
  assert.equal(beats.isSilent("old"), false, "a view 30 s old is not trusted: everyone gets their pushes");
});
