import { test, after } from "node:test";
import assert from "node:assert/strict";
import { connect } from "@nats-io/transport-node";
import { jetstream, jetstreamManager, StorageType } from "@nats-io/jetstream";
import { headers } from "@nats-io/transport-node";
import { Redis } from "ioredis";
import { NatsServer, RedisServer } from "../harness/servers.js";
import { waitFor } from "../harness/wait.js";

const nats = await NatsServer.start();
const redis = await RedisServer.start();
after(async () => {
  await nats.dispose();
  await redis.dispose();
});

test("harness - JetStream publish with Nats-Msg-Id, read back by direct get, dedup inside the window", async () => {
  const nc = await connect({ servers: nats.url });
  try {
    const jsm = await jetstreamManager(nc);
    await jsm.streams.add({ name: "H", subjects: ["h.>"], storage: StorageType.File, allow_direct: true });
    const js = jetstream(nc);
    const a = await js.publish("h.alice.chat", new TextEncoder().encode("hello"), { msgID: "d1:alice" });
    const b = await js.publish("h.alice.chat", new TextEncoder().encode("hello"), { msgID: "d1:alice" });
    assert.equal(a.duplicate, false);
    assert.equal(b.duplicate, true);
    assert.equal(b.seq, a.seq);
    const m = await jsm.direct.getMessage("H", { seq: a.seq });
    assert.ok(m);
    assert.equal(m.subject, "h.alice.chat");
    assert.equal(m.header.get("Nats-Msg-Id"), "d1:alice");
    assert.equal(new TextDecoder().decode(m.data), "hello");
    const last = await jsm.direct.getMessage("H", { last_by_subj: "h.alice.chat" });
    assert.equal(last?.seq, a.seq);
    const h = headers();
    h.set("Nats-Msg-Id", "d2:alice");
    const c = await js.publish("h.alice.chat", new Uint8Array(0), { headers: h });
    assert.equal(c.seq, a.seq + 1);
  } finally {
    await nc.close();
  }
});

test("harness - Redis round trip", async () => {
  const r = new Redis(redis.url, { lazyConnect: true, maxRetriesPerRequest: 1 });
  await r.connect();
  try {
    await r.set("k", "v");
    assert.equal(await r.get("k"), "v");
  } finally {
    r.disconnect();
  }
});

test("harness - SIGKILL and restart keep the port and the JetStream store; Redis restarts empty", async () => {
  // servers of its own: the restarts wipe nothing the other tests use
  const ownNats = await NatsServer.start();
  const ownRedis = await RedisServer.start();
  try {
    const nc = await connect({ servers: ownNats.url });
    try {
      const jsm = await jetstreamManager(nc);
      await jsm.streams.add({ name: "R", subjects: ["r.>"], storage: StorageType.File });
      const js = jetstream(nc);
      await js.publish("r.one", new TextEncoder().encode("1"));
      await js.publish("r.two", new TextEncoder().encode("2"));
      assert.equal((await jsm.streams.info("R")).state.messages, 2);
    } finally {
      await nc.close();
    }
    const port = ownNats.port;
    const pid = ownNats.pid;
    await ownNats.kill();
    assert.equal(ownNats.running, false);
    await ownNats.start();
    assert.notEqual(ownNats.pid, pid);
    assert.equal(ownNats.port, port);
    const again = await connect({ servers: ownNats.url });
    try {
      const jsm = await jetstreamManager(again);
      const info = await waitFor("stream R with both messages after the restart", async () => {
        const n = (await jsm.streams.info("R")).state.messages;
        if (n !== 2) throw new Error(`${n} messages`);
        return true;
      });
      assert.equal(info, true);
    } finally {
      await again.close();
    }

    const r = new Redis(ownRedis.url, { lazyConnect: true, maxRetriesPerRequest: 1 });
    await r.connect();
    await r.set("k", "v");
    assert.equal(await r.get("k"), "v", "written before the restart");
    r.disconnect();
    await ownRedis.restart();
    const r2 = new Redis(ownRedis.url, { lazyConnect: true, maxRetriesPerRequest: 1 });
    await r2.connect();
    try {
      assert.equal(await r2.get("k"), null, "redis runs without persistence, as a cache");
    } finally {
      r2.disconnect();
    }
  } finally {
    await Promise.all([ownNats.dispose(), ownRedis.dispose()]);
  }
});
