/**
 * The hub's timed work (SessionRegistry, gateway/hub/sessions.ts) on a manual clock: the tail check
 * each second and the expiry of held pushes run when the test steps the clock, with no wait.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { bumpEpoch, composeSeq, initialShards, type MailboxSeq, type Push } from "../../protocol/index.js";
import { GatewayMetrics } from "../../gateway/metrics.js";
import type { HubMember } from "../../gateway/ports.js";
import { SessionRegistry, type UserHead } from "../../gateway/hub/sessions.js";
import { FakeRegistry, FakeRoutes, MemoryPushSource } from "../harness/session-fakes.js";
import { ManualClock } from "../harness/manual-clock.js";

/** A live, idle session at `at` (settable) that records what the hub asks of it. */
function member(user: string, at: MailboxSeq) {
  const s = { at, filled: [] as (MailboxSeq | undefined)[], got: [] as string[] };
  const m: HubMember = {
    id: `s-${user}`, who: { user, device: "d1", authAt: 1, issuedAt: undefined }, shard: 0,
    close: () => undefined,
    onPushes: (p) => void s.got.push(...p.map((x) => x.entry.id)),
    onShardChange: () => undefined,
    catchUpTo: () => undefined,
    tailPosition: () => s.at,
    fillTail: (head) => void s.filled.push(head),
  };
  return { m, s };
}

function hubRig() {
  const clock = new ManualClock();
  const registry = new FakeRegistry(initialShards(2, ["logA", "logB"]));
  const source = new MemoryPushSource();
  const routes = new FakeRoutes();
  const metrics = new GatewayMetrics();
  const hub = new SessionRegistry(source, routes, registry, metrics, 1000, { warn: () => undefined }, clock);
  const join = (x: { m: HubMember }) => {
    hub.open(x.m);
    hub.add(x.m);
  };
  return { clock, registry, source, routes, metrics, hub, join };
}

/** Lets the heads' promise chains run. */
const settle = () => new Promise((r) => setImmediate(r));

const count = async (c: { get(): Promise<{ values: { value: number }[] }> }) => (await c.get()).values[0]?.value ?? 0;

const push = (user: string, o: number, epoch: number): Push => ({
  user, shard: 0, epoch, prevAll: null,
  entry: { seq: composeSeq(epoch, o), id: `m${o}`, lane: "default", prev: null, ts: 0, b: new Uint8Array() },
});

test("hub clock - the tail check runs each second of the clock: a session still behind the head a tick later is filled", async () => {
  const { clock, hub, routes, join } = hubRig();
  const behind = member("behind", 5n);
  const caughtUp = member("caught-up", 5n);
  join(behind);
  join(caughtUp);
  const calls: string[][] = [];
  hub.startTailChecks(1, async (users) => {
    calls.push([...users].sort());
    return users.map((): UserHead => ({ head: 9n, routes: ["gw-here"] }));
  });
  clock.advance(999);
  await settle();
  assert.deepEqual(calls, [], "no check before the first second");
  clock.advance(1);
  await settle();
  assert.deepEqual(calls, [["behind", "caught-up"]], "one call for both users");
  assert.deepEqual(routes.asked.sort(), ["verify behind gw-here", "verify caught-up gw-here"]);
  assert.deepEqual(behind.s.filled, [], "behind the head it read: filled only if still behind a tick later");
  caughtUp.s.at = 9n; // its pushes were in flight
  clock.advance(1000);
  await settle();
  assert.deepEqual(behind.s.filled, [9n], "still behind a second later: filled up to the head");
  assert.deepEqual(caughtUp.s.filled, [], "caught up by the next tick: nothing read");
  assert.equal(calls.length, 2);
  hub.close();
  clock.advance(10_000);
  await settle();
  assert.equal(calls.length, 2, "closed: no more checks");
  assert.equal(clock.pending, 0);
});

