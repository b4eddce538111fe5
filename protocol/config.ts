/**
 * Every environment setting of the gateway, the worker and the CLI, in one zod schema.
 *
 * Defaults suit a local run (`npm start`). With JETGATE_ENV=production, secrets have no defaults
 * and must be set. A bad value fails start-up with a ConfigError that names each variable and why.
 */
import { z } from "zod";
import { JetgateError } from "./errors.js";
import { idProblem } from "./ids.js";
import { MAX_BODY_BYTES } from "./frames.js";
import { WATERMARK_ALL } from "./layout.js";

export class ConfigError extends JetgateError {
  /** One line per bad variable: `NAME: reason`. */
  readonly problems: readonly string[];
  constructor(problems: readonly string[]) {
    super("CONFIG", `invalid configuration:\n  ${problems.join("\n  ")}`);
    this.problems = problems;
  }
}

const int = (min: number, max: number, def: number) =>
  z
    .string()
    .optional()
    .transform((v, ctx) => {
      if (v === undefined || v.trim() === "") return def;
      if (!/^-?\d+$/.test(v.trim())) {
        ctx.addIssue({ code: "custom", message: `must be an integer between ${min} and ${max}, got ${JSON.stringify(v)}` });
        return z.NEVER;
      }
      const n = Number(v);
      if (n < min || n > max) {
        ctx.addIssue({ code: "custom", message: `must be between ${min} and ${max}, got ${n}` });
        return z.NEVER;
      }
      return n;
    });

const bool = (def: boolean) =>
  z
    .string()
    .optional()
    .transform((v, ctx) => {
      if (v === undefined || v === "") return def;
      if (/^(1|true|yes|on)$/i.test(v)) return true;
      if (/^(0|false|no|off)$/i.test(v)) return false;
      ctx.addIssue({ code: "custom", message: `must be true or false, got ${JSON.stringify(v)}` });
      return z.NEVER;
    });

const str = (def: string) =>
  z
    .string()
    .optional()
    .transform((v) => (v === undefined || v === "" ? def : v));

const optionalStr = z
  .string()
  .optional()
  .transform((v) => (v === undefined || v === "" ? undefined : v));

const urlList = (def: string, schemes: readonly string[]) =>
  str(def).transform((v, ctx) => {
    const urls = v.split(",").map((s) => s.trim()).filter((s) => s.length > 0);
    for (const u of urls) {
      let parsed: URL;
      try {
        parsed = new URL(u);
      } catch {
        ctx.addIssue({ code: "custom", message: `not a URL: ${JSON.stringify(u)}` });
        return z.NEVER;
      }
      if (!schemes.includes(parsed.protocol)) {
        ctx.addIssue({ code: "custom", message: `scheme must be one of ${schemes.join(" ")}, got ${parsed.protocol}` });
        return z.NEVER;
      }
    }
    if (urls.length === 0) {
      ctx.addIssue({ code: "custom", message: "must name at least one URL" });
      return z.NEVER;
    }
    return urls;
  });

/** Comma-separated base64/base64url secrets, newest first. */
const keyList = z
  .string()
  .optional()
  .transform((v, ctx) => {
    if (v === undefined || v.trim() === "") return undefined;
    const keys = v.split(",").map((s) => s.trim()).filter((s) => s.length > 0);
    const out: Uint8Array[] = [];
    for (const [i, k] of keys.entries()) {
      if (!/^[A-Za-z0-9+/_-]+={0,2}$/.test(k)) {
        ctx.addIssue({ code: "custom", message: `key ${i} is not base64` });
        return z.NEVER;
      }
      const bytes = Buffer.from(k.replace(/-/g, "+").replace(/_/g, "/"), "base64");
      if (bytes.byteLength < 32) {
        ctx.addIssue({ code: "custom", message: `key ${i} decodes to ${bytes.byteLength} bytes; at least 32 are required` });
        return z.NEVER;
      }
      out.push(new Uint8Array(bytes));
    }
    return out;
  });

