import { test, after } from "node:test";
import assert from "node:assert/strict";
import { connect } from "@nats-io/transport-node";
import { RedisKeys } from "../../protocol/index.js";
import { Presence, type Kick } from "../../gateway/hub/presence.js";
import { NatsServer, RedisServer } from "../harness/servers.js";
import { redisClient } from "../harness/stack.js";
import { waitFor } from "../harness/wait.js";

const nats = await NatsServer.start();
const redis = await RedisServer.start();
const nc = await connect({ servers: nats.url });
const r1 = await redisClient(redis.url);
const r2 = await redisClient(redis.url);
after(async () => {
  r1.disconnect();
  r2.disconnect();
  await nc.close();
  await nats.dispose();
  await redis.dispose();
});

const keys = new RedisKeys("jg");
const kicks: { gw: string; kick: Kick }[] = [];
const gwA = new Presence(r1, keys, nc, "gwA", (k) => kicks.push({ gw: "gwA", kick: k }));
const gwB = new Presence(r2, keys, nc, "gwB", (k) => kicks.push({ gw: "gwB", kick: k }));
gwA.start();
gwB.start();
await nc.flush();

/**
 * A marker kick from `from` to `to` over NATS (B claims a device, then A takes it over): a kick
 * `from` published before on the same connection has reached `to` by the time this one has.
 */
async function markerKick(from: Presence, to: Presence, list: { gw: string; kick: Kick }[], user: string): Promise<void> {
  assert.equal(await to.claim(user, "d", "marker-old", 1), "claimed");
  assert.equal(await from.claim(user, "d", "marker-new", 2), "claimed");
  await waitFor(`the marker kick of ${user} at ${to.gatewayId}`, () => list.some((k) => k.kick.user === user));
}

test("presence - the later AUTH kicks the earlier session, on this gateway or another", async () => {
  assert.equal(await gwA.claim("u1", "d", "s1", 1000), "claimed");
  assert.equal(await gwB.claim("u1", "d", "s2", 2000), "claimed");
  await waitFor("the kick reached gateway A", () => kicks.some((k) => k.gw === "gwA" && k.kick.session === "s1"));
  assert.equal(await r1.get(keys.presence("u1", "d")), "gwB/s2/2000");
});

test("presence - a claim that reaches Redis late (behind an outage) does not kick the newer session", async () => {
  kicks.length = 0;
  assert.equal(await gwB.claim("u2", "d", "new", 5000), "claimed");
  assert.equal(await gwA.claim("u2", "d", "old", 4000), "superseded", "the older AUTH is the one replaced");
  await markerKick(gwA, gwB, kicks, "u2-marker");
  assert.deepEqual(kicks, [{ gw: "gwB", kick: { user: "u2-marker", device: "d", session: "marker-old" } }], "nobody but the marker was kicked");
  assert.equal(await r1.get(keys.presence("u2", "d")), "gwB/new/5000", "the newer session keeps the key");
  // the old session's release does not remove the newer one's key
  await gwA.release("u2", "d", "old", 4000);
  assert.equal(await r1.get(keys.presence("u2", "d")), "gwB/new/5000");
  await gwB.release("u2", "d", "new", 5000);
  assert.equal(await r1.get(keys.presence("u2", "d")), null);
});

test("presence - Redis away: claims succeed (soft state) and kick nobody", async () => {
  // a Redis of its own: the outage takes nothing from the other tests' server
  const own = await RedisServer.start();
  const rC = await redisClient(own.url);
  const rD = await redisClient(own.url);
  for (const r of [rC, rD]) r.on("error", () => undefined); // refused connections during the outage
  const ownKicks: { gw: string; kick: Kick }[] = [];
  const gwC = new Presence(rC, keys, nc, "gwC", (k) => ownKicks.push({ gw: "gwC", kick: k }));
  const gwD = new Presence(rD, keys, nc, "gwD", (k) => ownKicks.push({ gw: "gwD", kick: k }));
  gwC.start();
  gwD.start();
  await nc.flush();
  try {
    // gwD holds the device before the outage
    assert.equal(await gwD.claim("u3", "d", "before", 1), "claimed");
    await own.kill();
    try {
      assert.equal(await gwC.claim("u3", "d", "s", 2), "claimed");
    } finally {
      await own.start();
    }
    await waitFor("both clients back on the restarted Redis", async () => (await rC.ping()) === "PONG" && (await rD.ping()) === "PONG");
    await markerKick(gwC, gwD, ownKicks, "u3-marker");
    assert.deepEqual(ownKicks, [{ gw: "gwD", kick: { user: "u3-marker", device: "d", session: "marker-old" } }], "nobody but the marker was kicked");
  } finally {
    gwC.stop();
    gwD.stop();
    rC.disconnect();
    rD.disconnect();
    await own.dispose();
  }
});
