/**
 * The operator console, read-only: `GET /admin/` (the page) and `GET /admin/api/state` (what it
 * shows) on the device port, only when JETGATE_ADMIN_TOKEN is set; the state needs it as a bearer
 * token (the page asks for it and keeps it for the browser tab). The state is the registry as this
 * gateway follows it, each shard stream's head, the lease holders, and what every gateway and
 * worker answers on `jetgate.ops.stats` within half a second.
 */
import type * as Uws from "uWebSockets.js";
import type { JetStreamManager } from "@nats-io/jetstream";
import { z } from "zod";
import {
  MAX_EPOCH,
  MAX_OFFSET,
  ProcessStatsSchema,
  bigintsAsStrings,
  collectStats,
  shardStream,
  type Config,
  type RedisClient,
  type RedisKeys,
  type RegistryClient,
} from "../protocol/index.js";
import type { NatsConnection } from "@nats-io/transport-node";
import { bearerMatches } from "./bearer.js";
import { ADMIN_PAGE } from "./admin-page.js";

/** How long the console waits for processes' stats answers. */
const STATS_WAIT_MS = 500;

const StreamHeadSchema = z.object({
  shard: z.number().int(),
  /** Offsets in the stream now: first and last (0 when empty). */
  first: z.number().int(),
  last: z.number().int(),
  messages: z.number().int(),
  error: z.string().optional(),
});

/** The state's shape: what the page reads, and what a test checks the endpoint against. */
export const AdminStateSchema = z.object({
  at: z.number().int(),
  gateway: z.string(),
  limits: z.object({ maxEpoch: z.number().int(), maxOffset: z.string() }),
  registry: z.object({ record: z.number().int(), shards: z.array(z.unknown()) }),
  streams: z.array(StreamHeadSchema),
  leases: z.record(z.string(), z.string().nullable()),
  processes: z.array(ProcessStatsSchema),
});
export type AdminState = z.output<typeof AdminStateSchema>;

export interface AdminSource {
  gatewayId: string;
  nc: NatsConnection;
  jsm: () => Promise<JetStreamManager>;
  redis: RedisClient;
  keys: RedisKeys;
  registry: RegistryClient;
}

export async function adminState(src: AdminSource): Promise<AdminState> {
  const shards = [...src.registry.state.shards.values()].sort((a, b) => a.shard - b.shard);
  const jsm = await src.jsm();
  const [streams, holders, processes] = await Promise.all([
    Promise.all(shards.map(async (s) => {
      try {
        const st = (await jsm.streams.info(shardStream(s.shard))).state;
        return { shard: s.shard, first: st.first_seq, last: st.last_seq, messages: st.messages };
      } catch (err) {
        return { shard: s.shard, first: 0, last: 0, messages: 0, error: (err as Error).message };
      }
    })),
    shards.length === 0 ? Promise.resolve([] as (string | null)[]) : src.redis.mget(...shards.map((s) => src.keys.lease(s.shard))),
    collectStats(src.nc, STATS_WAIT_MS).catch(() => []),
  ]);
  return {
    at: Date.now(),
    gateway: src.gatewayId,
    limits: { maxEpoch: MAX_EPOCH, maxOffset: MAX_OFFSET.toString() },
    // the registry's own JSON form: seqs as decimal strings
    registry: { record: src.registry.state.seq, shards: JSON.parse(JSON.stringify(shards, bigintsAsStrings)) as unknown[] },
    streams,
    leases: Object.fromEntries(shards.map((s, i) => [String(s.shard), holders[i] ?? null])),
    processes,
  };
}

/** The console's routes; without JETGATE_ADMIN_TOKEN they answer 404 and say how to turn it on. */
export function serveAdmin(app: Uws.TemplatedApp, config: Config, src: AdminSource): void {
  const token = config.JETGATE_ADMIN_TOKEN;
  const off = (res: Uws.HttpResponse): void => void res.writeStatus("404 Not Found").writeHeader("content-type", "text/plain").end("the console is off: set JETGATE_ADMIN_TOKEN\n");
  const page = (res: Uws.HttpResponse): void => {
    if (token === undefined) return off(res);
    // the page holds no data; it asks for the token and reads /admin/api/state with it
    void res.writeHeader("content-type", "text/html; charset=utf-8").writeHeader("cache-control", "no-store")
      .writeHeader("content-security-policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:")
      .end(ADMIN_PAGE);
  };
  app.get("/admin", (res) => void res.writeStatus("301 Moved Permanently").writeHeader("location", "/admin/").end());
  app.get("/admin/", page);
  app.get("/admin/api/state", (res, req) => {
    if (token === undefined) return off(res);
    const json = (status: string, body: unknown): void => void res.cork(() => res.writeStatus(status).writeHeader("content-type", "application/json").writeHeader("cache-control", "no-store").end(`${JSON.stringify(body)}\n`));
    if (!bearerMatches(req.getHeader("authorization"), token)) return json("401 Unauthorized", { error: "missing or wrong bearer token (JETGATE_ADMIN_TOKEN)" });
    let aborted = false;
    res.onAborted(() => (aborted = true));
    adminState(src).then(
      (state) => aborted || json("200 OK", state),
      (err: unknown) => aborted || json("503 Service Unavailable", { error: `cannot read the state: ${(err as Error).message}` }),
    );
  });
}
