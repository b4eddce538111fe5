/**
 * The frame fuzzer against a live gateway (worker and real delivery included). `npm test` runs a
 * bounded number of cases; `npm run fuzz` runs many more (FUZZ_CASES, FUZZ_SEED to reproduce).
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { startStack } from "../harness/stack.js";
import { TestDevice, deviceToken } from "../harness/device.js";
import { sleep, waitFor } from "../harness/wait.js";
import { fuzzGateway } from "./frame-fuzz.js";

const CASES = Number(process.env.FUZZ_CASES ?? 600);
const SEED = Number(process.env.FUZZ_SEED ?? Date.now() % 1_000_000_007);

const stack = await startStack({ env: { JETGATE_MAX_PAYLOAD: "65536", JETGATE_MAX_CONNS_PER_USER: "64" }, gateway: {} });
after(() => stack.dispose());
const gateway = stack.gateway!;

function rssMb(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return Number(m![1]) / 1024;
}

test(`fuzz - ${CASES} hostile frames: documented errors and closes only, no crash, bounded memory, a bystander keeps receiving`, async () => {
  const bystander = await TestDevice.connect(gateway.httpPort);
  bystander.send({ t: "AUTH", v: 1, token: await deviceToken("fz-bystander"), device: "d" });
  await bystander.next("SYNCED");
  let running = true;
  const sent: string[] = [];
  const load = (async () => {
    for (let i = 0; running; i++) {
      const id = `by${i}`;
      const [r] = await stack.dispatcher.dispatch({ dispatch_id: id, message_id: id, lane: "default", recipients: ["fz-bystander"], body: new Uint8Array(4) });
      if (r && "seq" in r) sent.push(id);
      await sleep(100);
    }
  })();
  await sleep(500);
  const before = rssMb(gateway.pid);
  const t0 = Date.now();
  let stats;
  try {
    stats = await fuzzGateway(gateway.httpPort, { cases: CASES, seed: SEED, onProgress: (n) => console.log(`fuzz: ${n} cases, gateway RSS ${rssMb(gateway.pid).toFixed(0)} MB`) });
  } catch (err) {
    throw new Error(`fuzz seed ${SEED}: ${(err as Error).message}`, { cause: err });
  } finally {
    running = false;
    await load;
  }
  const after = rssMb(gateway.pid);
  assert.equal(gateway.proc.exitCode, null, "the gateway is alive");
  // every fuzz connection is gone from the gateway's books: only the bystander remains
  await waitFor("fuzz sessions released", async () => (await gateway.metric("jetgate_gateway_connections")) === 1, { timeoutMs: 5000 });
  const heapMb = (await gateway.metric("jetgate_gateway_nodejs_heap_size_used_bytes")) / 2 ** 20;
  assert.equal((await gateway.http("/healthz")).status, 200);
  await waitFor("the bystander got every entry dispatched during the fuzz", () => sent.every((id) => bystander.entries().some((e) => e.id === id)), { timeoutMs: 15_000 });
  assert.equal(bystander.closed, undefined);
  assert.ok(after - before < 150, `gateway RSS grew ${before.toFixed(0)} -> ${after.toFixed(0)} MB`);
  const kinds = [...stats.byKind].map(([k, n]) => `${k} ${n}`).join(", ");
  const closes = [...stats.closes].map(([c, n]) => `${c}x${n}`).join(" ");
  console.log(`fuzz seed ${SEED}: ${stats.cases} cases in ${((Date.now() - t0) / 1000).toFixed(1)} s (${kinds}); closes ${closes}; accepted ${stats.accepted}; gateway RSS ${before.toFixed(0)} -> ${after.toFixed(0)} MB, heap used ${heapMb.toFixed(0)} MB; bystander got ${sent.length} entries`);
  bystander.close();
});
