/** The gateway's push hub (SessionRegistry) in memory: batches in, per-user fan-out, routes told of strays. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { bumpEpoch, composeSeq, initialShards, type MailboxSeq, type Push } from "../../protocol/index.js";
import { GatewayMetrics } from "../../gateway/metrics.js";
import type { HubMember } from "../../gateway/ports.js";
import { SessionRegistry } from "../../gateway/hub/sessions.js";
import { FakeRegistry, FakeRoutes, MemoryPushSource } from "../harness/session-fakes.js";
import { ManualClock } from "../harness/manual-clock.js";

function member(user: string, device: string) {
  const got: Push[][] = [];
  const caught: (MailboxSeq | undefined)[] = [];
  const m: HubMember = {
    id: `${user}-${device}`, who: { user, device, authAt: 1, issuedAt: undefined }, shard: 0,
    close: () => undefined,
    onPushes: (p) => void got.push(p as Push[]),
    onShardChange: () => undefined,
    tailPosition: () => undefined,
    fillTail: () => undefined,
    catchUpTo: (h) => void caught.push(h),
  };
  return { m, got, caught };
}

const push = (user: string, o: number, epoch = 0): Push => ({
  user, shard: 0, epoch, prevAll: null,
  entry: { seq: composeSeq(epoch, o), id: `m${o}`, lane: "default", prev: null, ts: Date.now(), b: new Uint8Array() },
});

function hubRig(clock?: ManualClock) {
  const registry = new FakeRegistry(initialShards(2, ["logA", "logB"]));
  const source = new MemoryPushSource();
  const routes = new FakeRoutes();
  const metrics = new GatewayMetrics();
  const hub = new SessionRegistry(source, routes, registry, metrics, 1000, { warn: () => undefined }, clock);
  return { registry, source, routes, metrics, hub };
}

const count = async (c: { get(): Promise<{ values: { value: number }[] }> }) => (await c.get()).values[0]?.value ?? 0;

test("session hub - a batch reaches each session of a user once, with all of that user's pushes together and in order", async () => {
  const { source, hub, metrics, routes } = hubRig();
  const a1 = member("ann", "d1");
  const a2 = member("ann", "d2");
  const b = member("bob", "d1");
  for (const x of [a1, a2, b]) {
    hub.open(x.m);
    hub.add(x.m);
  }
  source.deliver([push("ann", 1), push("bob", 2), push("ann", 3), push("zed", 4)]);
  assert.deepEqual(a1.got.map((g) => g.map((p) => p.entry.id)), [["m1", "m3"]]);
  assert.deepEqual(a2.got.map((g) => g.map((p) => p.entry.id)), [["m1", "m3"]]);
  assert.deepEqual(b.got.map((g) => g.map((p) => p.entry.id)), [["m2"]]);
  assert.equal(a1.got[0], a2.got[0], "the same array for both: its frame is encoded once");
  assert.deepEqual(routes.asked, ["stray zed"], "a push for a user with no session here: this gateway leaves its routes");
  assert.equal(await count(metrics.pushesReceived), 3);
  assert.equal(await count(metrics.strayPushes), 1);
});

test("session hub - pushes every gateway got (Redis had no routes for their users): delivered, and their users here registered again; others ignored", () => {
  const { source, hub, routes } = hubRig();
  const a = member("ann", "d1");
  hub.open(a.m);
  hub.add(a.m);
  source.deliver([push("ann", 1), push("zed", 2)], true);
  assert.deepEqual(a.got.map((g) => g.map((p) => p.entry.id)), [["m1"]]);
  assert.deepEqual(routes.asked, ["reassert ann"], "no stray for a broadcast: zed's sessions are elsewhere, or nowhere");
});

test("session hub - a push of an epoch older than the registry's is dropped (a zombie worker's)", async () => {
  const { source, hub, metrics, registry } = hubRig();
  const a = member("ann", "d1");
  hub.open(a.m);
  hub.add(a.m);
  registry.apply([bumpEpoch(registry.state.shards.get(0)!, { cause: "takeover", start_offset: 10 })]);
  source.deliver([push("ann", 1, 0), push("ann", 12, 1)]);
  assert.deepEqual(a.got.map((g) => g.map((p) => p.entry.id)), [["m12"]]);
  assert.equal(await count(metrics.stalePushes), 1);
});

test("session hub - a route registered again reaches every session of the user with the head", () => {
  const { hub } = hubRig();
  const a1 = member("ann", "d1");
  const a2 = member("ann", "d2");
  for (const x of [a1, a2]) {
    hub.open(x.m);
    hub.add(x.m);
  }
  hub.repair("ann", composeSeq(0, 9));
  hub.repair("nobody", 5n);
  assert.deepEqual([a1.caught, a2.caught], [[composeSeq(0, 9)], [composeSeq(0, 9)]]);
});

test("session hub - a session that leaves during a fan-out (closed as a slow consumer) does not cost the user's other sessions the batch", () => {
  const { hub, source } = hubRig();
  const a = member("u1", "d1");
  const b = member("u1", "d2");
  const c = member("u1", "d3");
  // the first one closes when it gets the batch, and leaves the hub at once
  a.m.onPushes = (p) => {
    a.got.push(p as Push[]);
    hub.remove(a.m);
  };
  for (const x of [a, b, c]) {
    hub.open(x.m);
    hub.add(x.m);
  }
  source.deliver([push("u1", 1)]);
  assert.deepEqual([a.got.length, b.got.length, c.got.length], [1, 1, 1]);
  assert.equal(hub.countForUser("u1"), 2);
  source.deliver([push("u1", 2)]);
  assert.deepEqual([a.got.length, b.got.length, c.got.length], [1, 2, 2]);
  hub.close();
});

test("session hub - pushes of an epoch or a shard the registry view has not seen are held, in order, until it has: then sent after the sessions saw the change", async () => {
  const { hub, source, registry, metrics } = hubRig();
  const a = member("ann", "d1");
  const order: string[] = [];
  a.m.onShardChange = () => void order.push("shard change");
  a.m.onPushes = (p) => {
    a.got.push(p as Push[]);
    order.push(`pushes ${p.map((x) => x.entry.id).join(",")}`);
  };
  hub.open(a.m);
  hub.add(a.m);
  hub.watch(a.m);
  // a rebuild's new epoch, pushed before this gateway's registry follower saw the record
  source.deliver([push("ann", 1, 1)]);
  source.deliver([push("ann", 2, 1), push("bob", 3, 1)]);
  assert.equal(a.got.length, 0, "held");
  assert.equal(await count(metrics.heldPushes), 3);
  registry.apply([bumpEpoch(registry.state.shards.get(0)!, { cause: "rebuild", log: "logR", start_offset: 1 })], "rebuild");
  assert.deepEqual(order, ["shard change", "pushes m1", "pushes m2"], "the session saw the new epoch first, then the held pushes in order");
  // nothing held any more: the next push goes straight through
  source.deliver([push("ann", 4, 1)]);
  assert.deepEqual(a.got.map((g) => g.map((p) => p.entry.id)), [["m1"], ["m2"], ["m4"]]);
  // a shard the view does not know at all (a split's child it has not seen): held as well
  source.deliver([{ ...push("ann", 1, 1), shard: 7 }]);
  assert.equal(a.got.length, 3);
  assert.equal(await count(metrics.heldPushes), 4);
  hub.close();
});

test("session hub - held pushes of a registry view that does not catch up are dropped after 10 s and counted; later pushes of the shard go on", async () => {
  const clock = new ManualClock();
  const { hub, source, metrics } = hubRig(clock);
  const a = member("ann", "d1");
  hub.open(a.m);
  hub.add(a.m);
  source.deliver([push("ann", 1, 3)]);
  clock.advance(9_000);
  assert.equal(await count(metrics.heldPushesDropped), 0);
  clock.advance(2_000);
  assert.equal(await count(metrics.heldPushesDropped), 1);
  source.deliver([push("ann", 2, 0)]);
  assert.deepEqual(a.got.map((g) => g.map((p) => p.entry.id)), [["m2"]]);
  hub.close();
});
