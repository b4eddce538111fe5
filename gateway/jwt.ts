/**
 * Device JWT verification (jose). `sub` is the user; an optional `dev` claim binds the token to one
 * device. `exp` is required. Only the algorithms of the configured keys are accepted: HS256 for a
 * shared secret (local runs), EdDSA/ES256 for public keys (a PEM file of one or more keys, or a JWKS
 * file) — so `alg: none` and key-confusion tokens (HS256 signed with a public key) are refused.
 *
 * Times: `exp`, `nbf` and `iat` must be finite (JSON's 1e400 parses as Infinity, which jose
 * accepts), fractional seconds are floored (RFC 7519 allows them; the wire carries integer ms), and
 * a token may be valid for at most JETGATE_JWT_MAX_LIFETIME_S from now (and from its `iat`).
 * A token no configured key verifies gets one answer, whatever each key's error was: which kind of
 * key is configured is nobody's business but the operator's, who finds the details in `detail`.
 */
import { readFileSync } from "node:fs";
import { createLocalJWKSet, importSPKI, jwtVerify, type JWTPayload, type JWTVerifyGetKey, type KeyObject, type CryptoKey } from "jose";
import { JetgateError, idProblem } from "../protocol/index.js";

export class TokenError extends JetgateError {
  /** For the logs only: what each key said. */
  readonly detail: string | undefined;
  constructor(message: string, options?: { cause?: unknown; detail?: string }) {
    super("UNAUTHORIZED", message, options);
    this.detail = options?.detail;
  }
}

export const SIGNATURE_FAILED = "signature did not verify with any configured key";

/** jose errors that mean "this key is not the one": the next key may still verify the token. */
const WRONG_KEY = new Set(["ERR_JWS_SIGNATURE_VERIFICATION_FAILED", "ERR_JOSE_ALG_NOT_ALLOWED", "ERR_JWKS_NO_MATCHING_KEY", "ERR_JWKS_MULTIPLE_MATCHING_KEYS", "ERR_JOSE_NOT_SUPPORTED"]);

function describe(err: unknown): string {
  return err instanceof Error ? `${(err as { code?: string }).code ?? err.name}: ${err.message}` : String(err);
}

export interface DeviceClaims {
  user: string;
  /** Device the token is bound to, if it names one. */
  device: string | undefined;
  /** Expiry, ms since the epoch. */
  expiresAt: number;
  /** `iat`, whole seconds since the epoch; undefined when the token has none (revocations: gateway/hub/revocations.ts). */
  issuedAt: number | undefined;
}

export interface TokenVerifier {
  verify(token: string): Promise<DeviceClaims>;
}

type Key = Uint8Array | KeyObject | CryptoKey | JWTVerifyGetKey;

