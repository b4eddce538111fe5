/**
 * Where jetgate keeps its data outside the shard streams, in one place: Redis key names, hash
 * fields, hot cache rows and their stream ids, the Lua scripts over them, and the names of the
 * JetStream consumers workers and gateways create. Worker, gateway and tests import these; nothing
 * spells a key, a field or a script anywhere else.
 *
 * Every key of a user carries the hash tag `{u:<user>}` so a script that touches one user's keys
 * stays in one Redis Cluster slot; shard keys carry `{s:<shard>}`.
 */
import { z } from "zod";
import { assertId } from "./ids.js";
import { seqEpoch, seqOffset, type MailboxSeq } from "./seq.js";
import { assertShard } from "./subjects.js";

/**
 * What follows a user's `<prefix>:{u:<user>}:` in the keys the worker writes; the batch script
 * (APPLY_BATCH_LUA) builds them from `userKeyParts`, the user and these.
 */
const USER_SUFFIX = { watermarks: "wm", hotCache: "hc", dedup: "dd:" } as const;

export class RedisKeys {
  constructor(readonly prefix: string) {}

  private user(user: string): string {
    return `${this.prefix}:{u:${assertId("user", user)}}:`;
  }

  /** What comes before and after the user id in the start of every key of a user (for scripts that build them). */
  userKeyParts(): [string, string] {
    return [`${this.prefix}:{u:`, "}:"];
  }

  /**
   * Hash: lane -> highest seq (20-digit decimal), WATERMARK_ALL -> highest over lanes. Written by the
   * worker only, in stream order (a value rebuilt elsewhere could be older than an entry the worker
   * wrote meanwhile, and `_all` is the `prevAll` of the next entry: it must never be low).
   */
  watermarks(user: string): string {
    return `${this.user(user)}${USER_SUFFIX.watermarks}`;
  }

  /**
   * Stream of the user's latest entries (rows: CACHE_FIELDS), ids `cacheStreamId(seq)`. Each row
   * names the user's entry before it (`prevAll`), so what the cache covers is read from the rows
   * themselves: no marker elsewhere can outlive them.
   */
  hotCache(user: string): string {
    return `${this.user(user)}${USER_SUFFIX.hotCache}`;
  }

  /** Dedup of one dispatch for one user: value `<log>:<offset>` of the first copy. */
  dedup(user: string, dispatchId: string): string {
    return `${this.user(user)}${USER_SUFFIX.dedup}${assertId("dispatch", dispatchId)}`;
  }

  /** Last cumulative ACK of a device. */
  deviceAck(user: string, device: string): string {
    return `${this.deviceAckPrefix(user)}${assertId("device", device)}`;
  }

  /** What `deviceAck` puts before the device id (the ACK script names evicted devices' keys with it). */
  deviceAckPrefix(user: string): string {
    return `${this.user(user)}ack:`;
  }

  /** Sorted set of the user's devices with ACK state, scored by their last ACK (ms). */
  devices(user: string): string {
    return `${this.user(user)}devs`;
  }

  /** Presence of a device: which gateway holds its session. */
  presence(user: string, device: string): string {
    return `${this.user(user)}pr:${assertId("device", device)}`;
  }

  /** Advisory lease of a shard: value is the owner's worker id. */
  lease(shard: number): string {
    return `${this.prefix}:{s:${assertShard(shard)}}:lease`;
  }

  /** A process's readiness write probe (protocol/io/health.ts): a short-lived key of its own. */
  healthProbe(process: string): string {
    return `${this.prefix}:{health}:${process}`;
  }

  /** Sorted set of gateways, scored by their last beat (Redis's clock, s): workers stop routing to silent ones. */
  gateways(): string {
    return `${this.prefix}:{gateways}`;
  }

  /**
   * Token revocations of every user: field `u:<user>` (all the user's tokens) or
   * `d:<user>:<device>` (one device's), value `<issued_before s>/<expires ms>`; and the
   * REVOCATION_FIELDS, whose names start with `:` (no revocation's can). The truth: a gateway loads
   * it whole at start (in chunks), then reads the changes it lacks from the log by version.
   */
  revocations(): string {
    return `${this.prefix}:{revocations}`;
  }

