/**
 * The operator console, read-only: `GET /admin/` (the page, its stylesheet and script) and
 * `GET /admin/api/state` (what it shows) on the device port, only when JETGATE_ADMIN_TOKEN is set;
 * the state needs it as a bearer token (the page asks for it and keeps it for the browser tab).
 *
 * The state is the registry as this gateway follows it, each shard stream's head, the lease
 * holders, and what every gateway and worker answers on `jetgate.ops.stats`. It is read once per
 * STATE_TTL_MS however many tabs poll it, each dependency read has a deadline (what did not answer
 * is named in `down`, the rest is shown), and wrong tokens are throttled per client address.
 */
import type * as Uws from "uWebSockets.js";
import type { JetStreamManager, StreamInfo } from "@nats-io/jetstream";
import { z } from "zod";
import {
  MAX_EPOCH,
  idProblem,
  MAX_OFFSET,
  bigintsAsStrings,
  shardStream,
  systemClock,
  type Clock,
  type Config,
  type RedisKeys,
} from "../../protocol/index.js";
import { ProcessStatsSchema, collectStats, type RedisClient, type RegistryClient } from "../../protocol/io/index.js";
import type { NatsConnection } from "@nats-io/transport-node";
import { FailedAuthThrottle, bearerMatches } from "./bearer.js";
import { ADMIN_CSS, ADMIN_HTML, ADMIN_JS } from "./admin-page.js";

/** How long the console waits for processes' stats answers. */
const STATS_WAIT_MS = 500;
/** Deadline of each other dependency read (stream heads from NATS, lease holders from Redis). */
const READ_DEADLINE_MS = 1500;
/** One state serves every poll within this long (tabs poll every 2 s). */
const STATE_TTL_MS = 1500;

const StreamHeadSchema = z.object({
  shard: z.number().int(),
  /** Offsets in the stream now: first and last (0 when empty). */
  first: z.number().int(),
  last: z.number().int(),
  messages: z.number().int(),
  error: z.string().optional(),
});

/** A dependency read that did not answer in time or failed; the page shows it, and the rest. */
const DownSchema = z.object({ dependency: z.enum(["nats", "redis"]), what: z.string(), error: z.string() });

/** The state's shape: what the page reads, and what a test checks the endpoint against. */
export const AdminStateSchema = z.object({
  at: z.number().int(),
  gateway: z.string(),
  limits: z.object({ maxEpoch: z.number().int(), maxOffset: z.string() }),
  registry: z.object({ record: z.number().int(), shards: z.array(z.unknown()) }),
  streams: z.array(StreamHeadSchema),
  leases: z.record(z.string(), z.string().nullable()),
  processes: z.array(ProcessStatsSchema),
  /** Process answers not shown: unsigned or wrongly signed (JETGATE_OPS_KEY), too large, unreadable. */
  replies: z.object({ unverified: z.number().int(), tooLarge: z.number().int(), invalid: z.number().int() }),
  down: z.array(DownSchema),
});
export type AdminState = z.output<typeof AdminStateSchema>;

export interface AdminSource {
  gatewayId: string;
  nc: NatsConnection;
  jsm: () => Promise<JetStreamManager>;
  redis: RedisClient;
  keys: RedisKeys;
  registry: RegistryClient;
  /** JETGATE_OPS_KEY: process answers must be signed with one of these. */
  opsKeys?: readonly Uint8Array[];
  /** The user lookup (gateway/http/users-api.ts's lookupUser): position, live sessions, newest entries. */
  lookupUser?: (user: string) => Promise<unknown>;
}

class DeadlineError extends Error {
  override readonly name = "DeadlineError";
}

function withDeadline<T>(p: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    p,
    new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new DeadlineError(`no answer in ${ms} ms`)), ms))),
  ]).finally(() => clearTimeout(timer));
}

/**
 * Every shard stream's info in pages (one request per 256 streams), not one request per shard: at
 * 512 shards a poll was 512 requests, and ten tabs cost nats-server 3 s of CPU per 20 s.
 */
async function streamInfos(jsm: JetStreamManager): Promise<Map<string, StreamInfo>> {
  const out = new Map<string, StreamInfo>();
  for await (const info of jsm.streams.list()) out.set(info.config.name, info);
  return out;
}

export async function adminState(src: AdminSource): Promise<AdminState> {
  const shards = [...src.registry.state.shards.values()].sort((a, b) => a.shard - b.shard);
  const down: z.input<typeof DownSchema>[] = [];
  const failed = (dependency: "nats" | "redis", what: string) => (err: unknown) => {
    down.push({ dependency, what, error: (err as Error).message });
    return undefined;
  };
  const [infos, holders, stats] = await Promise.all([
    withDeadline(src.jsm().then(streamInfos), READ_DEADLINE_MS).catch(failed("nats", "stream heads")),
    shards.length === 0 ? Promise.resolve([] as (string | null)[]) : withDeadline(src.redis.mget(...shards.map((s) => src.keys.lease(s.shard))), READ_DEADLINE_MS).catch(failed("redis", "lease holders")),
    collectStats(src.nc, STATS_WAIT_MS, src.opsKeys).catch(failed("nats", "process stats")),
  ]);
  const streams = shards.map((s) => {
    const info = infos?.get(shardStream(s.shard));
    if (info === undefined) return { shard: s.shard, first: 0, last: 0, messages: 0, error: infos === undefined ? "NATS did not answer" : "no such stream" };
    return { shard: s.shard, first: info.state.first_seq, last: info.state.last_seq, messages: info.state.messages };
  });
  return {
    at: Date.now(),
    gateway: src.gatewayId,
    limits: { maxEpoch: MAX_EPOCH, maxOffset: MAX_OFFSET.toString() },
    // the registry's own JSON form: seqs as decimal strings
    registry: { record: src.registry.state.seq, shards: JSON.parse(JSON.stringify(shards, bigintsAsStrings)) as unknown[] },
    streams,
    leases: Object.fromEntries(shards.map((s, i) => [String(s.shard), holders?.[i] ?? null])),
    processes: stats?.processes ?? [],
    replies: stats?.dropped ?? { unverified: 0, tooLarge: 0, invalid: 0 },
    down,
  };
}

