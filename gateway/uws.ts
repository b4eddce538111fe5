/**
 * Loads uWebSockets.js and proves that its native binary is what runs.
 *
 * The build installed under the `uWebSockets.js` alias (@btc-vision/uwebsockets.js 20.57.0, a
 * republish of upstream v20.57.0) has no pure-JS fallback: its require throws when the binary for
 * this platform and Node ABI does not load, which on Linux mostly means a glibc older than the one
 * its binaries (built on Ubuntu 24.04) need. That failure becomes one UwsLoadError that names the
 * glibc found, the one needed and the ways out. A build that loads without a uws_*.node of its own
 * (one with a fallback, pinned by a user) is refused too: the gateway never serves without it.
 */
import { readdirSync } from "node:fs";
import { createRequire } from "node:module";
import { basename, dirname, sep } from "node:path";
import type * as Uws from "uWebSockets.js";
import { JetgateError } from "../protocol/index.js";

/** The oldest glibc the Linux binaries of uWebSockets.js >= 20.55 load on (Ubuntu 24.04's). */
export const UWS_MIN_GLIBC = "2.38";

const WAYS_OUT = [
  "Ways out:",
  "  1. on this machine, the provisioned runtime (Node 24 on Debian 13's glibc, for development and tests): npm start, npm test",
  "     and the benchmarks use it by themselves; `npm run -s runtime` prints its path (docs/gateway.md#uwebsocketsjs)",
  "  2. the image (Dockerfile: node:24-trixie-slim, Debian 13, glibc 2.41)",
  `  3. an OS with glibc >= ${UWS_MIN_GLIBC} (Debian 13, Ubuntu 24.04 or later) and Node 22 or 24`,
].join("\n");

export class UwsLoadError extends JetgateError {
  constructor(message: string, cause?: unknown) {
    super("UWS_LOAD", message, { cause });
  }
}

export interface LoadedUws {
  uws: typeof Uws;
  /** The native module that was loaded (its path). */
  binary: string;
}

/** The glibc this process runs on ("2.41"); undefined where the C library is not glibc. */
export function glibcVersion(): string | undefined {
  const report = process.report.getReport() as { header?: { glibcVersionRuntime?: string } };
  return report.header?.glibcVersionRuntime;
}

/** a < b, for dotted versions ("2.36" < "2.38"). */
export function versionBelow(a: string, b: string): boolean {
  const [x, y] = [a.split(".").map(Number), b.split(".").map(Number)];
  for (let i = 0; i < Math.max(x.length, y.length); i++) if ((x[i] ?? 0) !== (y[i] ?? 0)) return (x[i] ?? 0) < (y[i] ?? 0);
  return false;
}

/**
 * uWebSockets.js (or the package at `from`: the tests point it at builds that fail), its native
 * binary loaded; throws UwsLoadError otherwise.
 */
export function loadUws(from = "uWebSockets.js"): LoadedUws {
  const require = createRequire(import.meta.url);
  let uws: typeof Uws;
  try {
    uws = require(from) as typeof Uws;
  } catch (err) {
    throw new UwsLoadError(explainLoadFailure(err, from, require), err);
  }
  // The module's own binary, in require.cache as <its folder>/uws_<platform>_<arch>_<abi>.node
  const dir = dirname(require.resolve(from)) + sep;
  const binary = Object.keys(require.cache).find((k) => k.startsWith(dir) && /^uws_[^/\\]+\.node$/.test(basename(k)));
  if (binary === undefined) {
    throw new UwsLoadError(`${from} loaded without a native binary of its own (no uws_*.node in ${dir}): a pure-JS fallback, which the gateway does not run on\n${WAYS_OUT}`);
  }
  return { uws, binary };
}

function explainLoadFailure(err: unknown, from: string, require: NodeJS.Require): string {
  const said = err instanceof Error ? err.message : String(err);
  const want = `uws_${process.platform}_${process.arch}_${process.versions.modules}.node`;
  const head = `${from} could not load its native binary ${want} (Node ${process.version}, ABI ${process.versions.modules})`;
  let dir: string | undefined;
  try {
    dir = dirname(require.resolve(from));
  } catch {
    return `${head}: the package is not installed (npm ci)\n${said}`;
  }
  const glibc = glibcVersion();
  // the loader names each version it misses: `GLIBC_2.38' not found
  const missing = [...said.matchAll(/GLIBC_(\d+\.\d+)' not found/g)].map((m) => m[1]!);
  const needed = missing.reduce((max, v) => (versionBelow(max, v) ? v : max), UWS_MIN_GLIBC);
  const abis = readdirSync(dir)
    .map((f) => new RegExp(`^uws_${process.platform}_${process.arch}_(\\d+)\\.node$`).exec(f)?.[1])
    .filter((a): a is string => a !== undefined);
  const lines = [head + ":"];
  if (!abis.includes(process.versions.modules)) {
    lines.push(`  the package has binaries for ABI ${abis.join(", ") || "none"} on ${process.platform}-${process.arch}, none for this Node (Node 22 is ABI 127, 24 is 137)`);
  }
  if (process.platform === "linux") {
    const runs = glibc === undefined ? "no glibc (musl?)" : `glibc ${glibc}${versionBelow(glibc, needed) ? "" : " (new enough: the loader's message says what else failed)"}`;
    lines.push(`  its binaries need glibc >= ${needed}; this process runs on ${runs}`);
  }
  lines.push(`  the loader said: ${said.split("\n").filter((l) => l.trim()).at(-1)}`, WAYS_OUT);
  return lines.join("\n");
}
