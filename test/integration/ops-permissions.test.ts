/**
 * docs/examples/nats-permissions.conf, the NATS users docs/security.md recommends, on a real
 * nats-server: jetgate's processes run as `jetgate`; a backend as `backend` dispatches an entry
 * that reaches a device, and can neither answer nor ask on jetgate.ops.stats (a fake worker made the
 * console show every shard owned with lag 0), nor publish on another client's inbox.
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { CONTROL_SUBJECTS, OPS_STATS_SUBJECT } from "../../protocol/index.js";
import { Dispatcher, RegistryClient } from "../../protocol/io/index.js";
import { AdminStateSchema } from "../../gateway/http/admin.js";
import { NatsServer, RedisServer } from "../harness/servers.js";
import { initStack, spawnGateway, spawnWorker } from "../harness/stack.js";
import { TestDevice, deviceToken } from "../harness/device.js";
import { waitFor } from "../harness/wait.js";

const TOKEN = "ops-permissions-token-0123456789";
const conf = readFileSync(new URL("../../docs/examples/nats-permissions.conf", import.meta.url), "utf8")
  .replaceAll("$JETGATE_NATS_PASS", '"jetgate-pass"')
  .replaceAll("$BACKEND_NATS_PASS", '"backend-pass"');
const nats = await NatsServer.start({ config: conf });
const redis = await RedisServer.start();
const env = {
  JETGATE_NATS_URL: nats.url, JETGATE_NATS_USER: "jetgate", JETGATE_NATS_PASS: "jetgate-pass", JETGATE_REDIS_URL: redis.url,
  JETGATE_SHARDS: "2", JETGATE_LOG_LEVEL: "warn",
};
await initStack(env);
const worker = await spawnWorker(env);
const gateway = await spawnGateway(env, { JETGATE_ADMIN_TOKEN: TOKEN });
const backend = await connect({ servers: nats.url, user: "backend", pass: "backend-pass" });
after(async () => {
  await backend.close().catch(() => undefined);
  await gateway.kill();
  await worker.kill();
  await Promise.all([nats.dispose(), redis.dispose()]);
});

/** The next permissions error the server reports to `nc` (nats.js reports it as a status, the connection stays). */
async function nextPermissionError(nc: NatsConnection, act: () => void): Promise<string> {
  const errors = (async () => {
    for await (const s of nc.status()) if (s.type === "error" && /permission/i.test(String(s.error))) return String(s.error);
    return "";
  })();
  act();
  return Promise.race([errors, new Promise<string>((r) => setTimeout(() => r("no error"), 3000))]);
}

test("ops permissions - a backend dispatches as `backend`: the entry reaches a device", async () => {
  const registry = await RegistryClient.open(backend);
  const dispatcher = new Dispatcher(backend, () => registry.shards, { lanes: ["default"] });
  const dev = await TestDevice.connect(gateway.httpPort);
  try {
    dev.send({ t: "AUTH", v: 1, token: await deviceToken("perm-user"), device: "d1" });
    await dev.next("SYNCED");
    const [r] = await dispatcher.dispatch({ dispatch_id: "perm1", message_id: "perm1", lane: "default", recipients: ["perm-user"], body: new Uint8Array(4) });
    assert.ok(r !== undefined && "seq" in r, r !== undefined && "error" in r ? r.error.message : "no result");
    await waitFor("the entry on the device", () => dev.entries().some((e) => e.id === "perm1"));
  } finally {
    dev.close();
    dispatcher.close();
    await registry.close();
  }
});

test("ops permissions - `backend` can neither answer nor ask on jetgate.ops.stats, nor publish on an inbox; the console shows jetgate's processes", async () => {
  assert.match(await nextPermissionError(backend, () => backend.subscribe(OPS_STATS_SUBJECT, { callback: () => undefined })), /Permissions Violation for Subscription to "jetgate\.ops\.stats"/);
  assert.match(await nextPermissionError(backend, () => backend.publish(OPS_STATS_SUBJECT, "")), /Permissions Violation for Publish to "jetgate\.ops\.stats"/);
  assert.match(await nextPermissionError(backend, () => backend.publish("_INBOX.someone", "{}")), /Permissions Violation for Publish to "_INBOX\.someone"/);
  // the users API's control requests (end sessions, revoke tokens) are jetgate's own too
  for (const subject of Object.values(CONTROL_SUBJECTS)) {
    assert.match(await nextPermissionError(backend, () => backend.publish(subject, "{}")), new RegExp(`Permissions Violation for Publish to "${subject.replaceAll(".", "\\.")}"`));
  }
  const st = AdminStateSchema.parse(await (await fetch(`http://127.0.0.1:${gateway.httpPort}/admin/api/state`, { headers: { authorization: `Bearer ${TOKEN}` } })).json());
  assert.deepEqual(st.processes.map((p) => p.kind).sort(), ["gateway", "worker"]);
  assert.deepEqual(st.down, []);
});
