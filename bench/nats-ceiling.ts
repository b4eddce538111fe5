/**
 * What one nats-server costs per JetStream append on this machine, with the lightest publisher
 * possible: a tight loop of core publishes with a reply subject and a Nats-Msg-Id, acks counted
 * on one inbox. No jetgate code is involved; it shows the ceiling dispatch works under.
 *
 *   npm run bench:nats -- [--messages 100000] [--subjects 20000] [--json]
 */
import { parseArgs } from "node:util";
import { readFileSync } from "node:fs";
import { connect, createInbox, headers } from "@nats-io/transport-node";
import { jetstreamManager, StorageType } from "@nats-io/jetstream";
import { NatsServer } from "../test/harness/servers.js";

const { values } = parseArgs({
  options: {
    messages: { type: "string", default: "100000" },
    subjects: { type: "string", default: "20000" },
    json: { type: "boolean", default: false },
  },
});
const N = Number(values.messages);
const subjects = Number(values.subjects);

/** CPU seconds (user + system) a process has used so far. */
function cpuSeconds(pid: number): number {
  const f = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
  return (Number(f[11]) + Number(f[12])) / 100;
}

const srv = await NatsServer.start();
try {
  const nc = await connect({ servers: srv.url });
  const jsm = await jetstreamManager(nc);
  await jsm.streams.add({ name: "CEILING", subjects: ["c.>"], storage: StorageType.File, allow_direct: true });
  const inbox = createInbox();
  let acks = 0;
  let done!: () => void;
  const all = new Promise<void>((r) => (done = r));
  nc.subscribe(`${inbox}.*`, { callback: () => void (++acks === N && done()) });
  const body = new Uint8Array(130);
  const cpu0 = cpuSeconds(srv.pid!);
  const client0 = process.cpuUsage();
  const t0 = performance.now();
  for (let i = 0; i < N; i++) {
    const h = headers();
    h.set("Nats-Msg-Id", `d${i}:user${i % subjects}`);
    nc.publish(`c.user${i % subjects}.default`, body, { reply: `${inbox}.${i}`, headers: h });
    if (i % 2000 === 0) await nc.flush();
  }
  await all;
  const secs = (performance.now() - t0) / 1000;
  const client = process.cpuUsage(client0);
  const result = {
    bench: "nats-ceiling",
    messages: N,
    appends_per_s: Math.round(N / secs),
    server_cpu_us_per_append: Number((((cpuSeconds(srv.pid!) - cpu0) / N) * 1e6).toFixed(1)),
    client_cpu_us_per_append: Number(((client.user + client.system) / N).toFixed(1)),
  };
  console.log(values.json ? JSON.stringify(result) : Object.entries(result).map(([k, v]) => `${k}=${v}`).join("  "));
  await nc.close();
} finally {
  await srv.dispose();
}
