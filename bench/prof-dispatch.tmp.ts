import { connect } from "@nats-io/transport-node";
import { Dispatcher, RegistryClient } from "../protocol/index.js";
import { startInfra, initStack } from "../test/harness/stack.js";
const infra = await startInfra({ JETGATE_SHARDS: "4" });
await initStack(infra.env);
const nc = await connect({ servers: infra.nats.url });
const registry = await RegistryClient.open(nc);
const d = new Dispatcher(nc, () => registry.shards, { lanes: ["default"], maxInFlight: 5000 });
const N = 60000;
const inFlight = new Set<Promise<unknown>>();
const c0 = process.cpuUsage();
const t0 = performance.now();
for (let i = 0; i < N; i++) {
  const p = d.dispatch({ dispatch_id: `b${i}`, message_id: `b${i}`, lane: "default", recipients: [`u${i % 1000}`], body: new Uint8Array(64) });
  inFlight.add(p);
  void p.finally(() => inFlight.delete(p));
  if (inFlight.size >= 5000) await Promise.race(inFlight);
}
await Promise.all(inFlight);
const c = process.cpuUsage(c0);
console.log(JSON.stringify({ perS: Math.round(N / ((performance.now() - t0) / 1000)), us: ((c.user + c.system) / N).toFixed(1) }));
d.close(); await registry.close(); await nc.close(); await infra.dispose();
