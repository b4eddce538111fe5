/**
 * Who may call the HTTP API: the service tokens (protocol/service-tokens.ts), their scopes, and
 * wrong tokens slowed per client address.
 *
 * A right token is served whatever else its address sends: many backends share one address (a
 * NAT, an ingress, a mesh sidecar), and a rotation is the very moment some of them retry an old
 * token. Only wrong tokens are counted (10, then one every 6 s) and answered 429 while their
 * address is held off. Serving a right token meanwhile tells a guesser nothing it can use, because
 * with JETGATE_ENV=production every token that is served has at least 96 bits (estimated): the
 * single token is checked at start, a tokens-file token (the file holds only its hash) when it is
 * first shown, and a weak one is refused.
 */
import { SCOPE_ROUTES, tokenStrengthProblem, type ServiceScope, type ServiceToken, type ServiceTokenTable } from "../../protocol/index.js";
import { bearerToken, FailedAuthThrottle } from "./bearer.js";

export type Admission =
  | { ok: true; token: string }
  | {
      ok: false;
      status: string;
      error: string;
      /** The token's name when it was one of the table's ("" otherwise). */
      token: string;
      /** The scope a 403 names. */
      scope?: ServiceScope;
      retryAfterS?: number;
      /** A wrong token: it counts against its address. */
      wrong: boolean;
    };

export interface AdmissionInput {
  header: string;
  scope: ServiceScope;
  table: ServiceTokenTable;
  now: number;
  /** Seconds the client's address is held off for wrong tokens (0: not held off). */
  heldOffS: number;
  production: boolean;
}

/** The decision, apart from any state: which answer a request with this Authorization header gets. */
export function decideAdmission(i: AdmissionInput): Admission {
  if (i.table.size === 0) return { ok: false, status: "503 Service Unavailable", error: "the API is disabled: set JETGATE_SERVICE_TOKEN or JETGATE_SERVICE_TOKENS_FILE", token: "", wrong: false };
  const presented = bearerToken(i.header);
  const m = presented === undefined ? ({ kind: "unknown" } as const) : i.table.match(presented, i.now);
  if (m.kind === "valid") {
    const weak = i.production ? tokenStrengthProblem(presented!) : undefined;
    if (weak !== undefined) {
      return { ok: false, status: "401 Unauthorized", error: `service token ${JSON.stringify(m.token.name)} is refused with JETGATE_ENV=production: it ${weak}; make a new one with: jetgate token new`, token: m.token.name, wrong: false };
    }
    if (!m.token.scopes.has(i.scope)) return { ok: false, status: "403 Forbidden", error: forbidden(m.token, i.scope), token: m.token.name, scope: i.scope, wrong: false };
    return { ok: true, token: m.token.name };
  }
  if (i.heldOffS > 0) {
    return { ok: false, status: "429 Too Many Requests", error: `too many wrong tokens from this address: try again in ${i.heldOffS} s`, token: "", retryAfterS: i.heldOffS, wrong: false };
  }
  if (m.kind === "expired") {
    return { ok: false, status: "401 Unauthorized", error: `service token ${JSON.stringify(m.token.name)} expired at ${new Date(m.token.notAfter!).toISOString()} (its not_after)`, token: m.token.name, wrong: true };
  }
  return { ok: false, status: "401 Unauthorized", error: presented === undefined ? "missing bearer token" : "wrong bearer token", token: "", wrong: true };
}

function forbidden(token: ServiceToken, scope: ServiceScope): string {
  return `service token ${JSON.stringify(token.name)} does not have the scope ${scope} (it has ${[...token.scopes].join(", ")}); ${scope} opens ${SCOPE_ROUTES[scope]}`;
}

/**
 * The admission every route of the HTTP API asks: the current table (it changes on a reload), and
 * one count of wrong tokens per address over the dispatch and users APIs together.
 */
export class ServiceAuth {
  private readonly throttle: FailedAuthThrottle;

  constructor(
    private readonly table: () => ServiceTokenTable,
    private readonly production: boolean,
    /** An address just held off for wrong tokens (to log it once, not at each 429). */
    private readonly heldOff: (client: string) => void = () => undefined,
    throttle = new FailedAuthThrottle(),
  ) {
    this.throttle = throttle;
  }

  admit(header: string, client: string, scope: ServiceScope, now: number): Admission {
    const a = decideAdmission({ header, scope, table: this.table(), now, heldOffS: this.throttle.waitS(client, now), production: this.production });
    if (!a.ok && a.wrong) {
      this.throttle.failed(client, now);
      if (this.throttle.waitS(client, now) > 0) this.heldOff(client);
    }
    return a;
  }
}
