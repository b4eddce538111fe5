/**
 * E4: a second NATS deployment keeps copies (sourced streams over a leafnode with JetStream
 * domains); the primary is lost; `jetgate failover --to` makes the copies primary and workers,
 * gateways and producers move there. In the second scenario the registry copy lagged: devices
 * hold cursors of epochs that copy never saw.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { REGISTRY_STREAM, shardStream } from "../../protocol/index.js";
import { RegistryClient } from "../../protocol/io/index.js";
import { runScenario, type FaultRun } from "../harness/faults.js";
import { NatsServer, RedisServer, freePort } from "../harness/servers.js";
import { runCli } from "../harness/cli.js";
import { sleep, waitFor } from "../harness/wait.js";

async function deployments() {
  const leaf = await freePort();
  const primary = await NatsServer.start({ config: `jetstream { domain: pri }\nleafnodes { listen: "127.0.0.1:${leaf}" }\n` });
  const second = await NatsServer.start({ config: `jetstream { domain: bak }\nleafnodes { remotes: [ { url: "nats-leaf://127.0.0.1:${leaf}" } ] }\n` });
  const redis = await RedisServer.start();
  const env = { JETGATE_NATS_URL: primary.url, JETGATE_REDIS_URL: redis.url, JETGATE_LOG_LEVEL: "warn", JETGATE_SHARDS: "2" };
  return {
    primary, second, redis, env,
    async dispose() {
      await Promise.all([primary.dispose(), second.dispose(), redis.dispose()]);
    },
  };
}

/** Messages in each stream, on one deployment. */
async function counts(url: string, names: string[]): Promise<number[]> {
  const nc = await connect({ servers: url });
  try {
    const jsm = await jetstreamManager(nc);
    return await Promise.all(names.map(async (n) => (await jsm.streams.info(n)).state.messages));
  } finally {
    await nc.close();
  }
}

async function failOver(run: FaultRun, d: Awaited<ReturnType<typeof deployments>>, opts: { registryLagged: boolean }): Promise<void> {
  const streams = [shardStream(0), shardStream(1), ...(opts.registryLagged ? [] : [REGISTRY_STREAM])];
  // a planned failover: appends stop, the copies catch up, then the primary is lost
  run.pauseLoad();
  await sleep(500);
  const want = await counts(d.primary.url, streams);
  await waitFor("the copies caught up", async () => (await counts(d.second.url, streams)).every((n, i) => n === want[i]), { timeoutMs: 30_000 });
  await d.primary.kill();
  const out = await runCli(run.env, ["failover", "--to", d.second.url]);
  assert.equal(out.code, 0, out.text);
  assert.match(out.text, /failover done/);
  // running it again changes nothing
  const again = await runCli(run.env, ["failover", "--to", d.second.url]);
  assert.equal(again.code, 0, again.text);
  assert.doesNotMatch(again.text, /epoch ->/);
  await run.moveTo({ ...run.env, JETGATE_NATS_URL: d.second.url });
  await waitFor("the new workers own every shard", async () => {
    let held = 0;
    for (const w of run.live(run.workers)) held += await w.metric("jetgate_worker_lease_held");
    return held === run.shardCount;
  }, { timeoutMs: 30_000 });
  run.resumeLoad();
}

test("fault E4 - failover to a second deployment's copies", async () => {
  const d = await deployments();
  try {
    await runScenario({
      name: "E4 failover",
      env: d.env,
      duplicates: "allowed",
      prepare: async (run) => {
        const out = await runCli(run.env, ["replica", "setup", "--to", d.second.url, "--source-api", "$JS.pri.API"]);
        assert.equal(out.code, 0, out.text);
      },
      fault: (run) => failOver(run, d, { registryLagged: false }),
    });
  } finally {
    await d.dispose();
  }
});

test("fault E4 - failover where the registry copy lagged: cursors of epochs the copy never saw", async () => {
  const d = await deployments();
  try {
    await runScenario({
      name: "E4 failover, lagged registry",
      env: d.env,
      workers: 2,
      duplicates: "allowed",
      prepare: async (run) => {
        const out = await runCli(run.env, ["replica", "setup", "--to", d.second.url, "--source-api", "$JS.pri.API"]);
        assert.equal(out.code, 0, out.text);
      },
      fault: async (run) => {
        // the registry copy stops following, then the primary takes shards over (new epochs)
        const nc = await connect({ servers: d.second.url });
        const jsm = await jetstreamManager(nc);
        const info = await jsm.streams.info(REGISTRY_STREAM);
        await jsm.streams.update(REGISTRY_STREAM, { ...info.config, sources: [] });
        await nc.close();
        const before = [...run.registry.state.shards.values()].map((s) => s.epoch);
        await run.workers[0]!.kill("SIGKILL");
        await waitFor("takeovers on the primary", () => [...run.registry.state.shards.values()].some((s, i) => s.epoch > before[i]!), { timeoutMs: 20_000 });
        await sleep(1000); // devices receive entries of the new epochs
        const bnc = await connect({ servers: d.second.url });
        const copy = await RegistryClient.open(bnc);
        const behind = [...run.registry.state.shards.values()].filter((s) => copy.state.shards.get(s.shard)!.epoch < s.epoch);
        await copy.close();
        await bnc.close();
        assert.ok(behind.length > 0, "the copy's registry lacks epochs the primary wrote");
        await failOver(run, d, { registryLagged: true });
      },
    });
  } finally {
    await d.dispose();
  }
});
