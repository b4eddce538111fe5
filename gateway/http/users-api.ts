/**
 * What a backend can ask about a user, beside appending (docs/server-api.md): end the user's
 * sessions, revoke tokens, see which devices are online, read the mailbox's position. On the
 * device port, with the dispatch API's service token; every request body and path id is checked
 * with zod; each answer is one of the shapes the OpenAPI document lists (gateway/http/users-openapi.ts).
 *
 * Disconnect, revoke and presence are asked of every gateway over NATS (gateway/http/control.ts) and
 * answered with how many gateways answered of how many there were to ask, and `partial` unless all
 * of them did (gateway/http/roster.ts), so a backend can tell a partial answer from a whole one. A revocation is written to Redis first: if Redis does not take it, the
 * call fails (503) and nothing else happens, so a backend that retries never leaves gateways
 * refusing tokens Redis does not know of (a gateway started later would accept them).
 */
import type * as Uws from "uWebSockets.js";
import type { NatsConnection } from "@nats-io/transport-node";
import type { Logger } from "pino";
import { z } from "zod";
import { GATEWAY_LIVENESS, CONTROL_SUBJECTS, idProblem, seqLabel, type Config, type MailboxSeq, type RedisKeys, SERVICE_SCOPES, type ServiceScope } from "../../protocol/index.js";
import { scripted, type RedisClient, type CursorSigner } from "../../protocol/io/index.js";
import type { Admission, ServiceAuth } from "./service-auth.js";
import { issueField } from "./dispatch-body.js";
import {
  DisconnectMode,
  ReasonSchema,
  PresenceRequestSchema,
  type ControlReply,
  type PresentSession,
} from "./control.js";
import type { GatewayMetrics } from "../metrics.js";
import type { ShardBounds } from "../mailbox/auth-decision.js";
import type { MailboxSource, RegistryView, Watermarks } from "../ports.js";
import { TokenBucket } from "../rate-limit.js";
import { answeredOf, askGateways, type NatsRoster } from "./roster.js";
import { UnavailableError } from "../mailbox/gather.js";
import { BadPositionError, DEFAULT_PAGE_ENTRIES, MAX_PAGE_ENTRIES, decodePosition, lastEntries, readPage } from "../mailbox/page.js";
import { defaultIssuedBefore, issuedBeforeProblem, revocationExpiry, type Revocation } from "../hub/revocations.js";
import type { RevocationStore } from "../hub/revocation-sync.js";

/** Largest request body of this API (a presence request for 100 users of 64 characters is about 7 KiB). */
export const MAX_USERS_API_BODY = 16 * 1024;
/** How long a call waits for the gateways' answers. */
const ASK_WAIT_MS = 1000;

const reason = ReasonSchema;

export const DisconnectBodySchema = z
  .object({
    /** One device's sessions only; all of the user's when left out. */
    device: z.string().optional(),
    /** `signed_out`: closed with 4403, the SDK stops. `reconnect`: closed with 4300, the SDK reconnects at once with a fresh token. */
    mode: DisconnectMode,
    /** The WebSocket close reason the device gets. */
    reason,
  })
  .strict();

export const RevokeBodySchema = z
  .object({
    /** One device's tokens only (the device id its sessions AUTH with, which a token's `dev` claim binds); all of the user's when left out. */
    device: z.string().optional(),
    /**
     * Tokens whose `iat` is below this (unix seconds) are refused; at most 60 s ahead. Default: the
     * second after the call's (a token minted in the call's second is covered). A token without `iat` is refused too.
     */
    issued_before: z.number().int().min(0).optional(),
    /** How the live sessions holding such a token end (default `signed_out`). */
    mode: DisconnectMode.optional(),
    reason,
  })
  .strict();

export const PresenceBodySchema = PresenceRequestSchema.strict();