  /**
   * Stream of revocation changes, in the revocations' slot, trimmed to about REVOCATION_LOG_MAXLEN:
   * fields `f` and `v` (a hash field and the value it was given) and `n`, the hash's version that
   * change made (REVOCATION_FIELDS.version).
   */
  revocationLog(): string {
    return `${this.prefix}:{revocations}:log`;
  }

  /** Sorted set of live workers, scored by the expiry of their heartbeat. */
  workers(): string {
    return `${this.prefix}:{workers}`;
  }

  /**
   * When the worker set was (re)created, ms: a marker without expiry that workers set NX, so a set
   * Redis lost (a restart without persistence, FLUSHALL) is told from one that is merely empty.
   */
  workersSince(): string {
    return `${this.prefix}:{workers}:since`;
  }
}

/** A seq as a fixed-width decimal string, so Lua compares seqs as strings (its numbers are doubles). */
export function seqKey(seq: bigint): string {
  return seq.toString().padStart(20, "0");
}

// ---- the watermark hash ---------------------------------------------------------------------

/** Field of the watermark hash: the user's highest seq over all lanes (a push's `pa`). */
export const WATERMARK_ALL = "_all";

/**
 * The watermark hash's other fields. Their names hold a `:`, which no lane id can (lanes are
 * `[A-Za-z0-9_-]`), and their values are not seqs: readers of the lanes skip them.
 */
export const HASH_FIELDS = {
  /**
   * The gateways that hold (or are about to hold) a session of the user, as `<gateway>.<generation>`
   * tokens (parseRoutes), `,`-separated; "" when
   * none. Missing (a new, expired, evicted or flushed hash): the worker sends the user's next
   * entry to every gateway and sets it to "", and the gateways holding the user register again.
   */
  routes: ":r",
  /**
   * The entry (`<log>:<offset>`) whose processing found the routes unknown and sent it to every
   * gateway. The same entry processed again (the worker retries a batch whose script ran on one
   * Redis node and failed on another, or whose answer was lost) is again sent to every gateway:
   * the first run's broadcast never left, and by now the routes read "" (known, none).
   */
  broadcastBy: ":rb",
  /** When (Redis's clock, s) the worker last set the hash's expiry. */
  hashExpirySetAt: ":tw",
  /** When (Redis's clock, s) the worker last set the hot cache's expiry. */
  cacheExpirySetAt: ":th",
} as const;

// ---- the hot cache --------------------------------------------------------------------------

/** Fields of a hot cache row (a Redis stream entry), written by the worker's APPLY_ENTRY_LUA. */
export const CACHE_FIELDS = {
  /** The entry's seq, 20-digit decimal. */
  seq: "s",
  /** Its lane's previous seq, 20-digit decimal, or "" when unknown. */
  prev: "p",
  /**
   * The user's previous seq over all lanes when the worker wrote the row (the push's `prevAll`),
   * 20-digit decimal, or "" when unknown (the watermark hash was gone). Rows whose `prevAll` is the
   * row before them form an unbroken chain: the cache holds every entry of the user in it.
   */
  prevAll: "a",
  lane: "l",
  /** The entry body as stored in the shard stream (msgpack {id, d, ts, b}). */
  entry: "e",
  /** The shard whose log holds it: a moved user's cache mixes parent and child rows. */
  shard: "h",
} as const;

/** A row's stream id: `<epoch>-<offset>`, which Redis keeps increasing, so rows sort as seqs do. */
export function cacheStreamId(seq: MailboxSeq): string {
  return `${seqEpoch(seq)}-${seqOffset(seq)}`;
}

export interface CacheRow {
  seq: string;
  prev: string;
  prevAll: string;
  lane: string;
  entry: Buffer;
  shard: string;
}

/** A row's fields (as XRANGE returns them, name and value alternating); undefined when one is missing. */
export function parseCacheRow(fields: readonly Buffer[]): CacheRow | undefined {
  const get = (name: string): Buffer | undefined => {
    for (let i = 0; i + 1 < fields.length; i += 2) if (fields[i]!.toString() === name) return fields[i + 1];
    return undefined;
  };
  const seq = get(CACHE_FIELDS.seq);
  const lane = get(CACHE_FIELDS.lane);
  const entry = get(CACHE_FIELDS.entry);
  const shard = get(CACHE_FIELDS.shard);
  if (seq === undefined || lane === undefined || entry === undefined || shard === undefined) return undefined;
  return {
    seq: seq.toString(),
    prev: get(CACHE_FIELDS.prev)?.toString() ?? "",
    prevAll: get(CACHE_FIELDS.prevAll)?.toString() ?? "",
    lane: lane.toString(),
    entry,
    shard: shard.toString(),
  };
}

