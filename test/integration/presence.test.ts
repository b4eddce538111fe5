import { test, after } from "node:test";
import assert from "node:assert/strict";
import { connect } from "@nats-io/transport-node";
import { RedisKeys } from "../../protocol/index.js";
import { Presence, type Kick } from "../../gateway/presence.js";
import { NatsServer, RedisServer } from "../harness/servers.js";
import { redisClient } from "../harness/stack.js";
import { sleep, waitFor } from "../harness/wait.js";

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
  await sleep(200);
  assert.deepEqual(kicks, [], "nobody was kicked");
  assert.equal(await r1.get(keys.presence("u2", "d")), "gwB/new/5000", "the newer session keeps the key");
  // the old session's release does not remove the newer one's key
  await gwA.release("u2", "d", "old", 4000);
  assert.equal(await r1.get(keys.presence("u2", "d")), "gwB/new/5000");
  await gwB.release("u2", "d", "new", 5000);
  assert.equal(await r1.get(keys.presence("u2", "d")), null);
});

test("presence - Redis away: claims succeed (soft state) and kick nobody", async () => {
  kicks.length = 0;
  await redis.kill();
  try {
    assert.equal(await gwA.claim("u3", "d", "s", 1), "claimed");
    assert.deepEqual(kicks, []);
  } finally {
    await redis.start();
  }
});