const GatewaysAnswered = z.object({
  /** Gateways that answered. */
  answered: z.number().int().min(0),
  /** Gateways there were to ask: heard beating on NATS within 5 s (this one included), or beating in Redis. */
  live: z.number().int().min(0),
  /**
   * True when the answer may be missing a gateway's part: one of them did not answer within 1 s,
   * Redis's beat set could not be read (a gateway cut off from NATS is known only there), or this
   * gateway started less than 2 s ago. False only when every gateway there was to ask answered.
   */
  partial: z.boolean(),
});
type GatewaysAnsweredJson = z.output<typeof GatewaysAnswered>;

export const EndedAnswerSchema = z.object({ user: z.string(), device: z.string().optional(), ended: z.number().int().min(0), gateways: GatewaysAnswered });
export const RevokedAnswerSchema = EndedAnswerSchema.extend({
  /** The revocation in force (a later `issued_before` recorded earlier wins). */
  issued_before: z.number().int(),
  /** When it is forgotten (unix ms): no token it covers can be accepted by then (a later expiry recorded earlier wins). */
  expires_at: z.number().int(),
});
export const PresenceAnswerSchema = z.object({
  /** Every user asked about, with its live sessions (an empty list: none). */
  users: z.record(z.string(), z.array(z.object({ device: z.string(), gateway: z.string(), since: z.number().int() }))),
  gateways: GatewaysAnswered,
});
const SeqJson = z.string().regex(/^\d{1,20}$/);
export const MailboxInfoSchema = z.object({
  user: z.string(),
  shard: z.number().int().min(0),
  epoch: z.number().int().min(0),
  log: z.string(),
  /** The user's newest seq over all lanes ("0": none), a decimal string; `head_label` as epoch:offset. */
  head: SeqJson,
  head_label: z.string(),
  /** Newest seq per lane (lanes Redis lost come back from the stream). */
  lanes: z.record(z.string(), SeqJson),
  /** Seq of the newest entry retention removed from the shard ("0": none): a cursor at or below it is expired. */
  trim: SeqJson,
});
export const EntriesQuerySchema = z
  .object({
    /** The `next` of the previous page; left out: from the mailbox's start. */
    next: z.string().max(1000).optional(),
    /** Entries per page (default 100). */
    limit: z.coerce.number().int().min(1).max(MAX_PAGE_ENTRIES).optional(),
    /** One lane's entries only. */
    lane: z.string().max(32).optional(),
  })
  .strict();
export const EntriesPageSchema = z.object({
  case: z.enum(["fresh", "normal", "rebased", "rebased_new_log", "split", "expired", "invalid"]),
  reason: z.string().optional(),
  trim: SeqJson.optional(),
  entries: z.array(z.object({ seq: SeqJson, id: z.string(), lane: z.string(), ts: z.number().int(), body_b64: z.string() })),
  next: z.string(),
  more: z.boolean(),
});
export const UsersApiErrorSchema = z.object({
  error: z.string(),
  field: z.string().optional(),
  /** 403 only: the scope the service token lacks. */
  scope: z.enum(SERVICE_SCOPES).optional(),
});

export interface UsersApiDeps {
  config: Config;
  nc: NatsConnection;
  redis: RedisClient;
  keys: RedisKeys;
  revocationStore: Pick<RevocationStore, "write">;
  registry: RegistryView;
  mailbox: MailboxSource;
  cursors: CursorSigner;
  metrics: GatewayMetrics;
  /** The gateways heard on NATS: whom a call waits for. */
  roster: Pick<NatsRoster, "live" | "warm">;
  /** JETGATE_DEPENDENCY_TIMEOUT_MS: the longest a read of Redis or the streams may take before the answer is 503. */
  timeoutMs: number;
  log: Logger;
  /** Where the audit lines go (one per call made with one of this gateway's service tokens), whatever JETGATE_LOG_LEVEL keeps of the rest. */
  audit: Logger;
}

/** An answer, and what the audit line says of the call beside its route, user and outcome. */
type Answer = { status: string; body: unknown; headers?: Record<string, string>; audit?: Record<string, unknown> };

