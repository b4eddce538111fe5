/**
 * The tools jetgate is tested with, pinned, and where their builds are kept: the nats-server every
 * test, benchmark and `npm start` runs, Helm, which lints and renders the chart in the tests, and
 * Centrifugo, which `npm run bench` compares jetgate with (and its `--nodes` test runs).
 *
 * Built from source with `go install` (the Go module proxy) into a cache folder outside the
 * checkout, once per machine: later runs and checkouts reuse them. `npm test` (scripts/test-deps.sh)
 * and `npm start` call `ensurePinnedNatsServer`; the test harness only reads `pinnedNatsServerPath`.
 *
 * `node --import tsx scripts/pinned.ts install [nats-server|helm|centrifugo]...` builds them (when missing) and
 * prints their paths (nats-server alone without a name); `... pinned.ts helm -- ARGS` runs Helm
 * (`npm run helm -- lint k8s/jetgate`). A build says what it builds, why and about how long it
 * takes, and every 10 s that it still runs.
 */
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, renameSync, rmSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

/** The release every test, benchmark and `npm start` runs (atomic batches with Nats-Msg-Id need 2.12.1). */
export const NATS_SERVER_VERSION = "v2.15.2";
/** The Helm the chart tests lint and render with. */
export const HELM_VERSION = "v4.3.1";
/** The Centrifugo `npm run bench` runs beside jetgate (bench/compare/centrifugo.ts). */
export const CENTRIFUGO_VERSION = "v6.9.1";

interface GoTool {
  pkg: string;
  version: string;
  /** Beside "install Go >= 1.26 (https://go.dev/dl/)": what else would do. */
  instead: string;
  /** What it is built for, in the one line said while it builds. */
  why: string;
  /** `-ldflags` of the build, where the release sets something there (the version a binary reports). */
  ldflags?: string;
}
const TOOLS = {
  "nats-server": {
    pkg: "github.com/nats-io/nats-server/v2",
    version: NATS_SERVER_VERSION,
    instead: "nats-server 2.15 needs it) or set NATS_SERVER_BIN to a nats-server >= 2.12.1",
    why: "jetgate needs 2.12.1 or later (atomic batch publish), and every test runs this one; about 1-2 minutes on 2 cores",
  },
  helm: {
    pkg: "helm.sh/helm/v4/cmd/helm",
    version: HELM_VERSION,
    instead: "Helm 4 needs a current one)",
    why: "the chart tests lint and render the chart with it; 4-15 minutes on 2 cores, the first time",
  },
  centrifugo: {
    pkg: "github.com/centrifugal/centrifugo/v6",
    version: CENTRIFUGO_VERSION,
    instead: "Centrifugo 6.9 needs a current one)",
    why: "`npm run bench` compares jetgate with it (the `centrifugo` system, and the --nodes test that runs it); about 3 minutes on 2 cores",
    // as its release builds do: without it the binary calls itself v0.0.0
    ldflags: `-X github.com/centrifugal/centrifugo/v6/internal/build.Version=${CENTRIFUGO_VERSION.slice(1)}`,
  },
} satisfies Record<string, GoTool>;
export type PinnedTool = keyof typeof TOOLS;

/** `$JETGATE_CACHE_DIR`, else `$XDG_CACHE_HOME/jetgate`, else `~/.cache/jetgate`. */
export function cacheDir(env: NodeJS.ProcessEnv = process.env): string {
  return env.JETGATE_CACHE_DIR ?? join(env.XDG_CACHE_HOME ?? join(homedir(), ".cache"), "jetgate");
}

export function pinnedPath(tool: PinnedTool, env: NodeJS.ProcessEnv = process.env): string {
  return join(cacheDir(env), `${tool}-${TOOLS[tool].version}`, tool);
}

export function pinnedNatsServerPath(env: NodeJS.ProcessEnv = process.env): string {
  return pinnedPath("nats-server", env);
}