// ---- Lua scripts (one user's keys each, one cluster slot; the worker's batch script one node's) ---

/**
 * The worker's Redis work for a batch of entries, in one call per Redis node (worker/mailbox-script.ts
 * says why each step is there). KEYS[1]: the first entry's watermarks key, which routes the call to
 * its node; every entry's keys are built here from `userKeyParts` and its user (a Cluster refuses a
 * call that declares keys of several slots; `allow-cross-slot-keys`, Redis >= 7.0, lets the script
 * touch the other slots of its node). ARGV[1]: `key part 1|key part 2|log|shard|dedup ttl|cache
 * maxlen|cache ttl|watermark ttl`; ARGV[2]: one `user|dispatch|offset|lane|seq|cache row
 * id|body length` per entry, `;`-separated; ARGV[3]: the entry bodies, concatenated. Returns
 * `first|prev|prevAll|routes` per entry, `;`-separated; routes is the user's gateways,
 * `,`-separated (empty: no session anywhere), or `?` when the hash had no routes field (new,
 * expired, evicted, flushed): the entry then goes to every gateway, and the field is set to "".
 *
 * Four commands per entry: SET NX (dedup), HMGET, XADD, HSET. TTLs are refreshed lazily: each key's
 * expiry is set to its TTL plus a slack of an eighth, at most once per slack (the hash keeps when,
 * by Redis's clock), so a key lives at least its TTL after its last write. A hot cache that is
 * gone (its TTL, an eviction) is noticed by XADD NOMKSTREAM and made again with its expiry.
 */
export const APPLY_BATCH_LUA = `#!lua flags=allow-cross-slot-keys
local s = {}
for x in string.gmatch(ARGV[1], '[^|]+') do s[#s + 1] = x end
local k1, k2, log, shard, dedupTtl, maxlen, cacheTtl, wmTtl = s[1], s[2], s[3], s[4], s[5], tonumber(s[6]), tonumber(s[7]), tonumber(s[8])
local cacheSlack = math.max(1, math.floor(cacheTtl / 8))
local wmSlack = math.max(1, math.floor(wmTtl / 8))
local now = tonumber(redis.call('TIME')[1])
local out = {}
local pos = 1
local i = 0
for item in string.gmatch(ARGV[2], '[^;]+') do
  i = i + 1
  local user, dispatch, offset, lane, seq, rowId, blen = string.match(item, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)$')
  blen = tonumber(blen)
  local body = string.sub(ARGV[3], pos, pos + blen - 1)
  pos = pos + blen
  local base = k1 .. user .. k2
  local wmKey = base .. '${USER_SUFFIX.watermarks}'
  local dd = base .. '${USER_SUFFIX.dedup}' .. dispatch
  local hc = base .. '${USER_SUFFIX.hotCache}'
  local token = log .. ':' .. offset
  local first = 1
  if not redis.call('SET', dd, token, 'NX', 'EX', dedupTtl) then
    if redis.call('GET', dd) ~= token then first = 0 end
  end
  local wm = redis.call('HMGET', wmKey, lane, '${WATERMARK_ALL}', '${HASH_FIELDS.routes}', '${HASH_FIELDS.hashExpirySetAt}', '${HASH_FIELDS.cacheExpirySetAt}', '${HASH_FIELDS.broadcastBy}')
  local prev, prevAll, routes, wmAt, hcAt, broadcastBy = wm[1], wm[2], wm[3], tonumber(wm[4]), tonumber(wm[5]), wm[6]
  local set = {}
  if (not prev) or prev < seq then set[#set + 1] = lane; set[#set + 1] = seq end
  if (not prevAll) or prevAll < seq then set[#set + 1] = '${WATERMARK_ALL}'; set[#set + 1] = seq end
  -- routes unknown (no field, or a gateway made it again after a loss: its '?' token): this entry
  -- goes to every gateway, those with the user's sessions register again, and the rest is known;
  -- the entry that found them unknown finds them so again when it is processed again
  local again = broadcastBy == token
  local unknown = again or (not routes) or string.find(',' .. routes .. ',', ',?,', 1, true) ~= nil
  if unknown and not again then
    local known = {}
    for t in string.gmatch(routes or '', '[^,]+') do if t ~= '?' then known[#known + 1] = t end end
    set[#set + 1] = '${HASH_FIELDS.routes}'; set[#set + 1] = table.concat(known, ',')
    set[#set + 1] = '${HASH_FIELDS.broadcastBy}'; set[#set + 1] = token
  end
  if maxlen > 0 then
    -- the row carries the user's previous seq: readers check coverage on the rows alone
    local row = {'MAXLEN', maxlen, rowId, '${CACHE_FIELDS.seq}', seq, '${CACHE_FIELDS.prev}', prev or '', '${CACHE_FIELDS.prevAll}', prevAll or '', '${CACHE_FIELDS.lane}', lane, '${CACHE_FIELDS.entry}', body, '${CACHE_FIELDS.shard}', shard}
    local added = redis.pcall('XADD', hc, 'NOMKSTREAM', unpack(row))
    if added == false then
      redis.pcall('XADD', hc, unpack(row))
      hcAt = nil
    end
    if (not hcAt) or now - hcAt >= cacheSlack then
      redis.call('EXPIRE', hc, cacheTtl + cacheSlack)
      set[#set + 1] = '${HASH_FIELDS.cacheExpirySetAt}'; set[#set + 1] = now
    end
  end
  local wmExpire = (not wmAt) or now - wmAt >= wmSlack
  if wmExpire then set[#set + 1] = '${HASH_FIELDS.hashExpirySetAt}'; set[#set + 1] = now end
  if #set > 0 then redis.call('HSET', wmKey, unpack(set)) end
  if wmExpire then redis.call('EXPIRE', wmKey, wmTtl + wmSlack) end
  out[i] = first .. '|' .. (prev or '') .. '|' .. (prevAll or '') .. '|' .. (unknown and '?' or routes)
end
return table.concat(out, ';')
`;

