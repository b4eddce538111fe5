/**
 * The Dispatcher while nats-server is stopped (SIGSTOP), the connection open but nothing read
 * (issue 39, items 5 and 6): a gateway under `POST /v1/dispatch/batch` keeps its memory bounded
 * through a 75 s stall, whatever its retries, and answers 503 for what does not fit; after the
 * stall every entry answered as appended is in its stream once, at its offset; and an entry sent
 * once never answers `duplicate: true` because the Dispatcher's own earlier attempt landed.
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { startStack } from "../harness/stack.js";
import { sleep, waitFor } from "../harness/wait.js";

const LANE = "default";
const stack = await startStack({ env: { JETGATE_SERVICE_TOKEN: "svc-secret" }, worker: false, gateway: {} });
after(() => stack.dispose());
const gateway = stack.gateway!;

/** Resident memory of a process, from /proc. */
function rssBytes(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m === null ? 0 : Number(m[1]) * 1024;
}
const mib = (b: number) => (b / 1048576).toFixed(0);

type Result = { user: string; offset?: number; duplicate?: boolean; error?: { code: string } };
type Answer = { status: number; dispatches: { results: Result[] }[]; error?: string; code?: string; retryAfter: string | null };

interface Dispatch {
  dispatch_id: string;
  message_id: string;
  lane: string;
  recipients: string[];
  body_b64: string;
}

async function postBatch(dispatches: Dispatch[]): Promise<Answer> {
  const res = await fetch(`http://127.0.0.1:${gateway.httpPort}/v1/dispatch/batch`, {
    method: "POST",
    headers: { authorization: "Bearer svc-secret", "content-type": "application/json" },
    body: JSON.stringify({ dispatches }),
    signal: AbortSignal.timeout(240_000),
  });
  const json = (await res.json()) as { dispatches?: { results: Result[] }[]; error?: string; code?: string };
  return { status: res.status, dispatches: json.dispatches ?? [], error: json.error, code: json.code, retryAfter: res.headers.get("retry-after") };
}

/** Where each Nats-Msg-Id is in the shard streams (every place, to count copies), read headers only. */
async function storedIds(): Promise<Map<string, string[]>> {
  const js = jetstream(stack.nc);
  const jsm = await jetstreamManager(stack.nc);
  const where = new Map<string, string[]>();
  for (const shard of stack.registry.state.shards.keys()) {
    const stream = `MBX_${shard}`;
    const last = (await jsm.streams.info(stream)).state.last_seq;
    if (last === 0) continue;
    const c = await js.consumers.get(stream, { headers_only: true });
    for await (const m of await c.fetch({ max_messages: last, expires: 30_000 })) {
      const id = m.headers?.get("Nats-Msg-Id") ?? "";
      where.set(id, [...(where.get(id) ?? []), `${stream}#${m.seq}`]);
      if (m.seq >= last) break;
    }
  }
  return where;
}

/**
 * Every entry answered as appended is in the stream exactly once, at the offset its result names;
 * an error result is allowed (DISPATCH_TIMEOUT: appended or not); nothing of a request answered
 * 503 is there. Returns the counts.
 */
function checkAppended(sent: Dispatch[][], answers: Answer[], where: Map<string, string[]>): { ok: number; failed: number } {
  let ok = 0;
  let failed = 0;
  answers.forEach((a, i) => {
    if (a.status === 503) {
      assert.equal(a.code, "DISPATCH_UNAVAILABLE");
      assert.equal(a.retryAfter, "2");
      for (const d of sent[i]!) for (const u of d.recipients) assert.equal(where.get(`${d.dispatch_id}:${u}`), undefined, `${d.dispatch_id}:${u} of a request answered 503 is stored`);
      return;
    }
    assert.ok(a.status === 200 || a.status === 502, `request ${i} answered ${a.status}`);
    a.dispatches.forEach((d, j) => {
      const dispatch = sent[i]![j]!;
      d.results.forEach((r, k) => {
        if (r.error !== undefined) return void failed++;
        const id = `${dispatch.dispatch_id}:${dispatch.recipients[k]}`;
        const at = where.get(id) ?? [];
        assert.equal(at.length, 1, `${id} answered appended at offset ${r.offset}: in the streams ${at.length} times (${at.join(", ")})`);
        assert.ok(at[0]!.endsWith(`#${r.offset}`), `${id} answered offset ${r.offset}, stored at ${at[0]}`);
        ok++;
      });
    });
  });
  for (const [id, at] of where) assert.equal(at.length, 1, `${id} stored ${at.length} times`);
  return { ok, failed };
}

const users = (n: number, prefix: string) => Array.from({ length: n }, (_, i) => `${prefix}${i}`);