test("hub clock - a session still behind a tick later but moving towards the head is looked at again, not filled: only a tick with nothing delivered fills it", async () => {
  const { clock, hub, join } = hubRig();
  const late = member("late", 5n);
  join(late);
  let reads = 0;
  hub.startTailChecks(30, async (users) => {
    reads++;
    return users.map((): UserHead => ({ head: 20n, routes: ["gw-here"] }));
  });
  clock.advance(30_000); // the user's turn in the 30 s period
  await settle();
  assert.equal(reads, 1, "the user's check: head 20, the session at 5");
  // a backlogged path: the pushes up to the head arrive over seconds, not within the tick
  for (const at of [8n, 12n, 15n]) {
    late.s.at = at;
    clock.advance(1000);
    await settle();
    assert.deepEqual(late.s.filled, [], `at ${at}: delivered to during the tick, so in flight, not lost`);
  }
  // the rest never comes (lost at the tail): a tick with nothing delivered
  clock.advance(1000);
  await settle();
  assert.deepEqual(late.s.filled, [20n], "no progress for a tick while behind: filled up to the head it read");
  assert.equal(reads, 1, "no other head read meanwhile (one check per user per 30 s)");
  clock.advance(1000);
  await settle();
  assert.deepEqual(late.s.filled, [20n], "filled once");
  hub.close();
});

test("hub clock - tail checks are spread over `everyS` seconds, and a slow read is not stacked", async () => {
  const { clock, hub, join } = hubRig();
  for (const u of ["a", "b", "c"]) join(member(u, 5n));
  const calls: string[][] = [];
  let answer: (() => void) | undefined;
  hub.startTailChecks(3, async (users) => {
    calls.push([...users]);
    if (calls.length === 4) await new Promise<void>((r) => (answer = r)); // Redis stalls on the fourth
    return users.map(() => ({ head: 5n, routes: ["gw-here"] }));
  });
  for (let i = 0; i < 3; i++) {
    clock.advance(1000);
    await settle();
  }
  assert.deepEqual(calls.flat().sort(), ["a", "b", "c"], "each user once over three seconds, a third of them each second");
  assert.ok(calls.every((c) => c.length === 1));
  clock.advance(1000);
  await settle();
  assert.equal(calls.length, 4);
  clock.advance(5000);
  await settle();
  assert.equal(calls.length, 4, "no check while the last one waits on Redis");
  answer!();
  await settle();
  clock.advance(1000);
  await settle();
  assert.equal(calls.length, 5, "checks go on once it answered");
  hub.close();
});

test("hub clock - held pushes are dropped at the first tick 10 s after they were held; the tick runs only while something is held", async () => {
  const { clock, registry, source, metrics, hub, join } = hubRig();
  const ann = member("ann", 0n);
  join(ann);
  assert.equal(clock.pending, 0, "nothing held: no timer");
  // held at 500: the hold's ticks come at 1500, 2500, ...
  clock.advance(500);
  source.deliver([push("ann", 11, 1)]);
  assert.equal(clock.pending, 1, "a push held: the hold's tick runs");
  clock.advance(9_999);
  assert.equal(await count(metrics.heldPushesDropped), 0, "at 10 499: held 9.999 s, the last tick at 9 s");
  clock.advance(1);
  assert.equal(await count(metrics.heldPushesDropped), 1, "the tick at 10 500: held 10 s, dropped");
  assert.equal(clock.pending, 0, "nothing held any more: the tick stopped");
  // held again, then the registry catches up within the 10 s: delivered, and the tick stops
  source.deliver([push("ann", 12, 1)]);
  clock.advance(3_000);
  registry.apply([bumpEpoch(registry.state.shards.get(0)!, { cause: "takeover", start_offset: 10 })]);
  assert.deepEqual(ann.s.got, ["m12"]);
  assert.equal(clock.pending, 0);
  clock.advance(20_000);
  assert.equal(await count(metrics.heldPushesDropped), 1);
  hub.close();
});