const lanes = str("default").transform((v, ctx) => {
  const list = v.split(",").map((s) => s.trim()).filter((s) => s.length > 0);
  for (const l of list) {
    const p = idProblem("lane", l);
    if (p !== undefined) {
      ctx.addIssue({ code: "custom", message: `lane ${p}` });
      return z.NEVER;
    }
    // the watermark hash keeps the user's head in this field: a lane of that name would share it
    if (l === WATERMARK_ALL) {
      ctx.addIssue({ code: "custom", message: `lane ${JSON.stringify(l)} is reserved (the watermark hash's field for the user's head over all lanes)` });
      return z.NEVER;
    }
  }
  if (list.length === 0) {
    ctx.addIssue({ code: "custom", message: "must name at least one lane" });
    return z.NEVER;
  }
  return [...new Set(list)];
});

const logLevel = str("info").pipe(z.enum(["fatal", "error", "warn", "info", "debug", "trace", "silent"]));

/**
 * The schema, keyed by environment variable name. Each entry documents itself in docs/config.md
 * (kept in step by a test) and in the chart's values schema.
 */
export const envSchema = z.object({
  JETGATE_ENV: str("development").pipe(z.enum(["development", "production"])),
  JETGATE_LOG_LEVEL: logLevel,

  // infrastructure
  JETGATE_NATS_URL: urlList("nats://127.0.0.1:4222", ["nats:", "tls:", "ws:", "wss:"]),
  JETGATE_NATS_USER: optionalStr,
  JETGATE_NATS_PASS: optionalStr,
  JETGATE_NATS_TOKEN: optionalStr,
  JETGATE_NATS_CREDS_FILE: optionalStr,
  JETGATE_NATS_CA_FILE: optionalStr,
  JETGATE_NATS_NKEY_SEED_FILE: optionalStr,
  JETGATE_REDIS_URL: urlList("redis://127.0.0.1:6379", ["redis:", "rediss:"]),
  JETGATE_REDIS_CLUSTER: bool(false),
  JETGATE_REDIS_CA_FILE: optionalStr,
  /** Prefix of every Redis key, so several deployments can share one Redis. */
  /** A dependency that has not answered a probe for this long makes the process not ready. */
  JETGATE_DEPENDENCY_TIMEOUT_MS: int(200, 600_000, 2000),
  JETGATE_REDIS_PREFIX: str("jg").pipe(z.string().regex(/^[A-Za-z0-9_-]{1,32}$/, "must be 1..32 of A-Z a-z 0-9 _ -")),

  // mailbox streams (used by `registry init`)
  JETGATE_SHARDS: int(1, 4096, 4),
  JETGATE_STREAM_REPLICAS: int(1, 5, 1),
  JETGATE_STREAM_MAX_AGE_S: int(60, 10 * 365 * 86400, 7 * 86400),
  /** -1: no byte limit. */
  JETGATE_STREAM_MAX_BYTES: int(-1, Number.MAX_SAFE_INTEGER, -1),
  JETGATE_DUPLICATE_WINDOW_S: int(1, 86400, 120),
  JETGATE_LANES: lanes,
  JETGATE_MAX_BODY_BYTES: int(1, MAX_BODY_BYTES, 64 * 1024),
  /** What one HTTP dispatch request may append: recipients x body bytes, over a batch's dispatches. */
  JETGATE_DISPATCH_MAX_BYTES: int(MAX_BODY_BYTES, 1024 * 1024 * 1024, 16 * 1024 * 1024),
  /** What the gateway's Dispatcher may hold queued or in flight (each entry's bytes plus 256); a request that does not fit gets 503. */
  JETGATE_DISPATCH_QUEUE_BYTES: int(1024 * 1024, 16 * 1024 * 1024 * 1024, 64 * 1024 * 1024),

  // worker
  JETGATE_WORKER_ID: optionalStr,
  JETGATE_WORKER_HTTP_PORT: int(0, 65535, 9091),
  /** Address of the health and metrics listeners (gateway and worker); the chart sets 0.0.0.0. */
  JETGATE_METRICS_HOST: str("127.0.0.1"),
  JETGATE_LEASE_MS: int(1000, 600_000, 5000),
  JETGATE_WORKER_BATCH: int(1, 10_000, 500),
  /** Ack wait of a worker's consumer (set when the worker creates it, at a takeover). */
  JETGATE_WORKER_ACK_WAIT_S: int(1, 3600, 60),
  JETGATE_HOT_CACHE_MAXLEN: int(0, 100_000, 256),
  JETGATE_HOT_CACHE_TTL_S: int(1, 30 * 86400, 86400),
  /** Dedup memory of dispatch_id:user; 0 means the stream retention (JETGATE_STREAM_MAX_AGE_S). */
  JETGATE_DEDUP_TTL_S: int(0, 10 * 365 * 86400, 0),
  /** Test-only fault hook: the worker SIGKILLs itself right after this step of a batch. */
  JETGATE_FAULT_EXIT_AFTER: str("").pipe(z.enum(["", "redis", "push"])),

  // gateway
  /** Test-only fault hook: AUTH waits this long after taking its registry view, before its reads. */
  JETGATE_FAULT_AUTH_PAUSE_MS: int(0, 60_000, 0),
  /** Test-only fault hook: the gateway applies each registry record this long after it arrives (a view that lags). */
  JETGATE_FAULT_REGISTRY_LAG_MS: int(0, 60_000, 0),
  JETGATE_GATEWAY_HOST: str("0.0.0.0"),
  JETGATE_GATEWAY_PORT: int(0, 65535, 8080),
  /** The gateway's /healthz, /readyz and /metrics: a port of their own, never the device port. */
  JETGATE_GATEWAY_METRICS_PORT: int(0, 65535, 9090),
  JETGATE_JWT_SECRET: optionalStr,
  /** During an HS256 secret rotation: the old secret, still accepted (never used to sign). */
  JETGATE_JWT_PREVIOUS_SECRET: optionalStr,
  JETGATE_JWT_PUBLIC_KEYS_FILE: optionalStr,
  /** Longest a device token may still be valid for (exp - now, and exp - iat when it has iat). */
  JETGATE_JWT_MAX_LIFETIME_S: int(60, 366 * 86400, 86400),
  /** How often a gateway reads the revocations' change log in Redis (one it missed over NATS applies within this). */
  JETGATE_REVOCATIONS_SYNC_MS: int(100, 600_000, 30_000),
  JETGATE_CURSOR_KEYS: keyList,
  /** Signs the processes' answers on jetgate.ops.stats; the console takes only signed ones when set. */
  JETGATE_OPS_KEY: keyList,
  /** The HTTP API's bearer token with every scope (named `default`); beside or instead of the tokens file. */
  JETGATE_SERVICE_TOKEN: optionalStr,
  /** Named service tokens with scopes (YAML or JSON: name, sha256, scopes, not_after), reloaded on SIGHUP or change. */
  JETGATE_SERVICE_TOKENS_FILE: optionalStr,
  /** Requests per second (and burst) this gateway takes on the users API (/v1/users/..., /v1/presence). */
  JETGATE_USERS_API_RATE_PER_S: int(1, 100_000, 200),
  /** Turns the operator console on (`/admin/`, read-only) and is the bearer token it needs. */
  JETGATE_ADMIN_TOKEN: optionalStr.pipe(z.string().min(16, "must be at least 16 characters").optional()),
  JETGATE_AUTH_TIMEOUT_MS: int(100, 120_000, 5000),
  JETGATE_HEARTBEAT_MS: int(1000, 600_000, 25_000),
  JETGATE_IDLE_TIMEOUT_S: int(8, 960, 60),
  JETGATE_MAX_PAYLOAD: int(256, 16 * 1024 * 1024, 128 * 1024),
  JETGATE_MAX_BACKPRESSURE: int(64 * 1024, 256 * 1024 * 1024, 1024 * 1024),
  JETGATE_DRAIN_MS: int(0, 600_000, 10_000),
  /** `npm start` may install redis-server with apt-get when it is missing. */
  JETGATE_START_INSTALL: bool(true),
  /** Where built tools are kept (the pinned nats-server): default `$XDG_CACHE_HOME/jetgate`, else `~/.cache/jetgate`. */
  JETGATE_CACHE_DIR: optionalStr,
  /** Where `npm start` keeps its stack (NATS and Redis data, stack.json) and the tools look for it: default `.jetgate/` in the checkout. */
  JETGATE_STACK_DIR: optionalStr,
  /** Local mode only: serve the demo page (index.html, jetgate.js) from this dir at /demo/. */
  JETGATE_DEMO_DIR: optionalStr,
  JETGATE_GATEWAY_ID: optionalStr.pipe(z.string().regex(/^[A-Za-z0-9_-]{1,64}$/, "must be 1..64 of A-Z a-z 0-9 _ -").optional()),
  JETGATE_RATE_FRAMES_PER_S: int(1, 100_000, 50),
  JETGATE_RATE_BURST: int(1, 100_000, 100),
  JETGATE_RATE_USER_FRAMES_PER_S: int(1, 1_000_000, 200),
  JETGATE_MAX_CONNS_PER_USER: int(1, 10_000, 16),
  /** Distinct devices per user with stored ACK state; the least recently active one's goes first. */
  JETGATE_MAX_DEVICES_PER_USER: int(1, 10_000, 64),
  /** Devices a gateway takes at once (more are answered 503); 0 = the open files limit less the files open at start and a reserve. */
  JETGATE_MAX_CONNECTIONS: int(0, 100_000_000, 0),
  /** Open WebSockets per client address; 0 = no limit. Carrier NAT puts many phones behind one. */
  JETGATE_MAX_CONNS_PER_IP: int(0, 1_000_000, 2000),
  /** Take the client address from the last X-Forwarded-For hop (only behind a proxy that sets it). */
  JETGATE_TRUST_FORWARDED_FOR: bool(false),
  /** Each live session compares its position with the user's head this often (0 = never). */
  JETGATE_TAIL_CHECK_S: int(0, 3600, 30),
});