test("dispatch stall - eight batches of 8 x 1,000 x 2 KiB with nats-server stopped 75 s: the gateway's memory stays bounded, and what it answered as appended is stored once", { timeout: 300_000 }, async () => {
  const body = Buffer.alloc(2048, 7).toString("base64");
  const requests = Array.from({ length: 8 }, (_, r) =>
    Array.from({ length: 8 }, (_, d) => ({ dispatch_id: `st${r}-${d}`, message_id: `st${r}-${d}`, lane: LANE, recipients: users(1000, `s${r}u`), body_b64: body })),
  );
  const base = rssBytes(gateway.pid);
  stack.infra.nats.pause();
  const t0 = Date.now();
  const answers = Promise.all(requests.map((r) => postBatch(r)));
  const samples: { s: number; rss: number }[] = [];
  let peak = base;
  try {
    while (Date.now() - t0 < 75_000) {
      const rss = rssBytes(gateway.pid);
      peak = Math.max(peak, rss);
      const s = Math.round((Date.now() - t0) / 1000);
      if (samples.length === 0 || s >= samples[samples.length - 1]!.s + 5) samples.push({ s, rss });
      await sleep(250);
    }
  } finally {
    stack.infra.nats.resume();
  }
  const all = await answers;
  const where = await storedIds();
  const { ok, failed } = checkAppended(requests, all, where);
  const statuses = all.map((a) => a.status).join(" ");
  console.log(`  RSS before ${mib(base)} MiB, peak ${mib(peak)} MiB (+${mib(peak - base)}) over a ${Math.round((Date.now() - t0) / 1000)} s stall; by second: ${samples.map((x) => `${x.s}s +${mib(x.rss - base)}`).join(", ")}`);
  console.log(`  answers ${statuses}; entries appended ${ok}, errors ${failed}, stored ${where.size}`);
  // The bound: what the Dispatcher may hold is the 8 MiB window in nats.js (its bytes, plus about
  // 256 bytes of protocol for each of its 10,000 publishes at most: under 11 MiB) and a queue of at
  // most 64 MiB counted with 256 bytes an entry (JETGATE_DISPATCH_QUEUE_BYTES: an entry of 2 KiB
  // shares its body, so its memory is well under what it counts); twice that for the copies a
  // publish goes through and the garbage collector's slack is 150 MiB. The unbounded code grew
  // 3.6 MiB a second of stall, past 250 MiB in 75 s.
  assert.ok(peak - base < 150 * 1048576, `the gateway grew ${mib(peak - base)} MiB during the stall`);
  assert.ok(ok > 0, "some entries appended after the stall");
  const refused = all.filter((a) => a.status === 503);
  assert.ok(refused.length > 0, "requests the queue had no room for were refused");
  for (const a of refused) assert.match(a.error!, /^the dispatch queue is full \(.*\): nothing was published$/);
});

/** Entries in the shard streams now. */
async function storedCount(): Promise<number> {
  const jsm = await jetstreamManager(stack.nc);
  let n = 0;
  for (const shard of stack.registry.state.shards.keys()) n += (await jsm.streams.info(`MBX_${shard}`)).state.messages;
  return n;
}

/**
 * One HTTP batch of 1,000 dispatches x 10 users (10,000 entries, each user's queued behind its
 * first: atomic batches), nats-server stopped 6 s once `stopWhen` says so; every entry answers
 * appended, none `duplicate: true`, each is stored once.
 */
async function sentOnce(prefix: string, stopWhen: () => Promise<unknown>): Promise<void> {
  const recipients = users(10, `${prefix}u`);
  const dispatches = Array.from({ length: 1000 }, (_, i) => ({ dispatch_id: `${prefix}${i}`, message_id: `${prefix}${i}`, lane: LANE, recipients, body_b64: Buffer.from(`entry ${i}`).toString("base64") }));
  const before = await storedCount();
  let answeredAt = 0;
  const answer = postBatch(dispatches).then((a) => ((answeredAt = Date.now()), a));
  await stopWhen();
  const stoppedCount = await storedCount();
  const stoppedAt = Date.now();
  stack.infra.nats.pause();
  try {
    await sleep(6000);
  } finally {
    stack.infra.nats.resume();
  }
  const a = await answer;
  const where = await storedIds();
  const { ok, failed } = checkAppended([dispatches], [a], where);
  const duplicates = a.dispatches.reduce((n, d) => n + d.results.filter((r) => r.duplicate === true).length, 0);
  console.log(`  ${stoppedCount - before} of its entries stored at the stop; answered ${a.status} ${answeredAt - stoppedAt} ms after the stop; entries appended ${ok}, errors ${failed}, duplicate: true ${duplicates}`);
  assert.ok(answeredAt - stoppedAt >= 6000, "the stall caught the request in flight");
  assert.equal(a.status, 200);
  assert.equal(ok, 10_000);
  assert.equal(duplicates, 0, "entries sent once answered duplicate: the Dispatcher's own earlier attempt");
}

test("dispatch stall - 1,000 dispatches x 10 users sent once, nats-server stopped 6 s as they arrive: no entry answers duplicate, each is stored once", { timeout: 120_000 }, async () => {
  await sentOnce("da", async () => undefined);
});

test("dispatch stall - the same, nats-server stopped 6 s once the first atomic batches committed (others in flight): no duplicate", { timeout: 120_000 }, async () => {
  const start = await storedCount();
  // each user's first entry goes alone: more than 10 stored means batches have begun
  await sentOnce("db", () => waitFor("the first atomic batches committed", async () => (await storedCount()) > start + 10, { timeoutMs: 20_000, intervalMs: 2 }));
});
