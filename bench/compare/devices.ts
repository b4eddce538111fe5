/**
 * The device load generator of `npm run bench`, the same for every system, run as its own process
 * (bench/compare/run.ts starts it under `ulimit -n <hard limit>`). Devices speak the system's
 * protocol: jetgate's (JWT AUTH, cursor on reconnect), the uws-limit and jetstream-limit servers' (jetgate frames, AUTH
 * names the user), Socket.IO's (socket.io-client, msgpack parser, connection state recovery) or
 * Centrifugo's (the `centrifuge` SDK over protobuf, the user's channel subscribed server-side by the
 * token's `channels` claim, recovery from history on reconnect).
 * Every entry body starts with its producer's wall-clock time and an id unique over the run
 * (bench/compare/entries.ts), so latency is measured across processes on one machine and an entry
 * a device gets twice is counted. With --nodes N the benchmark runs several generators, each with
 * its share of the devices, and merges their answers (latency histograms add up).
 *
 * Commands, one JSON object per stdin line; one JSON answer per stdout line:
 *   {"cmd":"connect","users":[..],"urls":[..],"devices"?:[..],"deadlineMs"?:D} -> {"ready":N,"ms":..,"failed":F,"refused":R}
 *                                             (these devices added to those connected before, all SYNCED /
 *                                             connected, or the deadline passed: `failed` of them gave up, `refused`
 *                                             attempts were answered 503 (at capacity); devices: each one's device id,
 *                                             "bench" when absent)
 *   {"cmd":"report"}                          -> {"received","first","last","hist","duplicates","stall_ms","gc_ms","gc_max_ms","heap_mb","cpu_wait_ms"} since the last report
 *                                             (stall_ms: the generator's longest event-loop delay: its own wait, in every latency;
 *                                             gc_ms, gc_max_ms: its GC's time and longest pause; heap_mb: its heap now;
 *                                             cpu_wait_ms: how long it waited for a CPU, runnable)
 *   {"cmd":"wait","expect":K,"deadlineMs":D}  -> {"waited_ms","timed_out"}  (each device has K entries)
 *   {"cmd":"drop"}                            -> {"dropped":N}        (sockets closed as by a network loss)
 *   {"cmd":"reconnect","expect":K,"deadlineMs":D} -> {"synced_ms","complete_ms","synced","completed","received","timed_out"}
 *   {"cmd":"exit"}
 */
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { monitorEventLoopDelay, PerformanceObserver } from "node:perf_hooks";
import WebSocket from "ws";
import { SignJWT } from "jose";
import { io as ioClient, type Socket } from "socket.io-client";
import msgpackParser from "socket.io-msgpack-parser";
import { Centrifuge } from "centrifuge/build/protobuf";
import { DEV_JWT_SECRET, decodeServerFrame, encodeFrame, unpackOne, type CursorToken } from "../../protocol/index.js";
import { readStamp, record, type Histogram } from "./entries.js";

type SystemName = "jetgate" | "uws-limit" | "jetstream-limit" | "socketio" | "centrifugo";
const system = process.argv[2] as SystemName;
const key = new TextEncoder().encode(process.env.JETGATE_JWT_SECRET ?? DEV_JWT_SECRET);
const now = () => performance.timeOrigin + performance.now();
const send = (o: object) => process.stdout.write(JSON.stringify(o) + "\n");

/**
 * Source addresses the devices connect from, in turn (127.0.0.2 ...): one address has about 28,000
 * ephemeral ports towards one server port, so 100,000 devices on one machine need several.
 */
const SOURCE_ADDRESSES = 32;
let connected = 0;
const sourceAddress = () => `127.0.0.${2 + (connected++ % SOURCE_ADDRESSES)}`;
/** Attempts answered with an HTTP status instead of an upgrade (503: the server at capacity). */
let refused = 0;
/** Set when a connect command's deadline passed: devices stop trying to connect. */
let giveUp = false;