class ApiError extends Error {
  constructor(
    readonly status: string,
    message: string,
    readonly field?: string,
    readonly headers?: Record<string, string>,
    readonly scope?: ServiceScope,
  ) {
    super(message);
  }
}

/**
 * Serves the users API on `app`. `auth` admits each call by its service token and the route's
 * scope, counting wrong tokens per client address (`clientAddress`) with the dispatch API's.
 * Every call made with one of the gateway's tokens, served or not, leaves one audit line (the
 * token's name, the route, the user, the client address, the outcome) and is counted by name.
 */
export function serveUsersApi(app: Uws.TemplatedApp, d: UsersApiDeps, clientAddress: (res: Uws.HttpResponse, req: Uws.HttpRequest) => string, auth: ServiceAuth): void {
  const bucket = new TokenBucket(d.config.JETGATE_USERS_API_RATE_PER_S, d.config.JETGATE_USERS_API_RATE_PER_S, Date.now());
  const route = (method: "get" | "post", path: string, scope: ServiceScope, handle: (req: { user?: string; body: unknown; query: URLSearchParams }) => Promise<Answer>) => {
    const routeName = `${method.toUpperCase()} ${path}`;
    app[method](path, (res, req) => {
      const started = Date.now();
      const authorization = req.getHeader("authorization");
      const client = clientAddress(res, req);
      const query = new URLSearchParams(req.getQuery() ?? "");
      let user = path.includes(":user") ? req.getParameter(0) : undefined;
      const declared = req.getHeader("content-length");
      let aborted = false;
      res.onAborted(() => (aborted = true));
      const admission = auth.admit(authorization, client, scope, started);
      // the name of one of this gateway's tokens, even when the call is refused (403): it is audited
      const token = admission.token;
      const done = (a: Answer) => {
        d.metrics.usersApiRequests.inc({ path, status: a.status.slice(0, 3), token });
        if (token !== "") {
          const failed = a.status.startsWith("2") ? {} : { error: (a.body as { error?: string }).error };
          d.audit.info({ token, route: routeName, user, client, status: Number(a.status.slice(0, 3)), ms: Date.now() - started, ...a.audit, ...failed }, "server api call");
        }
        if (aborted) return;
        res.cork(() => {
          res.writeStatus(a.status).writeHeader("content-type", "application/json");
          for (const [k, v] of Object.entries(a.headers ?? {})) res.writeHeader(k, v);
          res.end(JSON.stringify(a.body) + "\n");
        });
      };
      const fail = (err: unknown) => {
        if (err instanceof ApiError) {
          const body = { error: err.message, ...(err.field !== undefined ? { field: err.field } : {}), ...(err.scope !== undefined ? { scope: err.scope } : {}) };
          return done({ status: err.status, body, ...(err.headers ? { headers: err.headers } : {}) });
        }
        d.log.error({ err, route: routeName }, "users API call failed");
        done({ status: "500 Internal Server Error", body: { error: "internal error" } });
      };
      try {
        admit(d.config, admission, bucket, started);
        if (user !== undefined) user = checkId("user", pathId(user), "user");
        if (declared !== "" && Number(declared) > MAX_USERS_API_BODY) throw new ApiError("413 Payload Too Large", `request body over ${MAX_USERS_API_BODY} bytes`);
      } catch (err) {
        return fail(err);
      }
      const run = (body: unknown) => void handle({ ...(user !== undefined ? { user } : {}), body, query }).then(done, fail);
      if (method === "get") return run(undefined);
      readBody(res, (raw) => {
        if (raw === "too large") return fail(new ApiError("413 Payload Too Large", `request body over ${MAX_USERS_API_BODY} bytes`));
        let parsed: unknown;
        try {
          parsed = raw.byteLength === 0 ? {} : JSON.parse(raw.toString("utf8"));
        } catch {
          return fail(new ApiError("400 Bad Request", "the body is not JSON"));
        }
        run(parsed);
      });
    });
  };

  const lookups = userLookups(d);
  const ask = lookups.ask;
  const ended = (replies: ControlReply[]) => replies.reduce((n, r) => n + (r.ended ?? 0), 0);

  route("post", "/v1/users/:user/disconnect", "sessions", async ({ user, body }) => {
    const b = parse(DisconnectBodySchema, body);
    if (b.device !== undefined) checkId("device", b.device, "device");
    const { replies, gateways } = await ask(CONTROL_SUBJECTS.disconnect, { user, ...b });
    const n = ended(replies);
    return { status: "200 OK", body: { user: user!, ...(b.device !== undefined ? { device: b.device } : {}), ended: n, gateways }, audit: { device: b.device, mode: b.mode, ended: n } };
  });

  route("post", "/v1/users/:user/revoke", "revoke", async ({ user, body }) => {
    const b = parse(RevokeBodySchema, body);
    if (b.device !== undefined) checkId("device", b.device, "device");
    const now = Date.now();
    const problem = b.issued_before === undefined ? undefined : issuedBeforeProblem(b.issued_before, now);
    if (problem !== undefined) throw new ApiError("400 Bad Request", problem, "issued_before");
    const before = b.issued_before ?? defaultIssuedBefore(now);
    const wanted: Revocation = { user: user!, ...(b.device !== undefined ? { device: b.device } : {}), before, expires: revocationExpiry(before, now, d.config.JETGATE_JWT_MAX_LIFETIME_S) };
    let kept: Revocation;
    try {
      kept = await d.revocationStore.write(wanted, now);
    } catch (err) {
      const message = (err as Error).message;
      // a command that timed out may still run when Redis answers again: no gateway was told, and
      // the same call again is safe (a revocation keeps the later values)
      const outcome = /timed out/i.test(message) ? "it may still be recorded when Redis answers, but no gateway was told" : "nothing was revoked";
      throw new ApiError("503 Service Unavailable", `Redis did not take the revocation (${message}); ${outcome}: try again`, undefined, { "retry-after": "2" });
    }
    const { replies, gateways } = await ask(CONTROL_SUBJECTS.revoke, { ...kept, mode: b.mode ?? "signed_out", ...(b.reason !== undefined ? { reason: b.reason } : {}) });
    const n = ended(replies);
    return {
      status: "200 OK",
      body: { user: user!, ...(b.device !== undefined ? { device: b.device } : {}), ended: n, gateways, issued_before: kept.before, expires_at: kept.expires },
      audit: { device: b.device, mode: b.mode ?? "signed_out", issued_before: kept.before, ended: n },
    };
  });

  route("get", "/v1/users/:user/presence", "presence", async ({ user }) => ({ status: "200 OK", body: await lookups.presence([user!]) }));
  route("post", "/v1/presence", "presence", async ({ body }) => {
    const b = parse(PresenceBodySchema, body);
    const users = [...new Set(b.users)];
    return { status: "200 OK", body: await lookups.presence(users), audit: { users: users.length > 10 ? [...users.slice(0, 10), `... ${users.length - 10} more`] : users } };
  });

  route("get", "/v1/users/:user/entries", "read", async ({ user, query }) => {
    const q = parse(EntriesQuerySchema, Object.fromEntries(query));
    if (q.lane !== undefined && !d.config.JETGATE_LANES.includes(q.lane)) throw new ApiError("400 Bad Request", `lane: not one of this deployment's lanes (${d.config.JETGATE_LANES.join(", ")})`, "lane");
    let position;
    try {
      position = q.next === undefined ? undefined : decodePosition(d.cursors, user!, q.next);
    } catch (err) {
      if (err instanceof BadPositionError) throw new ApiError("400 Bad Request", err.message, "next");
      throw err;
    }
    try {
      const page = await within(readPage({ registry: d.registry, mailbox: d.mailbox, cursors: d.cursors }, user!, position, { limit: q.limit ?? DEFAULT_PAGE_ENTRIES, ...(q.lane !== undefined ? { lane: q.lane } : {}) }), d.timeoutMs);
      return { status: "200 OK", body: page, audit: { case: page.case, entries: page.entries.length } };
    } catch (err) {
      if (err instanceof UnavailableError) throw new ApiError("503 Service Unavailable", err.message, undefined, { "retry-after": String(Math.max(1, Math.ceil(err.retryMs / 1000))) });
      // what fails past the input checks is a read of Redis or the stream (a timeout, a lost connection)
      throw new ApiError("503 Service Unavailable", `the mailbox did not answer (${(err as Error).message})`, undefined, { "retry-after": "2" });
    }
  });

  route("get", "/v1/users/:user/mailbox", "read", async ({ user }) => {
    try {
      return { status: "200 OK", body: await lookups.mailbox(user!) };
    } catch (err) {
      if (err instanceof LookupUnavailable) throw new ApiError("503 Service Unavailable", err.message, undefined, { "retry-after": "2" });
      throw err;
    }
  });
}