/**
 * A user's routes as the hash keeps them: `<gateway>.<generation>` tokens, `,`-separated, and `?`
 * while other gateways' routes may be missing (a gateway registered into a hash Redis had lost; the
 * worker's next entry of the user goes to every gateway and removes it). The generation (a counter
 * of the gateway's registrations) lets a removal name what it removes: a removal that Redis runs
 * late (a client retries a command after a failover or a MOVED) takes out only registrations at or
 * below its generation, never the one a newer session made since. Returns the gateway ids, each
 * once, and whether the routes are `unknown`.
 */
export function parseRoutes(field: string): { gateways: string[]; unknown: boolean } {
  const gateways: string[] = [];
  let unknown = false;
  for (const token of field === "" ? [] : field.split(",")) {
    if (token === "?") {
      unknown = true;
      continue;
    }
    const dot = token.lastIndexOf(".");
    const gw = dot < 0 ? token : token.slice(0, dot);
    if (gw !== "" && !gateways.includes(gw)) gateways.push(gw);
  }
  return { gateways, unknown };
}

/**
 * A gateway adds itself to a user's routes (it holds a session of the user, or is about to), and
 * reads the user's head in the same step: an entry the worker processed before this ran is at or
 * below that head, one after it is routed here. Its token replaces an older one of the same
 * gateway (a newer one already there stays: this add ran late). The hash's expiry is set to the
 * watermark TTL (a hash made here gets one; a held user's hash does not expire under its sessions).
 * KEYS: watermarks; ARGV: gateway, generation, ttl s. Returns `_all` or ''.
 */
export const ROUTE_ADD_LUA = `
local r = redis.call('HGET', KEYS[1], '${HASH_FIELDS.routes}')
local gw, gen = ARGV[1], tonumber(ARGV[2])
local keep = {}
-- no field: Redis lost the other gateways' routes too; '?' keeps that known until the worker's
-- next entry of the user goes to every gateway
if not r then keep[1] = '?' end
r = r or ''
local mine = gen
for t in string.gmatch(r, '[^,]+') do
  local g, n = string.match(t, '^(.*)%.(%d+)$')
  if g ~= nil and g == gw then
    if tonumber(n) > mine then mine = tonumber(n) end
  else
    keep[#keep + 1] = t
  end
end
keep[#keep + 1] = gw .. '.' .. mine
redis.call('HSET', KEYS[1], '${HASH_FIELDS.routes}', table.concat(keep, ','))
redis.call('EXPIRE', KEYS[1], ARGV[3])
return redis.call('HGET', KEYS[1], '${WATERMARK_ALL}') or ''
`;

