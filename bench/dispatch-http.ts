/**
 * What one HTTP dispatch costs the gateway that takes it, by shape: bytes appended (recipients x
 * body) against the gateway's RSS growth, its event loop's longest delay, and the longest PONG of a
 * bystander device pinging every 10 ms on the same gateway, and its /readyz probed every 100 ms. A gateway, a worker, their own
 * nats-server and redis-server, as the tests start them.
 *
 *   npm run bench:dispatch-http -- [--runs 3] [--json]
 * SHAPES=1,3 runs some of the shapes (by index); MAX_BYTES sets the gateway's JETGATE_DISPATCH_MAX_BYTES;
 * NO_WORKER=1 runs no worker; HARNESS_DIST=1 runs the compiled build (npm run build first).
 */
import { parseArgs } from "node:util";
import { readFileSync } from "node:fs";
import { initStack, spawnGateway, spawnWorker, startInfra, type JetgateProcess } from "../test/harness/stack.js";
import { TestDevice, deviceToken } from "../test/harness/device.js";

const { values } = parseArgs({ options: { runs: { type: "string", default: "3" }, json: { type: "boolean", default: false } } });
const runs = Number(values.runs);

interface Shape {
  name: string;
  /** Requests sent at once. */
  parallel: number;
  batch: boolean;
  dispatches: number;
  recipients: number;
  body: number;
}

const ONLY = process.env.SHAPES === undefined ? undefined : new Set(process.env.SHAPES.split(","));
const SHAPES_ALL: Shape[] = [
  { name: "1 x 16 B", parallel: 1, batch: false, dispatches: 1, recipients: 1, body: 16 },
  { name: "10,000 x 16 B", parallel: 1, batch: false, dispatches: 1, recipients: 10_000, body: 16 },
  { name: "batch 10 x 1,000 x 16 B", parallel: 1, batch: true, dispatches: 10, recipients: 1000, body: 16 },
  { name: "10 in parallel, 10,000 x 16 B", parallel: 10, batch: false, dispatches: 1, recipients: 10_000, body: 16 },
  { name: "256 x 64 KiB (16 MiB)", parallel: 1, batch: false, dispatches: 1, recipients: 256, body: 64 * 1024 },
  { name: "batch 5 x 2,000 x 1,677 B (16 MiB)", parallel: 1, batch: true, dispatches: 5, recipients: 2000, body: 1677 },
  { name: "2 in parallel, 256 x 64 KiB", parallel: 2, batch: false, dispatches: 1, recipients: 256, body: 64 * 1024 },
  { name: "10,000 x 64 KiB (refused)", parallel: 1, batch: false, dispatches: 1, recipients: 10_000, body: 64 * 1024 },
  // past the default limit: with MAX_BYTES=1073741824 it shows memory bounded by the publish window, not by what is appended
  { name: "2,000 x 64 KiB (131 MB)", parallel: 1, batch: false, dispatches: 1, recipients: 2000, body: 64 * 1024 },
];
/** SHAPES=1,3 (indexes) runs only those. */
const SHAPES = SHAPES_ALL.filter((_, i) => ONLY === undefined || ONLY.has(String(i)));

function rss(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m === null ? 0 : Number(m[1]) * 1024;
}

function body(shape: Shape, run: number, p: number): string {
  const b = Buffer.alloc(shape.body, 7).toString("base64");
  const one = (d: number) => ({
    dispatch_id: `${shape.name.replace(/\W/g, "")}-${run}-${p}-${d}`.slice(0, 64), message_id: `m${run}-${p}-${d}`, lane: "default",
    recipients: Array.from({ length: shape.recipients }, (_, i) => `u${d}-${i}`), body_b64: b,
  });
  return JSON.stringify(shape.batch ? { dispatches: Array.from({ length: shape.dispatches }, (_, d) => one(d)) } : one(0));
}

async function lagMaxMs(g: JetgateProcess): Promise<number> {
  // prom-client resets its event-loop histogram at each scrape: a scrape before the request starts the window
  return (await g.metric("jetgate_gateway_nodejs_eventloop_lag_max_seconds")) * 1000;
}