/** Entries the console's user lookup shows. */
export const LOOKUP_ENTRIES = 20;

export const UserLookupSchema = z.object({
  mailbox: MailboxInfoSchema,
  presence: z.array(z.object({ device: z.string(), gateway: z.string(), since: z.number().int() })),
  gateways: GatewaysAnswered,
  /** The newest entries of the user's shard, newest last: what its devices should have received (bodies by size only). */
  entries: z.array(z.object({ seq: SeqJson, seq_label: z.string(), id: z.string(), lane: z.string(), ts: z.number().int(), bytes: z.number().int() })),
});
export type UserLookup = z.output<typeof UserLookupSchema>;

/** The console's user lookup: the mailbox's position, the live sessions, the newest entries. */
export async function lookupUser(d: Pick<UsersApiDeps, "nc" | "redis" | "keys" | "registry" | "mailbox" | "roster" | "timeoutMs">, user: string): Promise<UserLookup> {
  const l = userLookups(d);
  const [mailbox, presence, entries] = await Promise.all([l.mailbox(user), l.presence([user]), within(lastEntries(d, user, LOOKUP_ENTRIES), d.timeoutMs)]);
  return {
    mailbox, presence: presence.users[user] ?? [], gateways: presence.gateways,
    entries: entries.map((e) => ({ seq: e.seq.toString(), seq_label: seqLabel(e.seq), id: e.id, lane: e.lane, ts: e.ts, bytes: e.b.byteLength })),
  };
}

