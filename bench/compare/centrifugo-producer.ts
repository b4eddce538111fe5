/**
 * Publishes entries to users' personal channels (`user:<user>`, bench/compare/centrifugo.ts) through Centrifugo's server HTTP API,
 * in batches (`POST /api/batch`, the API key in `X-API-Key`): the way a backend publishes to
 * Centrifugo. Each body goes as `b64data`, so the devices (protobuf protocol) get the same 64 bytes
 * as every other system's.
 *
 * Order: a batch's commands run one after another (`parallel: false`); with `parallel: true`
 * Centrifugo runs them at once and two entries of one user in a batch may land in either order.
 * So, to keep each user's entries in the order they were sent (jetgate's Dispatcher does) while
 * several requests are in flight, users are spread over LANES lanes (user index mod LANES), each
 * with one request in flight at a time: at most LANES requests and LANES * MAX_BATCH entries in
 * flight, over keep-alive connections.
 *
 *   node --import tsx bench/compare/centrifugo-producer.ts <api-url> <api-key> <index>
 * Commands (JSON lines): {"cmd":"send","seconds":S,"users":N,"rate"?:R} -> {"sent":N};
 * {"cmd":"each","from":A,"to":B,"perUser":K} -> {"sent":N} (K entries to each of uA..u(B-1)).
 * A publish Centrifugo refuses is said on stderr (and then missing at the devices).
 */
import { Agent, request } from "node:http";
import { idSource, stampedBody } from "./entries.js";
import { serveProducer } from "./pace.js";

const [apiUrl, apiKey] = [process.argv[2]!, process.argv[3]!];
const nextId = idSource(Number(process.argv[4] ?? 0));
/** Lanes, each with one batch request in flight at a time. */
const LANES = 64;
/** Most entries in one batch request. */
const MAX_BATCH = 100;
/** Entries queued or in flight above which an unpaced send waits. */
const MAX_PENDING = LANES * MAX_BATCH;
const agent = new Agent({ keepAlive: true, maxSockets: LANES });
const batchUrl = new URL(`${apiUrl}/batch`);

interface Lane {
  /** Publish commands (JSON) waiting for the lane's next request. */
  queue: string[];
  busy: boolean;
}
const lanes: Lane[] = Array.from({ length: LANES }, () => ({ queue: [], busy: false }));
/** Entries queued or in flight. */
let pending = 0;
let failed = 0;
let waiters: { limit: number; resolve: () => void }[] = [];

function post(body: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const req = request(batchUrl, {
      method: "POST", agent,
      headers: { "Content-Type": "application/json", "X-API-Key": apiKey, "Content-Length": Buffer.byteLength(body) },
    }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => {
        const text = Buffer.concat(chunks).toString();
        if (res.statusCode === 200) resolve(text);
        else reject(new Error(`HTTP ${res.statusCode}: ${text.slice(0, 200)}`));
      });
      res.on("error", reject);
    });
    req.on("error", reject);
    req.end(body);
  });
}

function fail(n: number, why: string): void {
  failed += n;
  console.error(`centrifugo-producer: ${n} publish(es) refused (${failed} in all): ${why}`);
}

function pump(lane: Lane): void {
  if (lane.busy || lane.queue.length === 0) return;
  const cmds = lane.queue.splice(0, MAX_BATCH);
  lane.busy = true;
  const done = () => {
    lane.busy = false;
    pending -= cmds.length;
    const ready = waiters.filter((w) => pending <= w.limit);
    waiters = waiters.filter((w) => pending > w.limit);
    for (const w of ready) w.resolve();
    pump(lane);
  };
  post(`{"commands":[${cmds.join(",")}]}`).then((text) => {
    const replies = (JSON.parse(text) as { replies?: { error?: { code: number; message: string } }[] }).replies ?? [];
    const errors = replies.filter((r) => r.error !== undefined);
    if (replies.length !== cmds.length || errors.length > 0) fail(Math.max(errors.length, cmds.length - replies.length), JSON.stringify(errors[0]?.error ?? "replies missing"));
    done();
  }, (err: unknown) => {
    fail(cmds.length, err instanceof Error ? err.message : String(err));
    done();
  });
}

/** Queues one entry to user `u<u>`: stamped now, published by its lane's next request. */
function emit(u: number): void {
  const b64 = Buffer.from(stampedBody(nextId()).buffer).toString("base64");
  const lane = lanes[u % LANES]!;
  lane.queue.push(`{"publish":{"channel":"user:u${u}","b64data":"${b64}"}}`);
  pending++;
  pump(lane);
}

/** Waits until at most `limit` entries are queued or in flight (0: everything answered). */
const settle = (limit = 0) => (pending <= limit ? Promise.resolve() : new Promise<void>((resolve) => waiters.push({ limit, resolve })));

await serveProducer({ emit, settle, maxPending: MAX_PENDING });
