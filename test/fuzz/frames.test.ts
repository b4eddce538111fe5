/**
 * The frame fuzzer against a live gateway (worker and real delivery included). `npm test` runs a
 * bounded number of cases; `npm run fuzz` runs many more (FUZZ_CASES, FUZZ_SEED to reproduce).
 *
 * Memory is bounded on what the gateway still holds after a full garbage collection (its V8
 * inspector: test/harness/inspector.ts), which a leak grows, not on its RSS: V8 keeps heap it
 * collected for later, and 20,000 cases grew RSS from 122 to 297 MB with nothing leaked (three
 * runs of three failed a 150 MB bound on RSS). The bound is shown to catch a leak planted in the
 * gateway.
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { Inspector } from "../harness/inspector.js";
import { spawnGateway, startStack } from "../harness/stack.js";
import { TestDevice, deviceToken } from "../harness/device.js";
import { sleep, waitFor } from "../harness/wait.js";
import { fuzzGateway } from "./frame-fuzz.js";

const CASES = Number(process.env.FUZZ_CASES ?? 600);
const SEED = Number(process.env.FUZZ_SEED ?? Date.now() % 1_000_000_007);

const stack = await startStack({ env: { JETGATE_MAX_PAYLOAD: "65536", JETGATE_MAX_CONNS_PER_USER: "64" } });
const gateway = (stack.gateway = await spawnGateway(stack.infra.env, {}, ["--inspect=127.0.0.1:0"]));
const v8 = await Inspector.of(gateway);
after(async () => {
  v8.close();
  await stack.dispose();
});

/**
 * What the live heap may grow by over `cases` cases: 16 MiB, and 1 KiB a case (caches filling: the
 * recent users' hashes, metric label sets). A leak of a connection's session (tens of KiB) passes it
 * within a few hundred cases.
 */
function leakProblem(beforeMb: number, afterMb: number, cases: number): string | undefined {
  const allowed = 16 + cases / 1024;
  return afterMb - beforeMb > allowed ? `the gateway's live heap grew ${beforeMb.toFixed(1)} -> ${afterMb.toFixed(1)} MiB over ${cases} cases (at most ${allowed.toFixed(1)} allowed)` : undefined;
}

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
  const liveBefore = await v8.liveHeapMb();
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
  const liveAfter = await v8.liveHeapMb();
  // every fuzz connection is gone from the gateway's books: only the bystander remains
  await waitFor("fuzz sessions released", async () => (await gateway.metric("jetgate_gateway_connections")) === 1, { timeoutMs: 5000 });
  const heapMb = (await gateway.metric("jetgate_gateway_nodejs_heap_size_used_bytes")) / 2 ** 20;
  assert.equal((await gateway.http("/healthz")).status, 200);
  await waitFor("the bystander got every entry dispatched during the fuzz", () => sent.every((id) => bystander.entries().some((e) => e.id === id)), { timeoutMs: 15_000 });
  assert.equal(bystander.closed, undefined);
  const leak = leakProblem(liveBefore, liveAfter, stats.cases);
  assert.equal(leak, undefined, leak);
  const kinds = [...stats.byKind].map(([k, n]) => `${k} ${n}`).join(", ");
  const closes = [...stats.closes].map(([c, n]) => `${c}x${n}`).join(" ");
  console.log(`fuzz seed ${SEED}: ${stats.cases} cases in ${((Date.now() - t0) / 1000).toFixed(1)} s (${kinds}); closes ${closes}; accepted ${stats.accepted}; gateway RSS ${before.toFixed(0)} -> ${after.toFixed(0)} MB, heap used ${heapMb.toFixed(0)} MB, live heap ${liveBefore.toFixed(1)} -> ${liveAfter.toFixed(1)} MiB; bystander got ${sent.length} entries`);
  bystander.close();
});

test("fuzz - the memory bound catches a leak: 40 MiB kept by the gateway past a full collection fails it", async () => {
  const before = await v8.liveHeapMb();
  assert.equal(leakProblem(before, await v8.liveHeapMb(), CASES), undefined, "nothing planted: within the bound");
  // what a leak looks like from outside: memory the gateway keeps reachable and never frees
  // (arrays of numbers: 1 MiB each in V8's heap, where a typed array's bytes are not, and a
  // repeated string is a rope of a few nodes)
  await v8.evaluate("globalThis.plantedLeak = Array.from({ length: 40 }, () => new Array(1 << 17).fill(0.5))");
  try {
    assert.match(leakProblem(before, await v8.liveHeapMb(), CASES) ?? "", /^the gateway's live heap grew .* over \d+ cases/);
  } finally {
    await v8.evaluate("delete globalThis.plantedLeak");
  }
});