/**
 * Removes gateways' registrations from a user's routes: those of generation at or below ARGV[1]
 * (a gateway whose last session of the user closed passes its current generation; a worker dropping
 * a silent gateway passes a larger one than any). KEYS: watermarks; ARGV: max generation, the
 * gateways. Returns how many were removed.
 */
export const ROUTE_DROP_LUA = `
local r = redis.call('HGET', KEYS[1], '${HASH_FIELDS.routes}')
if (not r) or r == '' then return 0 end
local upTo = tonumber(ARGV[1])
local drop = {}
for i = 2, #ARGV do drop[ARGV[i]] = true end
local keep = {}
local removed = 0
for t in string.gmatch(r, '[^,]+') do
  local g, n = string.match(t, '^(.*)%.(%d+)$')
  if g and drop[g] and tonumber(n) <= upTo then removed = removed + 1 else keep[#keep + 1] = t end
end
if removed > 0 then redis.call('HSET', KEYS[1], '${HASH_FIELDS.routes}', table.concat(keep, ',')) end
return removed
`;

/**
 * How gateways show they are alive, and what the others conclude from it (one home: the gateway
 * beats with these, the worker and the users API read the beats with them). Each is well inside
 * the next: a gateway that beats every second and re-registers its routes after 20 s without a
 * beat never looks silent to a worker (60 s), and counts as live for the users API within 5 s.
 */
export const GATEWAY_LIVENESS = {
  /** How often a gateway beats into the gateways' set. */
  beatEveryMs: 1000,
  /** A gateway that could not beat for this long registers every route of its users again. */
  reregisterAfterMs: 20_000,
  /** A gateway whose last beat is older is counted live by no one (the users API's wait). */
  liveWithinS: 5,
  /** A gateway whose last beat is older is silent: workers send it nothing and drop its routes. */
  silentAfterS: 60,
} as const;

/**
 * A gateway's beat: its score in the gateways' sorted set is Redis's clock (seconds), so workers
 * and gateways never compare two machines' clocks. Members silent for a week are removed.
 * KEYS: gateways; ARGV: gateway. Returns 1 when the gateway was not in the set (its first beat,
 * or Redis lost the set: then it lost routes too, and the gateway registers every one again).
 */
export const GATEWAY_BEAT_LUA = `
local now = tonumber(redis.call('TIME')[1])
local added = redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 7 * 86400)
return added
`;

/** The gateways' beats and Redis's time: `{now, gateway, score, gateway, score, ...}`. KEYS: gateways. */
export const GATEWAYS_SEEN_LUA = `
local out = {tostring(redis.call('TIME')[1])}
local z = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for _, v in ipairs(z) do out[#out + 1] = v end
return out
`;

/**
 * A device's cumulative ACK, upward only, and the bound on devices per user: the device joins the
 * user's set (scored by now), entries older than the TTL leave it, and over the bound the least
 * recently active devices' ACK keys are deleted (never the calling device's). Every key is the
 * user's, so one Cluster slot. KEYS: deviceAck, devices; ARGV: seq, ttl s, now ms, max devices,
 * ACK key prefix, device. Returns {raised, evicted}.
 */
export const ACK_STORE_LUA = `
local raised = 0
local cur = redis.call('GET', KEYS[1])
if (not cur) or cur < ARGV[1] then redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2]) raised = 1 end
local now = tonumber(ARGV[3])
redis.call('ZADD', KEYS[2], now, ARGV[6])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. (now - tonumber(ARGV[2]) * 1000))
local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[4])
local evicted = 0
if over > 0 then
  for _, d in ipairs(redis.call('ZRANGE', KEYS[2], 0, over)) do
    if evicted < over and d ~= ARGV[6] then
      redis.call('DEL', ARGV[5] .. d)
      redis.call('ZREM', KEYS[2], d)
      evicted = evicted + 1
    end
  end
end
redis.call('EXPIRE', KEYS[2], ARGV[2])
return {raised, evicted}
`;