const infra = await startInfra({ JETGATE_SHARDS: "4", JETGATE_SERVICE_TOKEN: "svc", JETGATE_LOG_LEVEL: "warn" });
const rows: Record<string, number | string>[] = [];
try {
  await initStack(infra.env);
  // NO_WORKER=1: the gateway alone with the servers (the worker's processing of what is appended competes for the same cores otherwise)
  const worker = process.env.NO_WORKER === "1" ? undefined : await spawnWorker(infra.env);
  const gateway = await spawnGateway(infra.env, process.env.MAX_BYTES === undefined ? {} : { JETGATE_DISPATCH_MAX_BYTES: process.env.MAX_BYTES });
  const bystander = await TestDevice.connect(gateway.httpPort);
  bystander.send({ t: "AUTH", v: 1, token: await deviceToken("bystander"), device: "d1" });
  await bystander.next("SYNCED");
  for (const shape of SHAPES) {
    for (let run = 0; run < runs; run++) {
      const bodies = Array.from({ length: shape.parallel }, (_, p) => body(shape, run, p));
      await lagMaxMs(gateway);
      const base = rss(gateway.pid);
      let peak = base;
      let pongMax = 0;
      let pinging = true;
      const sampler = setInterval(() => (peak = Math.max(peak, rss(gateway.pid))), 20);
      // the gateway's readiness, as a load balancer probes it (its own dependency probes time out if its loop stalls)
      let readyz = 0;
      let notReady = 0;
      const prober = setInterval(() => {
        readyz++;
        gateway.http("/readyz").then((r) => r.status === 200 || notReady++, () => notReady++);
      }, 100);
      const pinger = (async () => {
        while (pinging) {
          const t = performance.now();
          await bystander.roundTrip(30_000);
          pongMax = Math.max(pongMax, performance.now() - t);
          await new Promise((r) => setTimeout(r, 10));
        }
      })();
      const t0 = performance.now();
      const statuses = await Promise.all(bodies.map(async (b) => {
        const res = await fetch(`http://127.0.0.1:${gateway.httpPort}/v1/dispatch${shape.batch ? "/batch" : ""}`, {
          method: "POST", headers: { authorization: "Bearer svc", "content-type": "application/json" }, body: b,
        });
        await res.arrayBuffer();
        return res.status;
      }));
      const ms = performance.now() - t0;
      pinging = false;
      await pinger;
      clearInterval(sampler);
      clearInterval(prober);
      const lag = await lagMaxMs(gateway);
      rows.push({
        shape: shape.name, run,
        appendedBytes: shape.parallel * shape.dispatches * shape.recipients * shape.body,
        requestBytes: bodies.reduce((n, b) => n + b.length, 0),
        status: [...new Set(statuses)].join("/"),
        ms: Math.round(ms),
        rssGrowthMiB: Number(((peak - base) / 1048576).toFixed(1)),
        eventLoopMaxMs: Number(lag.toFixed(1)),
        pongMaxMs: Number(pongMax.toFixed(1)),
        readyzNotReady: `${notReady}/${readyz}`,
      });
      if (!values.json) {
        const r = rows.at(-1)!;
        console.log(`${String(r.shape).padEnd(36)} run ${run}: ${r.status} in ${r.ms} ms; appended ${r.appendedBytes} B from ${r.requestBytes} B of request; RSS +${r.rssGrowthMiB} MiB; event loop max ${r.eventLoopMaxMs} ms; bystander PONG max ${r.pongMaxMs} ms; /readyz not 200: ${r.readyzNotReady}`);
      }
      await new Promise((r) => setTimeout(r, 500));
    }
  }
  if (values.json) for (const r of rows) console.log(JSON.stringify({ bench: "dispatch-http", ...r }));
  bystander.close();
  await gateway.kill();
  await worker?.kill();
} finally {
  await infra.dispose();
}