let hist: Histogram = {};
const loopDelay = monitorEventLoopDelay({ resolution: 10 });
loopDelay.enable();
// the generator's own GC: a long pause of it is in every latency it measures, like any stall
let gcMaxMs = 0;
let gcMs = 0;
new PerformanceObserver((list) => {
  for (const e of list.getEntries()) {
    gcMs += e.duration;
    if (e.duration > gcMaxMs) gcMaxMs = e.duration;
  }
}).observe({ entryTypes: ["gc"] });
/**
 * How long the generator's main thread has waited for a CPU while it could run (Linux's
 * /proc/self/schedstat, ms; undefined elsewhere): a generator that waits for the cores while the
 * system's processes hold them delays every delivery it reads, and is not itself the bound.
 */
function runQueueWaitMs(): number | undefined {
  try {
    return Number(readFileSync("/proc/self/schedstat", "utf8").split(" ")[1]) / 1e6;
  } catch {
    return undefined;
  }
}
let waitAt = runQueueWaitMs();
let received = 0;
let duplicates = 0;
/** Connections that closed before SYNCED and were tried again. */
let retries = 0;
let first = 0;
let last = 0;

function onEntryBody(d: Device, b: Uint8Array): void {
  const t = now();
  d.received++;
  received++;
  const stamp = readStamp(b);
  if (stamp !== undefined) {
    record(hist, t - stamp.sentAt);
    if (d.seen.has(stamp.id)) duplicates++;
    else d.seen.add(stamp.id);
  }
  if (first === 0) first = t;
  last = t;
}

interface Device {
  user: string;
  /** Resolves once the device is SYNCED (connected, for Socket.IO) after the current (re)connect. */
  connect(): Promise<void>;
  drop(): void;
  /** Entries received since the last (re)connect. */
  received: number;
  /** Ids of the entries it got (an entry it gets twice is a duplicate). */
  seen: Set<number>;
}

function jetgateDevice(user: string, token: string, url: string, device: string): Device {
  const localAddress = sourceAddress();
  let ws: WebSocket | undefined;
  let cursor: CursorToken | undefined;
  let seq = 0n;
  const onMessage = (data: Buffer, synced: () => void) => {
    const bytes = new Uint8Array(data);
    // MSGS, nearly every frame, read without the SDK's schema check: the generator only counts and
    // times entries, as Socket.IO's client does with its msgpack parser. With the check (zod) it
    // spent about half its CPU validating, and at ~190k deliveries/s it was the process that bound
    // the hot scenario of every system speaking jetgate frames (bench/RESULTS.md, issue 42).
    const v = unpackOne(bytes) as { t?: unknown; e?: { seq: bigint | number; b: Uint8Array }[] };
    if (v.t === "MSGS" && Array.isArray(v.e)) {
      for (const e of v.e) {
        const s = typeof e.seq === "bigint" ? e.seq : BigInt(e.seq);
        if (s > seq) seq = s;
        onEntryBody(d, e.b);
      }
      return;
    }
    const f = decodeServerFrame(bytes);
    if (f.t === "AUTH_OK") cursor = f.cursor;
    else if (f.t === "ERROR" && f.new_cursor) cursor = f.new_cursor;
    else if (f.t === "SYNCED") synced();
  };
  /** drop() closed it: it waits for the next connect, as a device off the network does. */
  let dropped = false;
  // A connection closed before SYNCED is tried again after a short random pause, as the SDK does;
  // one the server closed after (a 4503 when a read it waited on did not answer, a 4408) comes back
  // with its cursor a little later, as the SDK does, and resumes: its entries still count
  const attempt = (resolve: () => void) => {
    let synced = false;
    ws = new WebSocket(url, { localAddress });
    ws.binaryType = "nodebuffer";
    ws.on("error", () => undefined);
    ws.on("unexpected-response", (_req, res) => {
      refused++;
      res.resume();
      ws?.terminate();
    });
    ws.on("close", () => {
      if (giveUp || dropped) return;
      if (synced) {
        setTimeout(() => attempt(() => undefined), 500 + Math.random() * 1000);
        return;
      }
      retries++;
      setTimeout(() => attempt(resolve), 100 + Math.random() * 400);
    });
    ws.on("open", () => {
      const c = cursor ? { cursor: { ...cursor, seq } } : {};
      ws!.send(encodeFrame({ t: "AUTH", v: 1, token: system === "jetgate" ? token : user, device, ...c }));
    });
    ws.on("message", (data: Buffer) =>
      onMessage(data, () => {
        synced = true;
        resolve();
      }),
    );
  };
  const d: Device = {
    user,
    received: 0,
    seen: new Set(),
    connect: () =>
      new Promise<void>((resolve) => {
        d.received = 0;
        dropped = false;
        attempt(resolve);
      }),
    drop: () => {
      dropped = true;
      ws?.terminate();
    },
  };
  return d;
}

