/**
 * The nats-server jetgate is tested and measured on, pinned, and where its build is kept.
 *
 * Built from source with `go install` (the Go module proxy) into a cache folder outside the
 * checkout, once per machine: later runs and checkouts reuse it. `npm test` (scripts/test-deps.sh)
 * and `npm start` call `ensurePinnedNatsServer`; the test harness only reads `pinnedNatsServerPath`.
 *
 * `node --import tsx scripts/pinned.ts install` builds it (when missing) and prints its path; the
 * build says what it builds, why and how long it takes, and that it still runs every 10 s.
 */
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, renameSync, rmSync } from "node:fs";
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

/** Seconds between the lines that say a long step is still going. */
const HEARTBEAT_S = 10;

/**
 * Runs a long command, saying every HEARTBEAT_S seconds that it still runs and for how long; its
 * own output goes to `log` (shown only when it fails).
 */
export function runLong(what: string, cmd: string, args: string[], env: NodeJS.ProcessEnv, say: (msg: string) => void): Promise<void> {
  const t0 = Date.now();
  return new Promise((resolve, reject) => {
    const p = spawn(cmd, args, { env, stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    p.stdout.on("data", (d: Buffer) => (out += d.toString()));
    p.stderr.on("data", (d: Buffer) => (out += d.toString()));
    const beat = setInterval(() => say(`  ... still ${what} (${Math.round((Date.now() - t0) / 1000)} s)`), HEARTBEAT_S * 1000);
    p.once("error", (err) => {
      clearInterval(beat);
      reject(err);
    });
    p.once("exit", (code) => {
      clearInterval(beat);
      if (code === 0) resolve();
      else reject(new Error(`${what} failed (exit ${code}):\n${out.trim().split("\n").slice(-15).join("\n")}`));
    });
  });
}

/** The pinned nats-server's path, built first when missing; throws naming what to install when Go is not there. */
export async function ensurePinnedNatsServer(log: (msg: string) => void = () => {}): Promise<string> {
  const bin = pinnedNatsServerPath();
  if (existsSync(bin)) return bin;
  const go = spawnSync("go", ["version"], { encoding: "utf8" });
  const install = `install Go >= 1.26 (https://go.dev/dl/; nats-server 2.15 needs it) or set NATS_SERVER_BIN to a nats-server >= 2.12.1`;
  if (go.error !== undefined || go.status !== 0) {
    throw new Error(`nats-server ${NATS_SERVER_VERSION} is built with Go (go install ${NATS_MODULE}@${NATS_SERVER_VERSION}), and go is not on the PATH: ${install}`);
  }
  // Go 1.21+ fetches the 1.26 toolchain nats-server asks for; an older one (Debian bookworm's 1.19) cannot
  const minor = /go1\.(\d+)/.exec(go.stdout)?.[1];
  if (minor === undefined || Number(minor) < 21) {
    throw new Error(`nats-server ${NATS_SERVER_VERSION} is built with Go, and ${go.stdout.trim() || "go"} is too old to build it: ${install}`);
  }
  const dir = join(cacheDir(), `nats-server-${NATS_SERVER_VERSION}`);
  mkdirSync(dir, { recursive: true });
  log(`building nats-server ${NATS_SERVER_VERSION} (jetgate needs 2.12.1 or later: atomic batch publish) with ${go.stdout.trim().replace(/^go version /, "")}`);
  log(`  go install ${NATS_MODULE}@${NATS_SERVER_VERSION} into ${dir}: once per machine, about 1-2 minutes on 2 cores`);
  const t0 = Date.now();
  // built in a folder of its own, then moved: two builds at once (npm test beside npm start) never see half a binary
  const tmp = mkdtempSync(join(dir, ".build-"));
  try {
    // CGO off: a static binary, and no C compiler needed
    await runLong("building nats-server", "go", ["install", `${NATS_MODULE}@${NATS_SERVER_VERSION}`], { ...process.env, GOBIN: tmp, CGO_ENABLED: "0" }, log);
    renameSync(join(tmp, "nats-server"), bin);
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
  log(`built nats-server ${NATS_SERVER_VERSION} in ${Math.round((Date.now() - t0) / 1000)} s`);
  return bin;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  if (process.argv[2] !== "install") {
    console.error("usage: node --import tsx scripts/pinned.ts install");
    process.exit(2);
  }
  ensurePinnedNatsServer((m) => console.error(m)).then(
    (bin) => console.log(bin),
    (err: unknown) => {
      console.error(err instanceof Error ? err.message : String(err));
      process.exit(1);
    },
  );
}