/** The pinned Centrifugo (`npm run bench`'s `centrifugo` system); built by scripts/test-deps.sh or `pinned.ts install centrifugo`. */
export function pinnedCentrifugoPath(env: NodeJS.ProcessEnv = process.env): string {
  return pinnedPath("centrifugo", env);
}

/** Seconds between the lines that say a long step is still going. */
const HEARTBEAT_S = 10;

/**
 * Runs a long command, saying every HEARTBEAT_S seconds that it still runs and for how long; its
 * own output is shown only when it fails.
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

/** The pinned tool's path, built first when missing; throws naming what to install when Go is not there. */
export async function ensurePinned(tool: PinnedTool, log: (msg: string) => void = () => {}): Promise<string> {
  const bin = pinnedPath(tool);
  if (existsSync(bin)) return bin;
  const { pkg, version, instead, why, ldflags }: GoTool = TOOLS[tool];
  const go = spawnSync("go", ["version"], { encoding: "utf8" });
  const install = `install Go >= 1.26 (https://go.dev/dl/; ${instead}`;
  if (go.error !== undefined || go.status !== 0) throw new Error(`${tool} ${version} is built with Go (go install ${pkg}@${version}), and go is not on the PATH: ${install}`);
  // Go 1.21+ fetches the toolchain a module asks for; an older one (Debian bookworm's 1.19) cannot
  const minor = /go1\.(\d+)/.exec(go.stdout)?.[1];
  if (minor === undefined || Number(minor) < 21) throw new Error(`${tool} ${version} is built with Go, and ${go.stdout.trim() || "go"} is too old to build it: ${install}`);
  const dir = join(cacheDir(), `${tool}-${version}`);
  mkdirSync(dir, { recursive: true });
  log(`building ${tool} ${version} with ${go.stdout.trim().replace(/^go version /, "")}, once per machine: ${why}`);
  const flags = ldflags !== undefined ? [`-ldflags=${ldflags}`] : [];
  log(`  go install ${[...flags.map((f) => `'${f}'`), `${pkg}@${version}`].join(" ")} into ${dir}`);
  const t0 = Date.now();
  // built beside its place and renamed into it: a run reading it meanwhile never sees half a binary
  const tmp = mkdtempSync(join(dir, ".build-"));
  try {
    // CGO off: a static binary, and no C compiler needed
    await runLong(`building ${tool}`, "go", ["install", ...flags, `${pkg}@${version}`], { ...process.env, GOBIN: tmp, CGO_ENABLED: "0" }, log);
    if (!existsSync(join(tmp, tool))) throw new Error(`go install ${pkg}@${version} made no ${tool}`);
    renameSync(join(tmp, tool), bin);
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
  log(`built ${tool} ${version} in ${Math.round((Date.now() - t0) / 1000)} s`);
  return bin;
}

export function ensurePinnedNatsServer(log: (msg: string) => void = () => {}): Promise<string> {
  return ensurePinned("nats-server", log);
}

const USAGE = "usage: node --import tsx scripts/pinned.ts install [nats-server|helm|centrifugo]...  |  helm -- ARGS...";

async function main(args: string[]): Promise<number> {
  if (args[0] === "install" && args.slice(1).every((a) => Object.hasOwn(TOOLS, a))) {
    const tools = (args.length > 1 ? args.slice(1) : ["nats-server"]) as PinnedTool[];
    for (const t of tools) console.log(await ensurePinned(t, (m) => console.error(m)));
    return 0;
  }
  if (args[0] === "helm" && args[1] === "--") {
    return spawnSync(await ensurePinned("helm", (m) => console.error(m)), args.slice(2), { stdio: "inherit" }).status ?? 1;
  }
  console.error(USAGE);
  return 2;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  main(process.argv.slice(2)).then(
    (code) => (process.exitCode = code),
    (err: unknown) => {
      console.error(err instanceof Error ? err.message : String(err));
      process.exitCode = 1;
    },
  );
}
