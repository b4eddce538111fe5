/**
 * The ceiling of the WebSocket layer: a bare uWebSockets.js server that sends jetgate's MSGS frames
 * from memory, as fast as backpressure allows, to devices that AUTH with their user id. No NATS,
 * no Redis, no schema checks: whatever jetgate delivers per core can be compared with this.
 *
 *   node --import tsx bench/compare/uws-limit-server.ts <port> <index>
 * (`index`: this server's among --nodes N, for entry ids unique over the run: bench/compare/entries.ts)
 * Commands on stdin (JSON lines), answers on stdout:
 *   {"cmd":"send","seconds":S}            as fast as possible for S seconds, to random users -> {"sent":N}
 *   {"cmd":"send","seconds":S,"rate":R}   R entries/s for S seconds                           -> {"sent":N}
 *   {"cmd":"each","perUser":K}            K entries to every user: now to a connected device, at
 *                                         its next AUTH (before SYNCED) to one that is offline
 */
import { createInterface } from "node:readline";
import { encodeEntry, encodeFrame, encodeMsgsFrame } from "../../protocol/index.js";
import { listenBare, type BareSocket } from "./bare-ws.js";
import { BODY_BYTES, idSource } from "./entries.js";
import { pace } from "./pace.js";

const port = Number(process.argv[2]);
const nextId = idSource(Number(process.argv[3] ?? 0));
const HIGH_WATER = 256 * 1024;

interface Conn {
  ws: BareSocket;
  /** Entries waiting for the socket to drain. */
  queue: number;
  /** Missed entries still to send before SYNCED. */
  missed: number;
  live: boolean;
}

const byUser = new Map<string, Conn[]>();
const users: string[] = [];
const known = new Set<string>();
/** Entries kept for users who were offline when they were sent. */
const pending = new Map<string, number>();
let seq = 0;

// One frame, encoded once; each send writes the current time and a new id into its body.
const marker = new Uint8Array(BODY_BYTES).fill(0xab);
const template = encodeMsgsFrame(0, [encodeEntry({ seq: 1n << 40n, id: "x0000000", lane: "default", prev: null, ts: Date.now(), b: marker })]);
const stampAt = Buffer.from(template).indexOf(Buffer.from(marker));
const frame = new Uint8Array(template);
const stamp = new DataView(frame.buffer, frame.byteOffset + stampAt, 16);

/** Sends one entry unless the socket is over its high water mark; false when it is. */
function sendOne(c: Conn): boolean {
  if (c.ws.getBufferedAmount() > HIGH_WATER) return false;
  stamp.setFloat64(0, performance.timeOrigin + performance.now());
  stamp.setFloat64(8, nextId());
  seq++;
  c.ws.send(frame, true);
  return true;
}

/** Sends what waits (missed entries, then queued live ones) while the socket takes it. */
function flush(c: Conn): void {
  while (c.missed > 0 && sendOne(c)) c.missed--;
  if (c.missed > 0) return;
  if (!c.live) {
    c.live = true;
    c.ws.send(encodeFrame({ t: "SYNCED", seq: BigInt(seq) }), true);
  }
  while (c.queue > 0 && sendOne(c)) c.queue--;
}

listenBare(port, byUser, {
  auth: (ws, user, first) => {
    const c: Conn = { ws, queue: 0, missed: first ? (pending.get(user) ?? 0) : 0, live: false };
    if (first) pending.delete(user);
    if (!known.has(user)) {
      known.add(user);
      users.push(user);
    }
    flush(c);
    return c;
  },
  drain: flush,
});
process.stdout.write(JSON.stringify({ listening: port }) + "\n");

/** One entry to a random user: to each of its live connections. */
function toRandomUser(): void {
  for (const c of byUser.get(users[Math.floor(Math.random() * users.length)]!) ?? []) {
    if (!c.live) continue;
    if (c.queue > 0 || !sendOne(c)) c.queue++;
  }
}

async function sendFor(seconds: number, rate: number | undefined): Promise<number> {
  const until = performance.now() + seconds * 1000;
  let sent = 0;
  if (rate === undefined) {
    while (performance.now() < until) {
      for (let i = 0; i < 1000; i++) toRandomUser();
      sent += 1000;
      await new Promise((r) => setImmediate(r)); // let the sockets write and drain
    }
    return sent;
  }
  return pace(seconds, rate, (n) => {
    for (let i = 0; i < n; i++) toRandomUser();
  });
}

for await (const line of createInterface({ input: process.stdin })) {
  const cmd = JSON.parse(line) as { cmd: string; seconds?: number; rate?: number; perUser?: number };
  if (cmd.cmd === "send") process.stdout.write(JSON.stringify({ sent: await sendFor(cmd.seconds ?? 10, cmd.rate) }) + "\n");
  else if (cmd.cmd === "each") {
    const k = cmd.perUser ?? 0;
    for (const user of users) {
      const live = (byUser.get(user) ?? []).filter((c) => c.live);
      for (const c of live) {
        c.queue += k;
        flush(c);
      }
      if (live.length === 0) pending.set(user, (pending.get(user) ?? 0) + k);
    }
    process.stdout.write(JSON.stringify({ each: k }) + "\n");
  } else if (cmd.cmd === "exit") process.exit(0);
}
