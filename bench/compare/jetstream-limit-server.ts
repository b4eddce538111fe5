/**
 * The floor of any fan-out that stores every entry in JetStream on this machine: one bare ordered
 * pull consumer per shard stream (the same streams, settings and subjects jetgate uses) reads each
 * entry and sends it straight to its user's socket on a bare uWebSockets.js server. No Redis, no
 * checks, no seq work (the stream offset is the seq), no per-user chain. Devices speak the
 * uws-limit server's protocol (AUTH names the user). Entries for a user who is offline wait in
 * memory until the user's next AUTH.
 *
 *   node --import tsx bench/compare/jetstream-limit-server.ts <port> <nats url> <shards, e.g. 0,2,4>
 * With --nodes N, server k consumes shards k, k+N, ...; the benchmark connects each device to the
 * server of its user's shard.
 * Answers {"listening":port} once the consumers run.
 */
import { createInterface } from "node:readline";
import { connect } from "@nats-io/transport-node";
import { DeliverPolicy, jetstream } from "@nats-io/jetstream";
import { listenBare, type BareSocket } from "./bare-ws.js";
import { decodeStoredEntry, encodeEntry, encodeFrame, encodeMsgsFrame, parseEntrySubject, shardStream } from "../../protocol/index.js";

const [port, natsUrl, shards] = [Number(process.argv[2]), process.argv[3]!, process.argv[4]!.split(",").map(Number)];
const HIGH_WATER = 256 * 1024;

interface Conn {
  ws: BareSocket;
  /** Frames waiting for the socket to drain (or, before SYNCED, for the user's AUTH). */
  queue: Uint8Array[];
  live: boolean;
}

const byUser = new Map<string, Conn[]>();
/** Frames for users who are offline, sent at their next AUTH (before SYNCED). */
const pending = new Map<string, Uint8Array[]>();
let delivered = 0;

function flush(c: Conn): void {
  while (c.queue.length > 0 && c.ws.getBufferedAmount() <= HIGH_WATER) c.ws.send(c.queue.shift()!, true);
  if (!c.live && c.queue.length === 0) {
    c.live = true;
    c.ws.send(encodeFrame({ t: "SYNCED", seq: BigInt(delivered) }), true);
  }
}

function deliver(user: string, frame: Uint8Array): void {
  delivered++;
  const conns = byUser.get(user);
  if (conns === undefined) {
    const p = pending.get(user);
    if (p === undefined) pending.set(user, [frame]);
    else p.push(frame);
    return;
  }
  for (const c of conns) {
    if (c.live && c.queue.length === 0 && c.ws.getBufferedAmount() <= HIGH_WATER) c.ws.send(frame, true);
    else c.queue.push(frame);
  }
}

listenBare(port, byUser, {
  // what waited while the user was offline goes to its first connection
  auth: (ws, user, first) => {
    const c: Conn = { ws, queue: first ? (pending.get(user) ?? []) : [], live: false };
    if (first) pending.delete(user);
    flush(c);
    return c;
  },
  drain: flush,
  closed: (user, c, last) => {
    if (last && c.queue.length > 0) pending.set(user, c.queue);
  },
});

const nc = await connect({ servers: natsUrl.split(",") });
const js = jetstream(nc);
for (const shard of shards) {
  const consumer = await js.consumers.get(shardStream(shard), { deliver_policy: DeliverPolicy.New });
  const messages = await consumer.consume({ max_messages: 1000 });
  void (async () => {
    for await (const m of messages) {
      const subj = parseEntrySubject(m.subject);
      if (subj === undefined) continue;
      const e = decodeStoredEntry(m.data);
      deliver(subj.user, encodeMsgsFrame(shard, [encodeEntry({ seq: BigInt(m.seq), id: e.id, lane: subj.lane, prev: null, ts: e.ts, b: e.b })]));
    }
  })();
}
process.stdout.write(JSON.stringify({ listening: port }) + "\n");

for await (const line of createInterface({ input: process.stdin })) {
  if ((JSON.parse(line) as { cmd: string }).cmd === "exit") process.exit(0);
}