function socketioDevice(user: string, url: string): Device {
  const localAddress = sourceAddress();
  let s: Socket | undefined;
  const d: Device = {
    user,
    received: 0,
    seen: new Set(),
    connect: () =>
      new Promise<void>((resolve, reject) => {
        d.received = 0;
        if (s === undefined) {
          // localAddress: engine.io-client hands it to `ws` in Node, though its types leave it out
          const opts = { transports: ["websocket"], parser: msgpackParser, auth: { user }, reconnection: false, localAddress };
          s = ioClient(url, opts as Parameters<typeof ioClient>[1]);
          s.on("e", (m: { b: Uint8Array }) => onEntryBody(d, m.b));
        } else s.connect(); // with the session id and offset kept: connection state recovery
        s.once("synced", () => resolve());
        s.once("connect_error", reject);
      }),
    // a transport close, as on a network loss: the server keeps the session for recovery
    drop: () => s?.io.engine.close(),
  };
  return d;
}

/**
 * A Centrifugo device: the `centrifuge` SDK (protobuf protocol, so a publication's data is its raw
 * bytes) on the `ws` package, with a connection token whose `channels` claim subscribes the user's
 * channel server-side. Connected once that subscription is subscribed (recovered, after a
 * reconnect: what was missed comes from history right after). drop() cuts the socket as a network
 * loss would and stops the SDK from reconnecting by itself until connect(); the SDK keeps the
 * subscription's offset and epoch, so the next connect recovers what was published meanwhile.
 */
function centrifugoDevice(user: string, token: string, url: string): Device {
  const localAddress = sourceAddress();
  let client: Centrifuge | undefined;
  let socket: WebSocket | undefined;
  // the SDK constructs its socket with `new`: each one is kept, so that drop() can cut it
  function TrackedSocket(address: string, protocols?: string | string[]): WebSocket {
    socket = new WebSocket(address, protocols, { localAddress });
    return socket;
  }
  const d: Device = {
    user,
    received: 0,
    seen: new Set(),
    connect: () =>
      new Promise<void>((resolve, reject) => {
        d.received = 0;
        if (client === undefined) {
          client = new Centrifuge(url, { token, websocket: TrackedSocket, timeout: 30_000 });
          client.on("publication", (ctx) => onEntryBody(d, ctx.data as Uint8Array));
          // the SDK trying again after a connection closed before it was subscribed
          client.on("connecting", (ctx) => {
            if (ctx.code !== 0) retries++;
          });
        }
        const c = client;
        const subscribed = () => {
          c.off("disconnected", disconnected);
          resolve();
        };
        const disconnected = (ctx: { code: number; reason: string }) => {
          c.off("subscribed", subscribed);
          reject(new Error(`centrifugo device ${user}: disconnected (${ctx.code} ${ctx.reason})`));
        };
        c.once("subscribed", subscribed);
        c.once("disconnected", disconnected);
        c.connect();
      }),
    drop: () => {
      socket?.terminate();
      client?.disconnect();
    },
  };
  return d;
}

const devices: Device[] = [];

