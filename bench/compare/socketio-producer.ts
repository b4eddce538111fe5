/**
 * Emits entries to users' rooms from its own process, through the Redis streams adapter: a Socket.IO
 * server that serves no connections, the documented way to emit from another process.
 *
 *   node --import tsx bench/compare/socketio-producer.ts <redis-urls> <cluster: true|false> <index>
 * Commands (JSON lines): {"cmd":"send","seconds":S,"users":N,"rate"?:R} -> {"sent":N};
 * {"cmd":"each","from":A,"to":B,"perUser":K} -> {"sent":N} (K entries to each of uA..u(B-1)).
 */
import { Server } from "socket.io";
import { createAdapter } from "@socket.io/redis-streams-adapter";
import { redisOf } from "./redis-client.js";
import { idSource, stampedBody } from "./entries.js";
import { serveProducer } from "./pace.js";

// the benchmark stops Redis before this process: errors then are expected and not worth a trace
const redis = redisOf(process.argv[2]!, process.argv[3] === "true");
redis.on("error", () => undefined);
const io = new Server({ connectionStateRecovery: { maxDisconnectionDuration: 10 * 60_000 }, adapter: createAdapter(redis, { maxLen: 2_000_000 }) });
const nextId = idSource(Number(process.argv[4] ?? 0));

function emit(user: string): void {
  const id = nextId();
  io.to(`u:${user}`).emit("e", { id: `x${id}`, b: stampedBody(id) });
}

/** Waits until Redis has taken everything queued so far (bounds what is in flight). */
const settle = () => redis.ping();

await serveProducer({ emit: (u) => emit(`u${u}`), settle, maxPending: 0 });
