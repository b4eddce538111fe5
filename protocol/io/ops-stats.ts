/**
 * What each gateway and worker says about itself to the operator console: every process answers
 * a request on `jetgate.ops.stats` with its counts, and the console collects the answers that come
 * within a short wait. No process keeps a list of the others, and none writes stats anywhere.
 *
 * Any NATS client allowed on the subject could answer too (a fake worker made the console show
 * every shard owned with lag 0), or flood it. So: NATS permissions keep the subject to jetgate's
 * own user (docs/security.md has the config); with JETGATE_OPS_KEY every answer is signed
 * (HMAC-SHA256 over the request's nonce and the answer) and the console reads only answers signed
 * with it; and the console reads at most MAX_REPLIES answers of at most MAX_REPLY_BYTES each.
 */
import { createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import { headers, type Msg, type NatsConnection, type Subscription } from "@nats-io/transport-node";
import { z } from "zod";
import { OPS_STATS_SUBJECT } from "../subjects.js";
import type { DependencyHealth } from "./health.js";

/** Header of a signed answer: hex HMAC-SHA256 of `<nonce>\n<answer>` with the first JETGATE_OPS_KEY. */
export const OPS_SIG_HEADER = "Jetgate-Sig";
/** Answers read per request (a fleet's processes, with room); the rest are not read. */
export const MAX_REPLIES = 1024;
/** Largest answer read: a worker with 4,096 shards says about 300 KB. */
export const MAX_REPLY_BYTES = 512 * 1024;
/** Longest request nonce answered (the console sends 32 hex characters). */
const MAX_NONCE_BYTES = 64;

function sign(key: Uint8Array, nonce: Uint8Array, body: Uint8Array): string {
  return createHmac("sha256", key).update(nonce).update("\n").update(body).digest("hex");
}

/** True when `msg` carries a signature of `body` for `nonce` by one of `keys`. */
function signedBy(keys: readonly Uint8Array[], nonce: Uint8Array, msg: Msg): boolean {
  const sig = msg.headers?.get(OPS_SIG_HEADER) ?? "";
  if (!/^[0-9a-f]{64}$/.test(sig)) return false;
  const got = Buffer.from(sig, "hex");
  return keys.some((k) => timingSafeEqual(got, Buffer.from(sign(k, nonce, msg.data), "hex")));
}

export const ProcessStatsSchema = z.object({
  kind: z.enum(["gateway", "worker"]),
  id: z.string().max(128),
  /** Wall-clock ms when the process started. */
  startedAt: z.number().int().min(0),
  /** jetgate_mailbox_seq_regression_total of this process (must stay 0). */
  regressions: z.number().int().min(0),
  /** Whether NATS and Redis answer its probes (protocol/io/health.ts). */
  dependencies: z.object({ nats: z.boolean(), redis: z.boolean() }),
  /** Gateways: open device connections. */
  connections: z.number().int().min(0).optional(),
  /** Workers: the shards they run, with the last offset done and the lag behind the stream. */
  shards: z.array(z.object({ shard: z.number().int().min(0), epoch: z.number().int().min(0).optional(), offset: z.number().int().min(0), lag: z.number().int().min(0).optional() })).optional(),
});
export type ProcessStats = z.output<typeof ProcessStatsSchema>;

export interface StatsSource {
  kind: ProcessStats["kind"];
  id: string;
  /** The process's jetgate_mailbox_seq_regression_total (a prom-client counter). */
  regressions: { get(): Promise<{ values: { value: number }[] }> };
  health: Pick<DependencyHealth, "answering">;
  /** What only this kind of process says. */
  extra: () => Pick<ProcessStats, "connections" | "shards">;
}

/** Answers every stats request with what the process says now, signed with the first of `keys` when given. */
export function answerStats(nc: NatsConnection, src: StatsSource, keys?: readonly Uint8Array[]): Subscription {
  const startedAt = Date.now();
  const stats = async (): Promise<ProcessStats> => ({
    kind: src.kind,
    id: src.id,
    startedAt,
    regressions: (await src.regressions.get()).values.reduce((n, v) => n + v.value, 0),
    dependencies: { nats: src.health.answering("nats"), redis: src.health.answering("redis") },
    ...src.extra(),
  });
  return nc.subscribe(OPS_STATS_SUBJECT, {
    callback: (err, msg) => {
      if (err !== null) return;
      if (msg.data.byteLength > MAX_NONCE_BYTES) return;
      stats().then(
        (s) => {
          const body = new TextEncoder().encode(JSON.stringify(s));
          if (keys === undefined || keys.length === 0) return msg.respond(body);
          const h = headers();
          h.set(OPS_SIG_HEADER, sign(keys[0]!, msg.data, body));
          msg.respond(body, { headers: h });
        },
        () => undefined,
      );
    },
  });
}

export interface CollectedStats {
  processes: ProcessStats[];
  /** Answers not taken: unsigned or wrongly signed (with `keys`), over MAX_REPLY_BYTES, not a process's stats. */
  dropped: { unverified: number; tooLarge: number; invalid: number };
}

/**
 * Every process's answer that arrives within `waitMs`, at most MAX_REPLIES of them. With `keys`
 * (JETGATE_OPS_KEY) only answers signed with one of them for this request's nonce are taken.
 */
export async function collectStats(nc: NatsConnection, waitMs: number, keys?: readonly Uint8Array[]): Promise<CollectedStats> {
  const out: ProcessStats[] = [];
  const dropped = { unverified: 0, tooLarge: 0, invalid: 0 };
  const nonce = new TextEncoder().encode(randomBytes(16).toString("hex"));
  const replies = await nc.requestMany(OPS_STATS_SUBJECT, nonce, { maxWait: waitMs, strategy: "count", maxMessages: MAX_REPLIES });
  for await (const m of replies) {
    if (m.data.byteLength > MAX_REPLY_BYTES) dropped.tooLarge++;
    else if (keys !== undefined && keys.length > 0 && !signedBy(keys, nonce, m)) dropped.unverified++;
    else {
      let parsed;
      try {
        parsed = ProcessStatsSchema.safeParse(m.json());
      } catch {
        parsed = undefined;
      }
      if (parsed?.success === true) out.push(parsed.data);
      else dropped.invalid++;
    }
  }
  return { processes: out.sort((a, b) => a.kind.localeCompare(b.kind) || a.id.localeCompare(b.id)), dropped };
}
