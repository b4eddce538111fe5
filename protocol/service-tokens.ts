/**
 * Service tokens: who may call the gateway's HTTP API (dispatch, the users API) and for what.
 *
 * A deployment names its backends' tokens in a file (JETGATE_SERVICE_TOKENS_FILE, YAML or JSON),
 * each with its SHA-256, its scopes and an optional `not_after`; several are valid at once, so a
 * rotation adds the new one, rolls the backends and removes the old one with no 401 in between.
 * JETGATE_SERVICE_TOKEN, the simple case, is one more token named `default` with every scope.
 *
 * The file holds hashes, never tokens: a copy of the Secret does not open the API. A presented
 * token is looked up by its hash (a map lookup whose timing can only tell about the hash, which
 * says nothing of a token that hashes elsewhere).
 */
import { sha256 } from "@noble/hashes/sha2.js";
import { bytesToHex } from "@noble/hashes/utils.js";
import { parse as parseYaml } from "yaml";
import { z } from "zod";

/** What a token may do; each route of the HTTP API needs one (docs/security.md). */
export const SERVICE_SCOPES = ["dispatch", "read", "presence", "sessions", "revoke"] as const;
export type ServiceScope = (typeof SERVICE_SCOPES)[number];

/** What each scope opens, as the docs and the 403s say it. */
export const SCOPE_ROUTES: Record<ServiceScope, string> = {
  dispatch: "POST /v1/dispatch, POST /v1/dispatch/batch",
  read: "GET /v1/users/{user}/mailbox, GET /v1/users/{user}/entries",
  presence: "GET /v1/users/{user}/presence, POST /v1/presence",
  sessions: "POST /v1/users/{user}/disconnect",
  revoke: "POST /v1/users/{user}/revoke",
};

/** The name JETGATE_SERVICE_TOKEN's token goes by (in metrics, logs and 403s). */
export const SINGLE_TOKEN_NAME = "default";

const TokenEntrySchema = z
  .object({
    /** Shown in logs, metrics and 403s: which backend this is (never the token). */
    name: z.string().regex(/^[A-Za-z0-9_.-]{1,64}$/, "must be 1..64 of A-Z a-z 0-9 _ . -"),
    /** Hex SHA-256 of the token's UTF-8 bytes (`jetgate token new` prints it). */
    sha256: z.string().regex(/^[0-9a-fA-F]{64}$/, "must be the token's SHA-256 in hex (64 characters)"),
    scopes: z.array(z.enum(SERVICE_SCOPES)).min(1, "must name at least one scope"),
    /** Refused after this instant (ISO 8601 with a zone, e.g. 2027-03-01T00:00:00Z). */
    not_after: z.iso.datetime({ offset: true, message: "must be an ISO 8601 date and time with a zone, e.g. 2027-03-01T00:00:00Z" }).optional(),
  })
  .strict();

export const ServiceTokensFileSchema = z.object({ tokens: z.array(TokenEntrySchema) }).strict();

export interface ServiceToken {
  readonly name: string;
  readonly scopes: ReadonlySet<ServiceScope>;
  /** Unix ms after which it is refused; undefined: no end. */
  readonly notAfter: number | undefined;
}

/** A tokens file that cannot be used; `problems` name the field (`tokens.2.scopes.0: ...`). */
export class ServiceTokensError extends Error {
  override readonly name = "ServiceTokensError";
  constructor(readonly problems: readonly string[]) {
    super(problems.join("; "));
  }
}

const utf8 = new TextEncoder();

export function serviceTokenHash(token: string): string {
  return bytesToHex(sha256(utf8.encode(token)));
}

/** What a presented token is. */
export type TokenMatch =
  | { kind: "valid"; token: ServiceToken }
  | { kind: "expired"; token: ServiceToken }
  | { kind: "unknown" };

/** The tokens a gateway takes now, by hash. Immutable: a reload builds a new table. */
export class ServiceTokenTable {
  private constructor(private readonly byHash: ReadonlyMap<string, ServiceToken>) {}

  static readonly EMPTY = new ServiceTokenTable(new Map());

  /**
   * The table of a tokens file's text (YAML or JSON) and of JETGATE_SERVICE_TOKEN, either of which
   * may be absent. Throws ServiceTokensError naming every problem: unreadable YAML, a bad field,
   * one name or one hash twice.
   */
  static from(fileText: string | undefined, single: string | undefined): ServiceTokenTable {
    const map = new Map<string, ServiceToken>();
    const problems: string[] = [];
    const names = new Set<string>();
    const add = (hash: string, token: ServiceToken, where: string) => {
      if (names.has(token.name)) problems.push(`${where}.name: ${JSON.stringify(token.name)} is used twice`);
      if (map.has(hash)) problems.push(`${where}.sha256: the same token as ${JSON.stringify(map.get(hash)!.name)}`);
      names.add(token.name);
      map.set(hash, token);
    };
    if (single !== undefined) add(serviceTokenHash(single), { name: SINGLE_TOKEN_NAME, scopes: new Set(SERVICE_SCOPES), notAfter: undefined }, "JETGATE_SERVICE_TOKEN");
    if (fileText !== undefined) {
      let raw: unknown;
      try {
        raw = parseYaml(fileText);
      } catch (err) {
        throw new ServiceTokensError([`not YAML or JSON: ${(err as Error).message.split("\n")[0]}`]);
      }
      const parsed = ServiceTokensFileSchema.safeParse(raw);
      if (!parsed.success) throw new ServiceTokensError(parsed.error.issues.map((i) => `${i.path.length > 0 ? i.path.join(".") : "the file"}: ${i.message}`));
      parsed.data.tokens.forEach((t, i) => {
        add(t.sha256.toLowerCase(), { name: t.name, scopes: new Set(t.scopes), notAfter: t.not_after === undefined ? undefined : Date.parse(t.not_after) }, `tokens.${i}`);
      });
    }
    if (problems.length > 0) throw new ServiceTokensError(problems);
    return new ServiceTokenTable(map);
  }

  get size(): number {
    return this.byHash.size;
  }

  get tokens(): ServiceToken[] {
    return [...this.byHash.values()];
  }

  match(token: string, now: number): TokenMatch {
    const t = this.byHash.get(serviceTokenHash(token));
    if (t === undefined) return { kind: "unknown" };
    return t.notAfter !== undefined && now > t.notAfter ? { kind: "expired", token: t } : { kind: "valid", token: t };
  }
}
