/**
 * The hub's decisions (SessionRegistry, gateway/hub/sessions.ts) as tables, in memory: which pushes go
 * to sessions (the stale-epoch rule), which session of a device is replaced, the per-user limits,
 * which sessions a backend's disconnect ends, and kicks.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { bumpEpoch, composeSeq, Disconnect, initialShards, withReason, type Push } from "../../protocol/index.js";
import { pushVerdict, type PushVerdict } from "../../gateway/hub/push-verdict.js";
import { GatewayMetrics } from "../../gateway/metrics.js";
import type { HubMember } from "../../gateway/ports.js";
import { SessionRegistry } from "../../gateway/hub/sessions.js";
import { FakeRegistry, FakeRoutes, MemoryPushSource } from "../harness/session-fakes.js";

/** A hub member that records what the hub does to it. */
function member(user: string, device: string, opts: { id?: string; authAt?: number; issuedAt?: number } = {}) {
  const got: string[] = [];
  const closed: Disconnect[] = [];
  const m: HubMember = {
    id: opts.id ?? `${user}-${device}-${opts.authAt ?? 1}`, who: { user, device, authAt: opts.authAt ?? 1, issuedAt: opts.issuedAt }, shard: 0,
    close: (d) => void closed.push(d),
    onPushes: (p) => void got.push(...p.map((x) => x.entry.id)),
    onShardChange: () => undefined,
    tailPosition: () => undefined,
    fillTail: () => undefined,
    catchUpTo: () => undefined,
  };
  return { m, got, closed };
}

function hubRig(userRate = 1000) {
  const registry = new FakeRegistry(initialShards(2, ["logA", "logB"]));
  const source = new MemoryPushSource();
  const routes = new FakeRoutes();
  const metrics = new GatewayMetrics();
  const hub = new SessionRegistry(source, routes, registry, metrics, userRate, { warn: () => undefined });
  const join = (x: { m: HubMember }) => {
    hub.open(x.m);
    hub.add(x.m);
  };
  return { registry, source, routes, metrics, hub, join };
}

const push = (user: string, o: number, epoch = 0, shard = 0): Push => ({
  user, shard, epoch, prevAll: null,
  entry: { seq: composeSeq(epoch, o), id: `m${o}`, lane: "default", prev: null, ts: Date.now(), b: new Uint8Array() },
});

const count = async (c: { get(): Promise<{ values: { value: number }[] }> }) => (await c.get()).values[0]?.value ?? 0;

/** The 4409 an older session of a device gets: v1's reason text. */
const REPLACED_OLDER = withReason(Disconnect.REPLACED, "replaced by a newer session of this device");

test("hub decisions - the stale-epoch rule: deliver at the view's epoch, drop below it, hold above it or for a shard the view lacks", () => {
  const registry = new FakeRegistry(initialShards(2, ["logA", "logB"]));
  registry.apply([bumpEpoch(registry.state.shards.get(0)!, { cause: "takeover", start_offset: 10 })]); // shard 0 at epoch 1
  const table: [shard: number, epoch: number, want: PushVerdict][] = [
    [0, 1, "deliver"],
    [0, 0, "stale"],
    [0, 2, "hold"],
    [1, 0, "deliver"],
    [1, 1, "hold"],
    [7, 0, "hold"], // a split's child this view has not seen
  ];
  for (const [shard, epoch, want] of table) assert.equal(pushVerdict(registry.state, { shard, epoch }), want, `shard ${shard} epoch ${epoch}`);
});

test("hub decisions - pushes through the hub: delivered, stale (counted), held (counted) per the rule", async () => {
  const table: { name: string; pushes: Push[]; delivered: string[]; stale: number; held: number }[] = [
    { name: "the view's epoch", pushes: [push("ann", 11, 1), push("ann", 12, 1)], delivered: ["m11", "m12"], stale: 0, held: 0 },
    { name: "a zombie's, then the owner's", pushes: [push("ann", 9, 0), push("ann", 11, 1)], delivered: ["m11"], stale: 1, held: 0 },
    { name: "an epoch ahead of the view", pushes: [push("ann", 11, 2)], delivered: [], stale: 0, held: 1 },
    { name: "behind a held one of its shard: held too, in order", pushes: [push("ann", 11, 2), push("ann", 12, 1)], delivered: [], stale: 0, held: 2 },
    { name: "another shard goes on while one is held", pushes: [push("ann", 11, 2), push("ann", 3, 0, 1)], delivered: ["m3"], stale: 0, held: 1 },
  ];
  for (const row of table) {
    const { hub, source, registry, metrics, join } = hubRig();
    registry.apply([bumpEpoch(registry.state.shards.get(0)!, { cause: "takeover", start_offset: 10 })]);
    const a = member("ann", "d1");
    join(a);
    source.deliver(row.pushes);
    assert.deepEqual(a.got, row.delivered, row.name);
    assert.equal(await count(metrics.stalePushes), row.stale, `${row.name}: stale`);
    assert.equal(await count(metrics.heldPushes), row.held, `${row.name}: held`);
    hub.close();
  }
});