/** Builds the verifier from JETGATE_JWT_SECRET or JETGATE_JWT_PUBLIC_KEYS_FILE. */
export async function tokenVerifier(opts: {
  secret?: string | undefined;
  previousSecret?: string | undefined;
  publicKeysFile?: string | undefined;
  /** JETGATE_JWT_MAX_LIFETIME_S. */
  maxLifetimeS?: number;
  /** The clock (ms since the epoch): tests move it. */
  now?: () => number;
}): Promise<TokenVerifier> {
  const clock = opts.now ?? Date.now;
  const maxLifetimeS = opts.maxLifetimeS ?? 86_400;
  let keys: Key[];
  let algorithms: string[];
  if (opts.publicKeysFile !== undefined) {
    const text = readFileSync(opts.publicKeysFile, "utf8");
    algorithms = ["EdDSA", "ES256"];
    if (text.trimStart().startsWith("{")) {
      keys = [createLocalJWKSet(JSON.parse(text) as Parameters<typeof createLocalJWKSet>[0])];
    } else {
      const pems = text.match(/-----BEGIN PUBLIC KEY-----[\s\S]+?-----END PUBLIC KEY-----/g) ?? [];
      if (pems.length === 0) throw new TokenError(`${opts.publicKeysFile}: no PEM public key found`);
      keys = [];
      for (const pem of pems) {
        let imported: Key | undefined;
        for (const alg of algorithms) {
          imported = await importSPKI(pem, alg).catch(() => undefined);
          if (imported) break;
        }
        if (!imported) throw new TokenError(`${opts.publicKeysFile}: a key is neither Ed25519 nor P-256`);
        keys.push(imported);
      }
    }
  } else if (opts.secret !== undefined) {
    // the previous secret is accepted during a rotation, until the tokens signed with it expire
    // imported once: jose imports raw bytes into WebCrypto on every verify, which was a quarter of a
    // token's cost in a reconnect storm
    keys = await Promise.all([opts.secret, ...(opts.previousSecret !== undefined ? [opts.previousSecret] : [])].map((k) =>
      crypto.subtle.importKey("raw", new TextEncoder().encode(k), { name: "HMAC", hash: "SHA-256" }, false, ["verify"])));
    algorithms = ["HS256"];
  } else {
    throw new TokenError("no JWT key configured: set JETGATE_JWT_SECRET or JETGATE_JWT_PUBLIC_KEYS_FILE");
  }
  return {
    async verify(token) {
      let payload: JWTPayload | undefined;
      const tried: string[] = [];
      for (const key of keys) {
        try {
          ({ payload } = await jwtVerify(token, key as Uint8Array, { algorithms, requiredClaims: ["exp", "sub"], clockTolerance: CLOCK_TOLERANCE_S, currentDate: new Date(clock()) }));
          break;
        } catch (err) {
          const code = (err as { code?: string }).code ?? "";
          // a claim or a malformed token is the token's own fault, the same for every key
          if (code === "ERR_JWT_EXPIRED" || code === "ERR_JWT_CLAIM_VALIDATION_FAILED") throw new TokenError(`token ${(err as Error).message}`, { cause: err });
          if (code === "ERR_JWS_INVALID" || code === "ERR_JWT_INVALID") throw new TokenError(`token is malformed (${(err as Error).message})`, { cause: err });
          if (!WRONG_KEY.has(code) && !(err instanceof TypeError)) throw new TokenError(SIGNATURE_FAILED, { cause: err, detail: describe(err) });
          tried.push(describe(err));
        }
      }
      if (payload === undefined) throw new TokenError(SIGNATURE_FAILED, { detail: tried.join("; ") });
      const expiresAt = checkTimes(payload, maxLifetimeS, clock() / 1000);
      const user = payload.sub;
      const p = idProblem("user", user);
      if (p !== undefined) throw new TokenError(`token sub: user id ${p}`);
      const dev = payload.dev;
      if (dev !== undefined && idProblem("device", dev) !== undefined) throw new TokenError("token dev claim is not a valid device id");
      return { user: user!, device: dev as string | undefined, expiresAt, issuedAt: payload.iat === undefined ? undefined : Math.floor(payload.iat) };
    },
  };
}

/**
 * Seconds of clock skew allowed between a token's issuer and the gateway: on `exp` and `nbf` (jose
 * accepts a token until `exp` + this), and on the lifetime (at most the maximum + this). A
 * revocation is kept for the longest any token it covers can be accepted (revocationExpiry).
 */
export const CLOCK_TOLERANCE_S = 5;

/**
 * The token's expiry in integer ms, after the checks jose does not make: finite times, and a
 * lifetime within the configured maximum. Exported for its table test.
 */
export function checkTimes(payload: JWTPayload, maxLifetimeS: number, nowS = Date.now() / 1000): number {
  for (const claim of ["exp", "nbf", "iat"] as const) {
    const v = payload[claim];
    if (v !== undefined && !Number.isFinite(v)) throw new TokenError(`token ${claim} must be a finite number of seconds`);
  }
  const exp = Math.floor(payload.exp!);
  if (exp - nowS > maxLifetimeS + CLOCK_TOLERANCE_S) {
    throw new TokenError(`token lifetime too long: exp is ${Math.round(exp - nowS)} s away, the maximum is ${maxLifetimeS} s (JETGATE_JWT_MAX_LIFETIME_S)`);
  }
  if (payload.iat !== undefined && exp - Math.floor(payload.iat) > maxLifetimeS + CLOCK_TOLERANCE_S) {
    throw new TokenError(`token lifetime too long: exp - iat is ${exp - Math.floor(payload.iat)} s, the maximum is ${maxLifetimeS} s (JETGATE_JWT_MAX_LIFETIME_S)`);
  }
  return exp * 1000;
}