/** Adds these devices and connects them; resolves with how many gave up at the deadline. */
async function connectAll(users: string[], urls: string[], ids: string[] | undefined, deadlineMs: number): Promise<number> {
  const from = devices.length;
  for (let i = 0; i < users.length; i++) {
    const user = users[i]!;
    // Centrifugo's connection token names the user's channel, subscribed server-side (bench/compare/centrifugo.ts)
    const claims = system === "centrifugo" ? { channels: [`user:${user}`] } : {};
    const token = system === "jetgate" || system === "centrifugo"
      ? await new SignJWT(claims).setProtectedHeader({ alg: "HS256" }).setSubject(user).setExpirationTime(Math.floor(Date.now() / 1000) + 86400).sign(key)
      : "";
    devices.push(system === "socketio" ? socketioDevice(user, urls[i]!)
      : system === "centrifugo" ? centrifugoDevice(user, token, urls[i]!)
      : jetgateDevice(user, token, urls[i]!, ids?.[i] ?? "bench"));
  }
  // in waves: a connection storm is its own scenario. A device that has not connected by the
  // deadline gives up (a server at its capacity answers 503 for as long as it is full): the run
  // says how many, instead of waiting for ever
  giveUp = false;
  const deadline = now() + deadlineMs;
  let failed = 0;
  for (let i = from; i < devices.length; i += 250) {
    const left = deadline - now();
    if (left <= 0) {
      failed += devices.length - i;
      break;
    }
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<"late">((r) => (timer = setTimeout(() => r("late"), left)));
    const wave = await Promise.all(devices.slice(i, i + 250).map((d) => Promise.race([d.connect().then(() => "ok" as const, () => "late" as const), late])));
    clearTimeout(timer);
    failed += wave.filter((w) => w === "late").length;
  }
  if (failed > 0) giveUp = true;
  return failed;
}

const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  const cmd = JSON.parse(line) as { cmd: string; users?: string[]; urls?: string[]; devices?: string[]; expect?: number; deadlineMs?: number };
  if (cmd.cmd === "connect") {
    const t0 = now();
    const failed = await connectAll(cmd.users!, cmd.urls!, cmd.devices, cmd.deadlineMs ?? 600_000);
    send({ ready: devices.length - failed, ms: Math.round(now() - t0), retries, failed, refused });
  } else if (cmd.cmd === "report") {
    const waited = runQueueWaitMs();
    const cpu_wait_ms = waited !== undefined && waitAt !== undefined ? Math.round(waited - waitAt) : undefined;
    waitAt = waited;
    send({ received, first, last, hist, duplicates, stall_ms: Math.round(loopDelay.max / 1e6), gc_ms: Math.round(gcMs), gc_max_ms: Math.round(gcMaxMs), heap_mb: Math.round(process.memoryUsage().heapUsed / 2 ** 20), cpu_wait_ms });
    loopDelay.reset();
    gcMs = gcMaxMs = 0;
    hist = {};
    received = duplicates = 0;
    first = last = 0;
  } else if (cmd.cmd === "wait") {
    // every device has received `expect` entries on its current connection, or the deadline passed
    // (a device the server closed for good would otherwise hold the run forever)
    const t0 = now();
    const deadline = t0 + (cmd.deadlineMs ?? 120_000);
    while (devices.some((d) => d.received < (cmd.expect ?? 0)) && now() < deadline) await new Promise((r) => setTimeout(r, 10));
    const short = devices.filter((d) => d.received < (cmd.expect ?? 0)).length;
    send({ waited_ms: Math.round(now() - t0), timed_out: short > 0, short });
  } else if (cmd.cmd === "drop") {
    for (const d of devices) d.drop();
    send({ dropped: devices.length });
  } else if (cmd.cmd === "reconnect") {
    // all at once; done when every device is SYNCED and has its `expect` missed entries, or at the
    // deadline (what was done by then is reported)
    const t0 = now();
    const expect = cmd.expect ?? 0;
    const deadline = t0 + (cmd.deadlineMs ?? 120_000);
    let synced = 0;
    let syncedAt = 0;
    for (const d of devices) {
      void d.connect().then(() => {
        if (++synced === devices.length) syncedAt = now();
      });
    }
    const completed = () => devices.filter((d) => d.received >= expect).length;
    while (now() < deadline && (synced < devices.length || completed() < devices.length)) await new Promise((r) => setTimeout(r, 5));
    const done = synced === devices.length && completed() === devices.length;
    send({
      synced_ms: syncedAt > 0 ? Math.round(syncedAt - t0) : null, complete_ms: done ? Math.round(now() - t0) : null,
      synced, completed: completed(), received: devices.reduce((n, d) => n + d.received, 0), retries, timed_out: !done, elapsed_ms: Math.round(now() - t0),
    });
  } else if (cmd.cmd === "exit") {
    process.exit(0);
  }
}
