/**
 * Device JWT verification (jose). `sub` is the user; an optional `dev` claim binds the token to one
 * device. `exp` is required. Only the algorithms of the configured keys are accepted: HS256 for a
 * shared secret (local runs), EdDSA/ES256 for public keys (a PEM file of one or more keys, or a JWKS
 * file) — so `alg: none` and key-confusion tokens (HS256 signed with a public key) are refused.
 */
import { readFileSync } from "node:fs";
import { createLocalJWKSet, importSPKI, jwtVerify, type JWTPayload, type JWTVerifyGetKey, type KeyObject, type CryptoKey } from "jose";
import { JetgateError, idProblem } from "../protocol/index.js";

export class TokenError extends JetgateError {
  constructor(message: string, options?: { cause?: unknown }) {
    super("UNAUTHORIZED", message, options);
  }
}

export interface DeviceClaims {
  user: string;
  /** Device the token is bound to, if it names one. */
  device: string | undefined;
  /** Expiry, ms since the epoch. */
  expiresAt: number;
}

export interface TokenVerifier {
  verify(token: string): Promise<DeviceClaims>;
}

type Key = Uint8Array | KeyObject | CryptoKey | JWTVerifyGetKey;

/** Builds the verifier from JETGATE_JWT_SECRET or JETGATE_JWT_PUBLIC_KEYS_FILE. */
export async function tokenVerifier(opts: { secret?: string | undefined; previousSecret?: string | undefined; publicKeysFile?: string | undefined }): Promise<TokenVerifier> {
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
    keys = [opts.secret, ...(opts.previousSecret !== undefined ? [opts.previousSecret] : [])].map((k) => new TextEncoder().encode(k));
    algorithms = ["HS256"];
  } else {
    throw new TokenError("no JWT key configured: set JETGATE_JWT_SECRET or JETGATE_JWT_PUBLIC_KEYS_FILE");
  }
  return {
    async verify(token) {
      let payload: JWTPayload | undefined;
      let lastError: unknown;
      for (const key of keys) {
        try {
          ({ payload } = await jwtVerify(token, key as Uint8Array, { algorithms, requiredClaims: ["exp", "sub"], clockTolerance: 5 }));
          break;
        } catch (err) {
          lastError = err;
        }
      }
      if (payload === undefined) {
        const why = lastError instanceof Error ? `${(lastError as { code?: string }).code ?? lastError.name}: ${lastError.message}` : "invalid";
        throw new TokenError(`token rejected (${why})`, { cause: lastError });
      }
      const user = payload.sub;
      const p = idProblem("user", user);
      if (p !== undefined) throw new TokenError(`token sub: user id ${p}`);
      const dev = payload.dev;
      if (dev !== undefined && idProblem("device", dev) !== undefined) throw new TokenError("token dev claim is not a valid device id");
      return { user: user!, device: dev as string | undefined, expiresAt: payload.exp! * 1000 };
    },
  };
}