/** Claims a device's presence unless a later AUTH holds it. KEYS: presence; ARGV: value, ttl, auth ms. Returns {won, previous}. */
export const PRESENCE_CLAIM_LUA = `
local prev = redis.call('GET', KEYS[1])
if prev then
  local at = tonumber(string.match(prev, '/(%d+)$'))
  if at and at > tonumber(ARGV[3]) then return {0, prev} end
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return {1, prev or ''}
`;

/** Releases a presence only if this session still holds it. KEYS: presence; ARGV: value. */
export const PRESENCE_RELEASE_LUA = `
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`;

/** Renews (or takes, when free) a shard's advisory lease. KEYS: lease; ARGV: owner, ms. 1 renewed, 2 taken, 0 someone else's. */
export const LEASE_RENEW_LUA = `
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
if not v then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 2 end
return 0
`;

/** Releases a lease only if this worker holds it. KEYS: lease; ARGV: owner. */
export const LEASE_RELEASE_LUA = `
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`;

/** The revocation hash's fields that hold no revocation. */
export const REVOCATION_FIELDS = {
  /**
   * `<epoch>:<n>`: the hash's version. `n` counts the changes REVOKE_LUA made; `epoch` (Redis's
   * clock in µs when the first of them found no version) tells a hash made again after a loss from
   * the one before, whose `n` it would repeat. A gateway that applied version V of an epoch needs
   * the log's entries V+1 up to the hash's version, all of them, else it loads the hash again.
   */
  version: ":ver",
  /** Where REVOKE_LUA's sweep of expired fields resumes (an HSCAN cursor). */
  sweep: ":sweep",
} as const;
/** Entries the revocation change log keeps (about: trimmed with `~`), minutes of revokes at a high rate. */
export const REVOCATION_LOG_MAXLEN = 100_000;
/** Fields each revoke looks at for expiry: the hash stays within a few percent of what is in force. */
export const REVOCATION_SWEEP_COUNT = 20;

/**
 * Records a revocation: of the one there and this one, the later `issued_before` and the later
 * expiry (each caller's expiry covers its own `issued_before`, so the later covers the one kept:
 * gateway/hub/revocations.ts revocationExpiry). Moves the hash's version on and appends the change to
 * the log with it. Expired fields go by a sweep of a few fields per call that resumes where the
 * last stopped: a call costs the same however many revocations are in force.
 * KEYS: revocations, log; ARGV: field, issued_before (s), expires (ms), now (ms), log maxlen, sweep
 * count. Returns the value kept.
 */
export const REVOKE_LUA = `
local now = tonumber(ARGV[4])
local sweep = redis.call('HSCAN', KEYS[1], redis.call('HGET', KEYS[1], '${REVOCATION_FIELDS.sweep}') or '0', 'COUNT', ARGV[6])
for i = 1, #sweep[2], 2 do
  local f = sweep[2][i]
  local exp = tonumber(string.match(sweep[2][i + 1], '^%d+/(%d+)$'))
  if string.sub(f, 1, 1) ~= ':' and (exp == nil or exp <= now) then redis.call('HDEL', KEYS[1], f) end
end
if sweep[1] == '0' then redis.call('HDEL', KEYS[1], '${REVOCATION_FIELDS.sweep}') else redis.call('HSET', KEYS[1], '${REVOCATION_FIELDS.sweep}', sweep[1]) end
local before, expires = ARGV[2], ARGV[3]
local prev = redis.call('HGET', KEYS[1], ARGV[1])
if prev then
  local pb, pe = string.match(prev, '^(%d+)/(%d+)$')
  if pb and tonumber(pb) > tonumber(before) then before = pb end
  if pe and tonumber(pe) > tonumber(expires) then expires = pe end
end
local value = before .. '/' .. expires
local epoch, n = string.match(redis.call('HGET', KEYS[1], '${REVOCATION_FIELDS.version}') or '', '^(%d+):(%d+)$')
if not epoch then
  local t = redis.call('TIME')
  epoch, n = t[1] .. string.format('%06d', tonumber(t[2])), 0
end
local version = epoch .. ':' .. string.format('%.0f', tonumber(n) + 1)
redis.call('HSET', KEYS[1], ARGV[1], value, '${REVOCATION_FIELDS.version}', version)
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'f', ARGV[1], 'v', value, 'n', version)
return value
`;

