/**
 * Secured infrastructure links, all from config: NATS with user/password, token or nkey, over TLS
 * with a CA made for this test; Redis with an ACL user over TLS. A worker and a gateway run the
 * whole path on the secured pair; wrong credentials are named errors.
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { createUser } from "@nats-io/nkeys";
import { jetstreamManager } from "@nats-io/jetstream";
import { ConfigError } from "../../protocol/index.js";
import { loadConfig, Dispatcher, RegistryClient, connectNats, connectRedis } from "../../protocol/io/index.js";
import { NatsServer, RedisServer, freePort } from "../harness/servers.js";
import { initStack, spawnGateway, spawnWorker } from "../harness/stack.js";
import { TestDevice, deviceToken } from "../harness/device.js";
import { makeCerts } from "../harness/tls.js";
import { waitFor } from "../harness/wait.js";

const certs = makeCerts();
const tlsArgs = ["--tls", "--tlscert", certs.cert, "--tlskey", certs.key];
const natsUserPass = await NatsServer.start({ args: ["--user", "jg", "--pass", "nats-secret", ...tlsArgs] });
const natsToken = await NatsServer.start({ args: ["--auth", "nats-token", ...tlsArgs] });
const nkey = createUser();
const seedFile = join(certs.dir, "jg.nk");
writeFileSync(seedFile, new TextDecoder().decode(nkey.getSeed()));
const natsNkey = await NatsServer.start({ config: `authorization { users = [ { nkey: "${nkey.getPublicKey()}" } ] }\n`, args: tlsArgs });
const redisTlsPort = await freePort();
const redis = await RedisServer.start({
  args: [
    "--tls-port", String(redisTlsPort), "--tls-cert-file", certs.cert, "--tls-key-file", certs.key, "--tls-ca-cert-file", certs.ca,
    "--tls-auth-clients", "no", "--user", "default", "off", "--user", "jg", "on", ">redis-secret", "~*", "&*", "+@all",
  ],
});
after(async () => {
  await Promise.all([natsUserPass.dispose(), natsToken.dispose(), natsNkey.dispose(), redis.dispose()]);
  certs.dispose();
});

const natsTls = (srv: NatsServer) => `tls://127.0.0.1:${srv.port}`;
const base = {
  JETGATE_NATS_URL: natsTls(natsUserPass), JETGATE_NATS_USER: "jg", JETGATE_NATS_PASS: "nats-secret", JETGATE_NATS_CA_FILE: certs.ca,
  JETGATE_REDIS_URL: `rediss://jg:redis-secret@127.0.0.1:${redisTlsPort}`, JETGATE_REDIS_CA_FILE: certs.ca,
  JETGATE_LOG_LEVEL: "warn", JETGATE_SHARDS: "1",
};

async function jetstreamWorks(env: Record<string, string>): Promise<void> {
  const nc = await connectNats(loadConfig(env), "test");
  try {
    await (await jetstreamManager(nc)).getAccountInfo();
  } finally {
    await nc.close();
  }
}

test("secured links - NATS over TLS with user/password, token and nkey, each from config", async () => {
  await jetstreamWorks(base);
  await jetstreamWorks({ JETGATE_NATS_URL: natsTls(natsToken), JETGATE_NATS_TOKEN: "nats-token", JETGATE_NATS_CA_FILE: certs.ca });
  await jetstreamWorks({ JETGATE_NATS_URL: natsTls(natsNkey), JETGATE_NATS_NKEY_SEED_FILE: seedFile, JETGATE_NATS_CA_FILE: certs.ca });
});

test("secured links - wrong NATS credentials, or no CA for the server's certificate, fail by name", async () => {
  await assert.rejects(jetstreamWorks({ ...base, JETGATE_NATS_PASS: "wrong" }), /Authorization Violation|authorization/i);
  await assert.rejects(jetstreamWorks({ JETGATE_NATS_URL: natsTls(natsToken), JETGATE_NATS_TOKEN: "nope", JETGATE_NATS_CA_FILE: certs.ca }), /authorization/i);
  await assert.rejects(jetstreamWorks({ ...base, JETGATE_NATS_CA_FILE: undefined as never }), /certificate|self.signed|unable to verify/i);
});

test("secured links - Redis: the ACL user over TLS works; a wrong password is WRONGPASS", async () => {
  const good = connectRedis(loadConfig(base), "test");
  assert.equal(await good.ping(), "PONG");
  good.disconnect();
  const bad = connectRedis(loadConfig({ ...base, JETGATE_REDIS_URL: `rediss://jg:wrong@127.0.0.1:${redisTlsPort}` }), "test");
  bad.on("error", () => undefined);
  await assert.rejects(bad.ping(), /WRONGPASS|NOAUTH/);
  bad.disconnect();
});

test("secured links - config errors name the variable: unreadable files, two NATS auths, a password alone", () => {
  assert.throws(() => loadConfig({ JETGATE_NATS_CA_FILE: "/nonexistent/ca.pem" }), (e: unknown) => e instanceof ConfigError && /JETGATE_NATS_CA_FILE: cannot read \/nonexistent\/ca.pem \(ENOENT\)/.test(e.message));
  assert.throws(() => loadConfig({ JETGATE_NATS_TOKEN: "t", JETGATE_NATS_NKEY_SEED_FILE: seedFile }), /JETGATE_NATS_NKEY_SEED_FILE: set one NATS authentication/);
  assert.throws(() => loadConfig({ JETGATE_NATS_PASS: "p" }), /JETGATE_NATS_PASS: needs JETGATE_NATS_USER/);
});

test("secured links - a worker and a gateway run the whole path on TLS NATS and TLS Redis with ACL", async () => {
  await initStack(base);
  const worker = await spawnWorker(base);
  const gateway = await spawnGateway(base);
  const nc = await connectNats(loadConfig(base), "test-dispatch");
  const registry = await RegistryClient.open(nc);
  const dispatcher = new Dispatcher(nc, () => registry.shards, { lanes: ["default"] });
  try {
    await waitFor("the worker owns the shard", async () => (await worker.metric("jetgate_worker_lease_held")) === 1, { timeoutMs: 20_000 });
    const dev = await TestDevice.connect(gateway.httpPort);
    dev.send({ t: "AUTH", v: 1, token: await deviceToken("sec1"), device: "d" });
    await dev.next("SYNCED");
    await dispatcher.dispatch({ dispatch_id: "s1", message_id: "s1", lane: "default", recipients: ["sec1"], body: new Uint8Array([1]) });
    await waitFor("the entry delivered", () => dev.entries().some((e) => e.id === "s1"), { timeoutMs: 15_000 });
    dev.close();
  } finally {
    dispatcher.close();
    await registry.close();
    await nc.close();
    await gateway.kill();
    await worker.kill();
  }
});
