/**
 * Device load generator, run as its own process by the gateway benchmarks (never inside the server's
 * process): N devices on real WebSockets, one user each (`<prefix><i>`), each AUTHs and stays live.
 * Every entry body starts with the sender's wall-clock time (float64 ms, timeOrigin + now), so
 * latency is measured across processes on one machine.
 *
 *   node --import tsx bench/device-load.ts <port> <devices> <userPrefix>
 * stdout: one JSON line `{"ready":N}` once all are SYNCED, then on each stdin line "report":
 * `{"received":N,"first":ms,"last":ms,"p50":ms,"p99":ms,"max":ms}` (and counters reset).
 */
import WebSocket from "ws";
import { SignJWT } from "jose";
import { DEV_JWT_SECRET, decodeServerFrame, encodeFrame } from "../protocol/index.js";

const [port, count, prefix] = [Number(process.argv[2]), Number(process.argv[3]), process.argv[4] ?? "u"];
const key = new TextEncoder().encode(process.env.JETGATE_JWT_SECRET ?? DEV_JWT_SECRET);
const now = () => performance.timeOrigin + performance.now();
let latencies: number[] = [];
let first = 0;
let last = 0;
let synced = 0;

async function device(i: number): Promise<void> {
  const user = `${prefix}${i}`;
  const token = await new SignJWT({}).setProtectedHeader({ alg: "HS256" }).setSubject(user).setExpirationTime(Math.floor(Date.now() / 1000) + 86400).sign(key);
  const ws = new WebSocket(`ws://127.0.0.1:${port}/v1/ws`);
  ws.binaryType = "nodebuffer";
  await new Promise<void>((resolve, reject) => {
    ws.once("open", resolve);
    ws.once("error", reject);
  });
  ws.on("message", (data: Buffer) => {
    const f = decodeServerFrame(new Uint8Array(data));
    if (f.t === "SYNCED" && ++synced === count) console.log(JSON.stringify({ ready: count }));
    if (f.t !== "MSGS") return;
    const t = now();
    for (const e of f.e) {
      if (e.b.byteLength < 8) continue;
      const sent = new DataView(e.b.buffer, e.b.byteOffset, 8).getFloat64(0);
      latencies.push(t - sent);
      if (first === 0) first = t;
      last = t;
    }
  });
  ws.send(encodeFrame({ t: "AUTH", v: 1, token, device: "bench" }));
}

for (let i = 0; i < count; i += 100) await Promise.all(Array.from({ length: Math.min(100, count - i) }, (_, j) => device(i + j)));

process.stdin.setEncoding("utf8");
process.stdin.on("data", (line: string) => {
  if (line.includes("report")) {
    const sorted = latencies.sort((a, b) => a - b);
    const q = (p: number) => Number((sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))] ?? 0).toFixed(2));
    console.log(JSON.stringify({ received: sorted.length, first, last, p50: q(0.5), p99: q(0.99), max: q(1) }));
    latencies = [];
    first = last = 0;
  }
  if (line.includes("exit")) process.exit(0);
});