export type Env = z.output<typeof envSchema>;
export const ENV_VARS = Object.keys(envSchema.shape) as (keyof Env)[];

/** Least length and estimated entropy of a production secret token (the console's, a service token). */
export const SECRET_TOKEN_MIN_LENGTH = 32;
export const SECRET_TOKEN_MIN_BITS = 96;

/**
 * Why a token is too weak to guard the console or the HTTP API in production, or undefined. Its
 * entropy is
 * estimated from its own characters (Shannon, per character, times its length): a random base64 or
 * hex string of 32 characters passes, `aaaa...` or a word repeated does not. An estimate, not a
 * proof: it only keeps out what any guesser would try first.
 */
export function tokenStrengthProblem(token: string): string | undefined {
  if (token.length < SECRET_TOKEN_MIN_LENGTH) return `must be at least ${SECRET_TOKEN_MIN_LENGTH} characters (has ${token.length})`;
  const counts = new Map<string, number>();
  for (const ch of token) counts.set(ch, (counts.get(ch) ?? 0) + 1);
  let perChar = 0;
  for (const n of counts.values()) perChar -= (n / token.length) * Math.log2(n / token.length);
  const bits = Math.floor(perChar * token.length);
  return bits < SECRET_TOKEN_MIN_BITS ? `looks guessable (about ${bits} bits from ${counts.size} distinct characters; at least ${SECRET_TOKEN_MIN_BITS} are required)` : undefined;
}