/** A dependency did not answer a lookup. */
export class LookupUnavailable extends Error {}

/**
 * A read that has not answered within JETGATE_DEPENDENCY_TIMEOUT_MS fails (a read made of several
 * Redis or stream round trips could otherwise take a timeout for each); it changes nothing, so
 * leaving it to finish unseen is harmless.
 */
function within<T>(p: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new LookupUnavailable(`no answer within ${ms} ms (JETGATE_DEPENDENCY_TIMEOUT_MS)`)), ms);
  });
  p.catch(() => undefined);
  return Promise.race([p, late]).finally(() => clearTimeout(timer));
}

/** What the users API and the console's user lookup both read. */
export function userLookups(d: Pick<UsersApiDeps, "nc" | "redis" | "keys" | "registry" | "mailbox" | "roster" | "timeoutMs">) {
  const redis = scripted(d.redis);
  /** The gateways beating in Redis within the liveness window; null when Redis did not say. */
  const redisLive = async (): Promise<string[] | null> => {
    try {
      const [now, ...rest] = await redis.jgGatewaysSeen(d.keys.gateways());
      const out: string[] = [];
      for (let i = 0; i + 1 < rest.length; i += 2) if (Number(rest[i + 1]) >= Number(now) - GATEWAY_LIVENESS.liveWithinS) out.push(rest[i]!);
      return out;
    } catch {
      return null;
    }
  };
  const ask = async (subject: string, body: unknown): Promise<{ replies: ControlReply[]; gateways: GatewaysAnsweredJson }> => {
    const g = await askGateways(d.nc, subject, body, { expected: d.roster.live(), redisLive: redisLive(), maxWaitMs: ASK_WAIT_MS });
    return { replies: g.replies, gateways: answeredOf(g, d.roster.warm()) };
  };
  return {
    ask,
    async presence(users: readonly string[]): Promise<z.output<typeof PresenceAnswerSchema>> {
      const { replies, gateways } = await ask(CONTROL_SUBJECTS.presence, { users });
      const out: Record<string, Omit<PresentSession, "user">[]> = Object.fromEntries(users.map((u) => [u, []]));
      for (const r of replies) for (const s of r.sessions ?? []) out[s.user]?.push({ device: s.device, gateway: r.gateway, since: s.since });
      for (const list of Object.values(out)) list.sort((a, b) => a.since - b.since || a.device.localeCompare(b.device));
      return { users: out, gateways };
    },
    async mailbox(user: string): Promise<z.output<typeof MailboxInfoSchema>> {
      const shard = d.registry.shards.shardOf(user);
      const s = shard === undefined ? undefined : d.registry.state.shards.get(shard);
      if (shard === undefined || s === undefined) throw new LookupUnavailable("no active shard owns this user in the registry (is it loaded?)");
      let wm: Watermarks;
      let bounds: ShardBounds;
      try {
        [wm, bounds] = await within(Promise.all([d.mailbox.watermarks(shard, user), d.mailbox.bounds(shard)]), d.timeoutMs);
      } catch (err) {
        throw new LookupUnavailable(`the mailbox did not answer (${(err as Error).message})`);
      }
      const str = (v: MailboxSeq) => v.toString();
      return {
        user, shard, epoch: s.epoch, log: s.log, head: str(wm.head), head_label: seqLabel(wm.head),
        lanes: Object.fromEntries([...wm.lanes].map(([l, v]) => [l, str(v)])), trim: str(bounds.trim),
      };
    },
  };
}

