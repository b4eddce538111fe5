/**
 * The gateway's tail check (gateway/hub/sessions.ts, on a real NATS connection): each second it reads the
 * heads of that second's live sessions' users and asks a session behind its user's head to read
 * the rest, and a session whose user has no head in Redis (the watermark hash vanished, with it any
 * proof that nothing is missing) to ask the stream. A head at or below the session's position
 * asks nothing.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { type MailboxSeq, type Push } from "../../protocol/index.js";
import { GatewayMetrics } from "../../gateway/metrics.js";
import type { HubMember } from "../../gateway/ports.js";
import { SessionRegistry } from "../../gateway/hub/sessions.js";
import { registryRig } from "../harness/registry-rig.js";
import { waitFor } from "../harness/wait.js";
import { FakeRoutes, MemoryPushSource } from "../harness/session-fakes.js";

const { registry } = await registryRig();

/** A live, idle session at `at` that records what the tail check asks of it. */
function member(user: string, at: MailboxSeq): HubMember & { asked: (MailboxSeq | undefined)[] } {
  const asked: (MailboxSeq | undefined)[] = [];
  return {
    id: `s-${user}`, who: { user, device: "d1", authAt: 1, issuedAt: undefined }, shard: 0, asked,
    close: () => undefined,
    onPushes: (_p: readonly Push[]) => undefined,
    catchUpTo: () => undefined,
    onShardChange: () => undefined,
    tailPosition: () => at,
    fillTail: (head) => void asked.push(head),
  };
}

test("tail check - behind its user's head: asked with the head; no head in Redis: asked with none; up to date: not asked", async () => {
  const routes = new FakeRoutes();
  const hub = new SessionRegistry(new MemoryPushSource(), routes, registry, new GatewayMetrics(), 1000, { warn: () => undefined });
  const behind = member("behind", 5n);
  const unknown = member("unknown", 5n);
  const current = member("current", 5n);
  for (const m of [behind, unknown, current]) {
    hub.open(m);
    hub.add(m);
  }
  const heads = new Map<string, MailboxSeq | undefined>([["behind", 9n], ["unknown", undefined], ["current", 5n]]);
  const asked: string[][] = [];
  try {
    hub.startTailChecks(1, async (users) => {
      asked.push([...users]);
      return users.map((u) => ({ head: heads.get(u), routes: u === "unknown" ? [] : ["gw-here"] }));
    });
    await waitFor("a tail check", () => behind.asked.length > 0 && unknown.asked.length > 0, { timeoutMs: 5000 });
    assert.deepEqual(behind.asked[0], 9n);
    assert.equal(unknown.asked[0], undefined, "no head: the session asks the stream itself");
    assert.deepEqual(current.asked, [], "up to date: nothing to read");
    assert.deepEqual(asked[0]!.sort(), ["behind", "current", "unknown"], "one call for every live session's user");
    // each user's routes go to the route table, which registers again where this gateway is missing
    assert.deepEqual(routes.asked.slice(0, 3).sort(), ["verify behind gw-here", "verify current gw-here", "verify unknown "]);
  } finally {
    hub.close();
  }
});

test("tail check - a session behind the head it read but caught up by the next tick (its pushes were in flight) reads nothing", async () => {
  const hub = new SessionRegistry(new MemoryPushSource(), new FakeRoutes(), registry, new GatewayMetrics(), 1000, { warn: () => undefined });
  let at = 5n;
  const asked: (MailboxSeq | undefined)[] = [];
  const m: HubMember = {
    id: "s-busy", who: { user: "busy", device: "d1", authAt: 1, issuedAt: undefined }, shard: 0,
    close: () => undefined, onPushes: () => undefined, onShardChange: () => undefined, catchUpTo: () => undefined,
    tailPosition: () => at,
    fillTail: (head) => void asked.push(head),
  };
  hub.open(m);
  hub.add(m);
  let reads = 0;
  try {
    hub.startTailChecks(1, async (users) => {
      reads++;
      if (reads === 1) setTimeout(() => (at = 9n), 100); // the pushes up to 9 arrive
      return users.map(() => ({ head: 9n, routes: ["gw-here"] }));
    });
    await waitFor("three checks", () => reads >= 3, { timeoutMs: 6000 });
    assert.deepEqual(asked, [], "caught up before the next tick: no read");
  } finally {
    hub.close();
  }
});