/** One state per STATE_TTL_MS, shared by every poll (the first one reads, the others wait for it). */
export function sharedState(read: () => Promise<AdminState>, ttlMs = STATE_TTL_MS, clock: Pick<Clock, "monotonic"> = systemClock): () => Promise<AdminState> {
  let last: { at: number; state: Promise<AdminState> } | undefined;
  return () => {
    const now = clock.monotonic();
    if (last !== undefined && now - last.at < ttlMs) return last.state;
    const state = read();
    last = { at: now, state };
    state.catch(() => (last = undefined));
    return state;
  };
}

const SECURITY_HEADERS: [string, string][] = [
  ["x-content-type-options", "nosniff"],
  ["x-frame-options", "DENY"],
  ["referrer-policy", "no-referrer"],
  ["cache-control", "no-store"],
];
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/** The console's routes; without JETGATE_ADMIN_TOKEN they answer 404 and say how to turn it on. */
export function serveAdmin(app: Uws.TemplatedApp, config: Config, src: AdminSource, clientAddress: (res: Uws.HttpResponse, req: Uws.HttpRequest) => string): void {
  const token = config.JETGATE_ADMIN_TOKEN;
  const state = sharedState(() => adminState(src));
  const throttle = new FailedAuthThrottle();
  const off = (res: Uws.HttpResponse): void => void res.writeStatus("404 Not Found").writeHeader("content-type", "text/plain").end("the console is off: set JETGATE_ADMIN_TOKEN\n");
  const file = (type: string, body: string) => (res: Uws.HttpResponse): void => {
    if (token === undefined) return off(res);
    res.writeHeader("content-type", type).writeHeader("content-security-policy", CSP);
    for (const [k, v] of SECURITY_HEADERS) res.writeHeader(k, v);
    res.end(body);
  };
  app.get("/admin", (res) => void res.writeStatus("301 Moved Permanently").writeHeader("location", "/admin/").end());
  // the page holds no data; it asks for the token and reads /admin/api/state with it
  app.get("/admin/", file("text/html; charset=utf-8", ADMIN_HTML));
  app.get("/admin/app.css", file("text/css; charset=utf-8", ADMIN_CSS));
  app.get("/admin/app.js", file("text/javascript; charset=utf-8", ADMIN_JS));
  /** An API route of the console: the admin token (wrong ones throttled per client), then `answer`. */
  const api = (path: string, answer: (req: Uws.HttpRequest) => { status: string; body: unknown } | Promise<unknown>) =>
    app.get(path, (res, req) => {
      if (token === undefined) return off(res);
      const json = (status: string, body: unknown, extra: [string, string][] = []): void =>
        void res.cork(() => {
          res.writeStatus(status).writeHeader("content-type", "application/json");
          for (const [k, v] of [...SECURITY_HEADERS, ...extra]) res.writeHeader(k, v);
          res.end(`${JSON.stringify(body)}\n`);
        });
      const client = clientAddress(res, req);
      const now = Date.now();
      // the right token is served whatever its address sent before (it has 96 bits in production)
      if (!bearerMatches(req.getHeader("authorization"), token)) {
        const wait = throttle.waitS(client, now);
        if (wait > 0) return json("429 Too Many Requests", { error: `too many wrong tokens from this address: try again in ${wait} s` }, [["retry-after", String(wait)]]);
        throttle.failed(client, now);
        return json("401 Unauthorized", { error: "missing or wrong bearer token (JETGATE_ADMIN_TOKEN)" });
      }
      const a = answer(req);
      if (!(a instanceof Promise)) return json(a.status, a.body);
      let aborted = false;
      res.onAborted(() => (aborted = true));
      a.then(
        (body) => aborted || json("200 OK", body),
        (err: unknown) => aborted || json("503 Service Unavailable", { error: `cannot read it: ${(err as Error).message}` }, [["retry-after", "2"]]),
      );
    });
  api("/admin/api/state", () => state());
  api("/admin/api/user/:user", (req) => {
    const user = req.getParameter(0) ?? "";
    const bad = idProblem("user", user);
    if (bad !== undefined) return { status: "400 Bad Request", body: { error: `user id ${bad}` } };
    if (src.lookupUser === undefined) return { status: "404 Not Found", body: { error: "the user lookup is not served by this gateway" } };
    return src.lookupUser(user);
  });
}
