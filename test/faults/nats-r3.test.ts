/**
 * A 3-node NATS cluster with R3 streams losing the stream leader (SIGKILL, 3 s down, restarted)
 * under load. Duplicates come only with an epoch change: when the leader dies the worker's consumer
 * can end ("consuming failed") or its lease lapse while JetStream elects a new leader; the shard is
 * then taken again with an epoch bump (E1), which replays from the consumer's ack floor what was
 * pushed but not yet acknowledged. Acks follow each batch's pushes, so a bump replays at most about
 * one second of the load (250 entries a second here) to each of a user's 2 devices.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { shardStream } from "../../protocol/index.js";
import { runScenario } from "../harness/faults.js";
import { natsCluster } from "../harness/clusters.js";
import { RedisServer } from "../harness/servers.js";
import { sleep } from "../harness/wait.js";

test("fault - 3-node NATS cluster, R3 streams: the stream leader is SIGKILLed", async () => {
  const nodes = await natsCluster();
  const redis = await RedisServer.start();
  const url = nodes.map((n) => n.url).join(",");
  try {
    const r = await runScenario({
      name: "NATS R3 leader SIGKILL",
      env: { JETGATE_NATS_URL: url, JETGATE_REDIS_URL: redis.url, JETGATE_LOG_LEVEL: "info", JETGATE_STREAM_REPLICAS: "3" },
      duplicates: "allowed",
      fault: async () => {
        const nc = await connect({ servers: url.split(",") });
        const jsm = await jetstreamManager(nc);
        const info = await jsm.streams.info(shardStream(0));
        assert.equal(info.config.num_replicas, 3);
        const leader = info.cluster?.leader;
        assert.ok(leader !== undefined, "the stream has a leader");
        await nc.close();
        const victim = nodes[Number(leader.slice(1))]!;
        await victim.kill();
        await sleep(3000);
        await victim.start(30_000);
      },
      probeUser: (run) => run.users.find((u) => run.registry.shards.shardOf(u) === 0)!,
    });
    assert.ok(r.duplicates <= r.epochChanges * 2 * 250, `${r.duplicates} duplicates with ${r.epochChanges} epoch changes: more than a second of load per change`);
  } finally {
    await Promise.all([...nodes.map((n) => n.dispose()), redis.dispose()]);
  }
});

