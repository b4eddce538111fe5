/**
 * Emits entries to users' rooms from its own process, through the Redis streams adapter: a Socket.IO
 * server that serves no connections, the documented way to emit from another process.
 *
 *   node --import tsx bench/compare/socketio-producer.ts <redis-urls> <cluster: true|false> <index>
 * Commands (JSON lines): {"cmd":"send","seconds":S,"users":N,"rate"?:R} -> {"sent":N};
 * {"cmd":"each","from":A,"to":B,"perUser":K} -> {"sent":N} (K entries to each of uA..u(B-1)).
 */
import { createInterface } from "node:readline";
import { Server } from "socket.io";
import { createAdapter } from "@socket.io/redis-streams-adapter";
import { redisOf } from "./redis-client.js";
import { idSource, stampedBody } from "./entries.js";
import { pace } from "./pace.js";

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

for await (const line of createInterface({ input: process.stdin })) {
  const cmd = JSON.parse(line) as { cmd: string; seconds?: number; users?: number; rate?: number; perUser?: number; from?: number; to?: number };
  if (cmd.cmd === "send") {
    const until = performance.now() + (cmd.seconds ?? 10) * 1000;
    let sent = 0;
    const pick = () => `u${Math.floor(Math.random() * cmd.users!)}`;
    if (cmd.rate === undefined) {
      while (performance.now() < until) {
        for (let i = 0; i < 500; i++) emit(pick());
        sent += 500;
        await settle();
      }
    } else {
      sent = await pace(cmd.seconds ?? 10, cmd.rate, (n) => {
        for (let i = 0; i < n; i++) emit(pick());
      });
    }
    await settle();
    process.stdout.write(JSON.stringify({ sent }) + "\n");
  } else if (cmd.cmd === "each") {
    let sent = 0;
    for (let k = 0; k < cmd.perUser!; k++) {
      for (let u = cmd.from!; u < cmd.to!; u++) {
        emit(`u${u}`);
        if (++sent % 500 === 0) await settle();
      }
    }
    await settle();
    process.stdout.write(JSON.stringify({ sent }) + "\n");
  } else if (cmd.cmd === "exit") process.exit(0);
}