/**
 * Every script's call as an ioredis command: KEYS first, then ARGV (ioredis sends numbers as
 * decimal strings). The one typing of the scripts: callers get it from `scripted` (protocol/io),
 * never by declaring their own.
 */
export interface RedisScriptCommands {
  /** APPLY_BATCH_LUA: `first|prev|prevAll|routes` per entry, `;`-separated. */
  jgApplyBatch(route: string, head: string, headers: string, bodies: Buffer): Promise<string>;
  /** ROUTE_ADD_LUA: the user's head (`_all`) or ''. */
  jgRouteAdd(watermarks: string, gateway: string, generation: number, ttlS: number): Promise<string>;
  /** ROUTE_DROP_LUA: how many gateways it removed. */
  jgRouteDrop(watermarks: string, maxGeneration: number, ...gateways: string[]): Promise<number>;
  /** GATEWAY_BEAT_LUA: 1 when the gateway was not in the set. */
  jgGatewayBeat(gateways: string, gateway: string): Promise<number>;
  /** GATEWAYS_SEEN_LUA: Redis's time (ms) and then the gateways with a beat. */
  jgGatewaysSeen(gateways: string): Promise<string[]>;
  /** ACK_STORE_LUA: [stored (1/0), devices evicted]. */
  jgAckStore(ack: string, devices: string, seq20: string, ttlS: number, now: number, max: number, ackPrefix: string, device: string): Promise<[number, number]>;
  /** PRESENCE_CLAIM_LUA: [claimed (1/0), the value that holds the device]. */
  jgPresenceClaim(presence: string, value: string, ttlS: number, at: number): Promise<[number, string]>;
  /** PRESENCE_RELEASE_LUA: 1 when this session's claim was removed. */
  jgPresenceRelease(presence: string, value: string): Promise<number>;
  /** LEASE_RENEW_LUA: 1 held, 2 taken again (it had vanished), 0 another owner's. */
  jgLeaseRenew(lease: string, owner: string, ms: number): Promise<number>;
  /** LEASE_RELEASE_LUA: 1 when this owner's lease was deleted. */
  jgLeaseRelease(lease: string, owner: string): Promise<number>;
  /** REVOKE_LUA: the value kept (`issued_before/expires`). */
  jgRevoke(revocations: string, log: string, field: string, before: number, expires: number, now: number, logMaxlen: number, sweepCount: number): Promise<string>;
}

/**
 * Every script as an ioredis command, defined when a client is made (`connectRedis`). With
 * auto-pipelining a command defined later, on first use, can land in a pipeline made before it
 * existed ("pipeline[functionName] is not a function"), and the worker died of it in the e2e test.
 */
export const REDIS_SCRIPTS = {
  jgApplyBatch: { lua: APPLY_BATCH_LUA, numberOfKeys: 1 },
  jgRouteAdd: { lua: ROUTE_ADD_LUA, numberOfKeys: 1 },
  jgRouteDrop: { lua: ROUTE_DROP_LUA, numberOfKeys: 1 },
  jgGatewayBeat: { lua: GATEWAY_BEAT_LUA, numberOfKeys: 1 },
  jgGatewaysSeen: { lua: GATEWAYS_SEEN_LUA, numberOfKeys: 1 },
  jgAckStore: { lua: ACK_STORE_LUA, numberOfKeys: 2 },
  jgPresenceClaim: { lua: PRESENCE_CLAIM_LUA, numberOfKeys: 1 },
  jgPresenceRelease: { lua: PRESENCE_RELEASE_LUA, numberOfKeys: 1 },
  jgLeaseRenew: { lua: LEASE_RENEW_LUA, numberOfKeys: 1 },
  jgLeaseRelease: { lua: LEASE_RELEASE_LUA, numberOfKeys: 1 },
  jgRevoke: { lua: REVOKE_LUA, numberOfKeys: 2 },
} as const satisfies { [K in keyof RedisScriptCommands]: { lua: string; numberOfKeys: number } };

// ---- JetStream consumer names ---------------------------------------------------------------

const WORKER_CONSUMER_PREFIX = "w_";

/** The durable consumer a worker creates for a shard under `epoch` (one per epoch; older ones are deleted). */
export function workerConsumerName(epoch: number): string {
  return `${WORKER_CONSUMER_PREFIX}${epoch}`;
}