test("hub decisions - one session per device here: the later AUTH wins, whichever joins first", () => {
  const table: { name: string; first: { device: string; authAt: number }; second: { device: string; authAt: number }; firstClosed: Disconnect[]; secondClosed: Disconnect[]; count: number }[] = [
    { name: "a newer AUTH of the device replaces the older session", first: { device: "d1", authAt: 1 }, second: { device: "d1", authAt: 2 }, firstClosed: [REPLACED_OLDER], secondClosed: [], count: 1 },
    { name: "an older AUTH that joins late (its claim was slow) is the one closed", first: { device: "d1", authAt: 2 }, second: { device: "d1", authAt: 1 }, firstClosed: [], secondClosed: [Disconnect.REPLACED], count: 1 },
    { name: "the same AUTH time: the one joining wins", first: { device: "d1", authAt: 5 }, second: { device: "d1", authAt: 5 }, firstClosed: [REPLACED_OLDER], secondClosed: [], count: 1 },
    { name: "another device of the user: both stay", first: { device: "d1", authAt: 1 }, second: { device: "d2", authAt: 2 }, firstClosed: [], secondClosed: [], count: 2 },
  ];
  for (const row of table) {
    const { hub, join } = hubRig();
    const a = member("ann", row.first.device, { authAt: row.first.authAt, id: "first" });
    const b = member("ann", row.second.device, { authAt: row.second.authAt, id: "second" });
    join(a);
    join(b);
    // a session closed by the hub leaves it (as Session.close does, through cleanup)
    for (const x of [a, b]) if (x.closed.length > 0) hub.remove(x.m);
    assert.deepEqual(a.closed, row.firstClosed, `${row.name}: first`);
    assert.deepEqual(b.closed, row.secondClosed, `${row.name}: second`);
    assert.equal(hub.countForUser("ann"), row.count, `${row.name}: sessions counted`);
    hub.close();
  }
  assert.equal(Disconnect.REPLACED.reason, "a newer session of this device exists");
});

test("hub decisions - a kick closes that exact session of the device with 4409, nothing else", () => {
  const { hub, join } = hubRig();
  const a = member("ann", "d1", { id: "s1" });
  join(a);
  const table: [user: string, device: string, session: string, closed: number][] = [
    ["ann", "d1", "s-other", 0], // a session this gateway no longer has
    ["ann", "d2", "s1", 0],
    ["bob", "d1", "s1", 0],
    ["ann", "d1", "s1", 1],
  ];
  for (const [user, device, session, closed] of table) {
    hub.kick(user, device, session);
    assert.equal(a.closed.length, closed, `kick ${user}/${device}/${session}`);
  }
  assert.deepEqual(a.closed, [REPLACED_OLDER]);
  hub.close();
});

test("hub decisions - per-user limits: sessions counted per user; one frame budget over all of a user's sessions here", () => {
  const now = 1_000_000;
  const { hub, join } = hubRig(3);
  const a1 = member("ann", "d1");
  const a2 = member("ann", "d2");
  const b = member("bob", "d1");
  for (const x of [a1, a2, b]) join(x);
  assert.deepEqual([hub.countForUser("ann"), hub.countForUser("bob"), hub.countForUser("zed")], [2, 1, 0]);
  const taken = Array.from({ length: 4 }, () => hub.takeUserToken("ann", now));
  assert.deepEqual(taken, [true, true, true, false], "3 frames a second over both of ann's sessions");
  assert.equal(hub.takeUserToken("bob", now), true, "bob has a budget of his own");
  assert.equal(hub.takeUserToken("zed", now), true, "a user with no session here (not authenticated yet) is not limited by the hub");
  assert.equal(hub.takeUserToken("ann", now + 1000), true, "refilled a second later");
  hub.remove(a1.m);
  assert.equal(hub.countForUser("ann"), 1);
  hub.remove(a2.m);
  assert.equal(hub.countForUser("ann"), 0);
  hub.close();
});

test("hub decisions - a backend's disconnect: which sessions end, with the Disconnect given", () => {
  const SIGNED_OUT = withReason(Disconnect.SIGNED_OUT, "signed out");
  const table: { name: string; opts: { device?: string; issuedBefore?: number }; ended: string[] }[] = [
    { name: "every session of the user", opts: {}, ended: ["d1", "d2", "d3"] },
    { name: "one device's", opts: { device: "d2" }, ended: ["d2"] },
    { name: "a revocation: tokens issued before it, and tokens with no iat", opts: { issuedBefore: 200 }, ended: ["d1", "d3"] },
    { name: "a revocation of one device", opts: { issuedBefore: 200, device: "d3" }, ended: ["d3"] },
  ];
  for (const row of table) {
    const { hub, join } = hubRig();
    const sessions = [member("ann", "d1", { issuedAt: 100 }), member("ann", "d2", { issuedAt: 300 }), member("ann", "d3"), member("bob", "d1", { issuedAt: 100 })];
    for (const x of sessions) join(x);
    const n = hub.end("ann", SIGNED_OUT, row.opts);
    assert.equal(n, row.ended.length, row.name);
    assert.deepEqual(sessions.filter((x) => x.closed.length > 0).map((x) => x.m.who?.device), row.ended, row.name);
    for (const x of sessions) if (x.closed.length > 0) assert.deepEqual(x.closed, [SIGNED_OUT], `${row.name}: told as given`);
    hub.close();
  }
});