/** Development-only secrets: never used when JETGATE_ENV=production (the real ones are required). */
const DEV_CURSOR_KEY = new Uint8Array(Buffer.from("jetgate-development-cursor-key-do-not-use-in-production"));
export const DEV_JWT_SECRET = "jetgate-development-jwt-secret-do-not-use-in-production";

export interface Config extends Omit<Env, "JETGATE_CURSOR_KEYS"> {
  JETGATE_CURSOR_KEYS: Uint8Array[];
}

/** Which process reads the config: production secrets are required only where they are used. */
export type ConfigRole = "gateway" | "worker" | "tool";

/**
 * Parses the environment. Unknown JETGATE_* variables are reported too: a typo should not
 * silently leave a default in place. With JETGATE_ENV=production a gateway must have real JWT and
 * cursor keys; workers and tools (the CLI) never use them. `unreadable(path)` says why a file
 * cannot be read (an error code), undefined when it can: the process's own check is in
 * protocol/io/config-env.ts (loadConfig).
 */
export function parseConfig(env: Record<string, string | undefined>, role: ConfigRole, unreadable: (path: string) => string | undefined): Config {
  const problems: string[] = [];
  const known = new Set<string>(ENV_VARS);
  for (const name of Object.keys(env)) {
    if (name.startsWith("JETGATE_") && !known.has(name)) problems.push(`${name}: unknown setting`);
  }
  const parsed = envSchema.safeParse(env);
  if (!parsed.success) {
    for (const issue of parsed.error.issues) {
      const name = String(issue.path[0] ?? "(environment)");
      problems.push(`${name}: ${issue.message}`);
    }
  }
  if (parsed.success) {
    const c = parsed.data;
    if (c.JETGATE_ENV === "production") {
      if (role === "gateway" && c.JETGATE_CURSOR_KEYS === undefined) problems.push("JETGATE_CURSOR_KEYS: required when JETGATE_ENV=production");
      if (role === "gateway" && c.JETGATE_JWT_SECRET === undefined && c.JETGATE_JWT_PUBLIC_KEYS_FILE === undefined) {
        problems.push("JETGATE_JWT_PUBLIC_KEYS_FILE: required when JETGATE_ENV=production (or JETGATE_JWT_SECRET)");
      }
      if (c.JETGATE_FAULT_EXIT_AFTER !== "") problems.push("JETGATE_FAULT_EXIT_AFTER: test-only; refused when JETGATE_ENV=production");
      if (c.JETGATE_FAULT_AUTH_PAUSE_MS !== 0) problems.push("JETGATE_FAULT_AUTH_PAUSE_MS: test-only; refused when JETGATE_ENV=production");
      if (c.JETGATE_FAULT_REGISTRY_LAG_MS !== 0) problems.push("JETGATE_FAULT_REGISTRY_LAG_MS: test-only; refused when JETGATE_ENV=production");
      if (c.JETGATE_DEMO_DIR !== undefined) problems.push("JETGATE_DEMO_DIR: the demo page hands out tokens; refused when JETGATE_ENV=production");
      const weak = c.JETGATE_ADMIN_TOKEN === undefined ? undefined : tokenStrengthProblem(c.JETGATE_ADMIN_TOKEN);
      if (weak !== undefined) problems.push(`JETGATE_ADMIN_TOKEN: ${weak} when JETGATE_ENV=production (make one with: openssl rand -base64 32)`);
      const weakService = role !== "gateway" || c.JETGATE_SERVICE_TOKEN === undefined ? undefined : tokenStrengthProblem(c.JETGATE_SERVICE_TOKEN);
      if (weakService !== undefined) problems.push(`JETGATE_SERVICE_TOKEN: ${weakService} when JETGATE_ENV=production (make one with: jetgate token new, or openssl rand -base64 32)`);
    }
    if (c.JETGATE_JWT_PREVIOUS_SECRET !== undefined && c.JETGATE_JWT_SECRET === undefined) problems.push("JETGATE_JWT_PREVIOUS_SECRET: needs JETGATE_JWT_SECRET");
    const natsAuth = (["JETGATE_NATS_USER", "JETGATE_NATS_TOKEN", "JETGATE_NATS_CREDS_FILE", "JETGATE_NATS_NKEY_SEED_FILE"] as const).filter((k) => c[k] !== undefined);
    if (natsAuth.length > 1) problems.push(`${natsAuth[1]}: set one NATS authentication (${natsAuth.join(", ")} are all set)`);
    if (c.JETGATE_NATS_PASS !== undefined && c.JETGATE_NATS_USER === undefined) problems.push("JETGATE_NATS_PASS: needs JETGATE_NATS_USER");
    // A secret file that cannot be read is a configuration error, named, at start (not at connect).
    for (const k of ["JETGATE_NATS_CREDS_FILE", "JETGATE_NATS_NKEY_SEED_FILE", "JETGATE_NATS_CA_FILE", "JETGATE_REDIS_CA_FILE", "JETGATE_JWT_PUBLIC_KEYS_FILE", "JETGATE_SERVICE_TOKENS_FILE"] as const) {
      const f = c[k];
      // only a gateway reads the tokens file; a worker given the gateways' settings never opens it
      if (f === undefined || (k === "JETGATE_SERVICE_TOKENS_FILE" && role !== "gateway")) continue;
      const why = unreadable(f);
      if (why !== undefined) problems.push(`${k}: cannot read ${f} (${why})`);
    }
    if (problems.length === 0) {
      const devJwt = c.JETGATE_ENV === "development" && c.JETGATE_JWT_SECRET === undefined && c.JETGATE_JWT_PUBLIC_KEYS_FILE === undefined;
      return { ...c, JETGATE_CURSOR_KEYS: c.JETGATE_CURSOR_KEYS ?? [DEV_CURSOR_KEY], JETGATE_JWT_SECRET: devJwt ? DEV_JWT_SECRET : c.JETGATE_JWT_SECRET };
    }
  }
  throw new ConfigError(problems);
}