/**
 * The service token's admission (503 without any token, 429 for an address held off for wrong
 * ones, 401 for a wrong one, 403 without the route's scope), then the rate (429).
 */
function admit(config: Config, a: Admission, bucket: TokenBucket, now: number): void {
  if (!a.ok) throw new ApiError(a.status, a.error, undefined, a.retryAfterS !== undefined ? { "retry-after": String(a.retryAfterS) } : undefined, a.scope);
  if (!bucket.take(now)) throw new ApiError("429 Too Many Requests", `over JETGATE_USERS_API_RATE_PER_S (${config.JETGATE_USERS_API_RATE_PER_S}) requests per second on this gateway`, undefined, { "retry-after": "1" });
}

function checkId(kind: "user" | "device", value: string, field: string): string {
  const p = idProblem(kind, value);
  if (p !== undefined) throw new ApiError("400 Bad Request", `${kind} id ${p}`, field);
  return value;
}

/** A path segment, percent-decoded (ids never need it, but a client may encode anyway). */
function pathId(segment: string): string {
  try {
    return decodeURIComponent(segment);
  } catch {
    throw new ApiError("400 Bad Request", "user id is not valid percent-encoding", "user");
  }
}

function parse<T>(schema: z.ZodType<T>, body: unknown): T {
  const r = schema.safeParse(body);
  if (r.success) return r.data;
  const issue = r.error.issues[0]!;
  const field = issueField(issue);
  throw new ApiError("400 Bad Request", `${field === "" ? "body" : field}: ${issue.message}`, field === "" ? undefined : field);
}

/** The request body, at most MAX_USERS_API_BODY bytes (copied: uWS reuses a chunk's memory). */
function readBody(res: Uws.HttpResponse, done: (raw: Buffer | "too large") => void): void {
  const chunks: Buffer[] = [];
  let size = 0;
  let over = false;
  res.onData((chunk, isLast) => {
    if (over) return;
    size += chunk.byteLength;
    if (size > MAX_USERS_API_BODY) {
      over = true;
      return done("too large");
    }
    chunks.push(Buffer.from(new Uint8Array(chunk)));
    if (isLast) done(Buffer.concat(chunks));
  });
}