/** Whether a consumer of a shard stream is a worker's (its ack floor is the shard's processing floor). */
export function isWorkerConsumer(name: string): boolean {
  return name.startsWith(WORKER_CONSUMER_PREFIX);
}

/** The epoch in a worker consumer's name; undefined for any other name. */
const WORKER_CONSUMER_NAME = new RegExp(`^${WORKER_CONSUMER_PREFIX}(\\d{1,5})$`);
export function workerConsumerEpoch(name: string): number | undefined {
  const m = WORKER_CONSUMER_NAME.exec(name);
  return m === null ? undefined : Number(m[1]);
}

/**
 * How far an epoch's worker consumer got, as its worker records it in JETGATE_FLOORS
 * (`floorSubject`): at the takeover, before the consumer exists (`offset` = its first offset - 1),
 * then about once a second after an ack. Worker consumers are R1 (an R3 consumer replicates every
 * delivery through raft), so a NATS node lost with one takes its ack floor along; the record, on
 * the streams' replicas, is what the next takeover starts from then. It may lag the ack floor by a
 * second: a floor too low only repeats entries.
 */
export interface FloorRecord {
  epoch: number;
  offset: number;
}

const floorRecordSchema = z.strictObject({ epoch: z.number().int().min(0).max(0xffff), offset: z.number().int().min(0).max(2 ** 48 - 1) });

export function encodeFloorRecord(r: FloorRecord): Uint8Array {
  return new TextEncoder().encode(JSON.stringify({ epoch: r.epoch, offset: r.offset }));
}

/** The record as stored; throws on anything else (the stream is jetgate's, but its bytes cross NATS). */
export function decodeFloorRecord(data: Uint8Array): FloorRecord {
  return floorRecordSchema.parse(JSON.parse(new TextDecoder().decode(data)));
}

/**
 * The shard's processing floor: the ack floor of the newest epoch's worker consumer (0 when there
 * is none). Not the highest floor of them all: a worker that claims an epoch may start below the
 * previous owner's floor (what that owner processed past the new boundary went out under its
 * fenced epoch and is processed again), and if it dies before deleting the older consumer, that
 * consumer's floor would skip those entries at the next takeover. A floor too low only repeats
 * entries (devices drop them by message id); one too high loses them.
 *
 * `record`: the floor record of an epoch newer than every consumer listed, if there is one (its
 * consumer was lost with its NATS node, or its worker died between the record and the consumer):
 * it stands for that epoch's consumer. A record of an epoch no newer than a listed consumer says
 * nothing the consumer does not.
 */
export function processingFloor(consumers: readonly { name: string; ack_floor: { stream_seq: number } }[], record?: FloorRecord): number {
  let newest: { epoch: number; floor: number } | undefined;
  for (const c of consumers) {
    const epoch = workerConsumerEpoch(c.name);
    if (epoch !== undefined && (newest === undefined || epoch > newest.epoch)) newest = { epoch, floor: c.ack_floor.stream_seq };
  }
  if (record !== undefined && (newest === undefined || record.epoch > newest.epoch)) return record.offset;
  return newest?.floor ?? 0;
}

/** How many epochs below the registry's a takeover looks for a floor record (older ones are long settled). */
const FLOOR_RECORD_EPOCHS = 16;

/**
 * The epochs whose floor record a takeover asks for, newest first (the first found is the one):
 * those from the registry's `epoch` down, above every listed consumer's epoch, at most
 * FLOOR_RECORD_EPOCHS. None while a consumer of the registry's epoch is listed (the usual case).
 */
export function floorRecordEpochs(consumers: readonly string[], epoch: number): number[] {
  const out: number[] = [];
  const listed = newestConsumerEpoch(consumers);
  for (let e = epoch; e > listed && e > epoch - FLOOR_RECORD_EPOCHS; e--) out.push(e);
  return out;
}

/** The newest epoch of the worker consumers listed; -1 when there is none. */
export function newestConsumerEpoch(names: readonly string[]): number {
  let newest = -1;
  for (const n of names) newest = Math.max(newest, workerConsumerEpoch(n) ?? -1);
  return newest;
}

/** An ephemeral consumer a gateway creates for one catch-up read (`suffix`: random hex). */
export function readerConsumerName(suffix: string): string {
  return `rd_${suffix}`;
}
