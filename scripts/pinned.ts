/**
 * The nats-server jetgate is tested and measured on, pinned, and where its build is kept.
 *
 * Built from source with `go install` (the Go module proxy) into a cache folder outside the
 * checkout, once per machine: later runs and checkouts reuse it. `npm test` (scripts/test-deps.sh)
 * and `npm start` call `ensurePinnedNatsServer`; the test harness only reads `pinnedNatsServerPath`.
 *
 * `node --import tsx scripts/pinned.ts install` builds it (when missing) and prints its path.
 */
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

/** The release every test, benchmark and `npm start` runs (atomic batches with Nats-Msg-Id need 2.12.1). */
export const NATS_SERVER_VERSION = "v2.15.2";
const NATS_MODULE = "github.com/nats-io/nats-server/v2";

/** `$JETGATE_CACHE_DIR`, else `$XDG_CACHE_HOME/jetgate`, else `~/.cache/jetgate`. */
export function cacheDir(env: NodeJS.ProcessEnv = process.env): string {
  return env.JETGATE_CACHE_DIR ?? join(env.XDG_CACHE_HOME ?? join(homedir(), ".cache"), "jetgate");
}

export function pinnedNatsServerPath(env: NodeJS.ProcessEnv = process.env): string {
  return join(cacheDir(env), `nats-server-${NATS_SERVER_VERSION}`, "nats-server");
}

/** The pinned nats-server's path, built first when missing; throws naming what to install when Go is not there. */
export function ensurePinnedNatsServer(log: (msg: string) => void = () => {}): string {
  const bin = pinnedNatsServerPath();
  if (existsSync(bin)) return bin;
  const go = spawnSync("go", ["version"], { encoding: "utf8" });
  const install = `install Go >= 1.26 (https://go.dev/dl/; nats-server 2.15 needs it) or set NATS_SERVER_BIN to a nats-server >= 2.12.1`;
  if (go.status !== 0) {
    throw new Error(`nats-server ${NATS_SERVER_VERSION} is built with Go (go install ${NATS_MODULE}@${NATS_SERVER_VERSION}), and go is not on the PATH: ${install}`);
  }
  // Go 1.21+ fetches the 1.26 toolchain nats-server asks for; an older one (Debian bookworm's 1.19) cannot
  const minor = /go1\.(\d+)/.exec(go.stdout)?.[1];
  if (minor === undefined || Number(minor) < 21) {
    throw new Error(`nats-server ${NATS_SERVER_VERSION} is built with Go, and ${go.stdout.trim() || "go"} is too old to build it: ${install}`);
  }
  const dir = join(cacheDir(), `nats-server-${NATS_SERVER_VERSION}`);
  mkdirSync(dir, { recursive: true });
  log(`building nats-server ${NATS_SERVER_VERSION} into ${dir} (go install, once per machine; about a minute)`);
  const r = spawnSync("go", ["install", `${NATS_MODULE}@${NATS_SERVER_VERSION}`], {
    stdio: ["ignore", "inherit", "inherit"],
    // CGO off: a static binary, and no C compiler needed
    env: { ...process.env, GOBIN: dir, CGO_ENABLED: "0" },
  });
  if (r.status !== 0 || !existsSync(bin)) throw new Error(`go install ${NATS_MODULE}@${NATS_SERVER_VERSION} failed (exit ${r.status})`);
  return bin;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  if (process.argv[2] !== "install") {
    console.error("usage: node --import tsx scripts/pinned.ts install");
    process.exit(2);
  }
  try {
    console.log(ensurePinnedNatsServer((m) => console.error(m)));
  } catch (err) {
    console.error(err instanceof Error ? err.message : String(err));
    process.exit(1);
  }
}
