/**
 * The gateway a Node team would otherwise pick: Socket.IO 4.8 with the msgpack parser and the Redis
 * streams adapter, connection state recovery on. Each device joins its user's room; entries come
 * from a producer process through the adapter (bench/compare/socketio-producer.ts). After the
 * handshake (and the replay of missed packets, for a recovered session) the server emits "synced".
 *
 *   node --import tsx bench/compare/socketio-server.ts <port> <redis-urls> <cluster: true|false>
 */
import { createServer } from "node:http";
import { Server } from "socket.io";
import msgpackParser from "socket.io-msgpack-parser";
import { createAdapter } from "@socket.io/redis-streams-adapter";
import { redisOf } from "./redis-client.js";

const port = Number(process.argv[2]);
// the benchmark stops Redis before this process: errors then are expected and not worth a trace
const redis = redisOf(process.argv[3]!, process.argv[4] === "true");
redis.on("error", () => undefined);
const http = createServer();
const io = new Server(http, {
  parser: msgpackParser,
  transports: ["websocket"],
  serveClient: false,
  perMessageDeflate: false,
  connectionStateRecovery: { maxDisconnectionDuration: 10 * 60_000, skipMiddlewares: true },
  // room-sized streams: recovery replays from the stream, so it must hold every missed packet
  adapter: createAdapter(redis, { maxLen: 2_000_000, readCount: 1000 }),
});
io.on("connection", (socket) => {
  if (!socket.recovered) void socket.join(`u:${String((socket.handshake.auth as { user?: string }).user)}`);
  socket.emit("synced");
});
http.listen(port, "127.0.0.1", () => process.stdout.write(JSON.stringify({ listening: port }) + "\n"));
