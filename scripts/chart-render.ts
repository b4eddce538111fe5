/**
 * `npm run chart:render -- [-f values.yaml]... [--namespace NS] [NAME] [CHART]`: the chart rendered
 * as `helm template` renders it, by tools/chart-render (Go's text/template and sprig, which Debian
 * packages; helm itself it does not). CHART defaults to k8s/jetgate. The renderer is built into
 * node_modules/.cache/chart-render, again whenever its source changes.
 */
import { execFileSync, spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { copyFileSync, existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const SOURCE = join(ROOT, "tools/chart-render");
const SOURCE_FILES = ["main.go", "go.mod"];
export const CHART_DIR = join(ROOT, "k8s/jetgate");
/** Where Debian puts the Go sources its golang-*-dev packages carry. */
const GOCODE = "/usr/share/gocode";

/** What the renderer needs, and the Debian package that brings each. */
const NEEDS: [string, string][] = [
  ["github.com/Masterminds/sprig", "golang-github-masterminds-sprig-dev"],
  ["gopkg.in/yaml.v3", "golang-gopkg-yaml.v3-dev"],
  ["github.com/xeipuuv/gojsonschema", "golang-github-xeipuuv-gojsonschema-dev"],
];
export const DEBIAN_PACKAGES = ["golang-go", ...NEEDS.map(([, pkg]) => pkg)];

/** The Debian packages that are missing (none when the renderer can be built). */
export function missingPackages(): string[] {
  const missing: string[] = [];
  if (spawnSync("go", ["version"], { stdio: "ignore" }).status !== 0) missing.push("golang-go");
  for (const [dir, pkg] of NEEDS) if (!existsSync(join(GOCODE, "src", dir))) missing.push(pkg);
  return missing;
}

/** Builds tools/chart-render into outDir and returns the binary's path; throws naming what is missing. */
export function buildRenderer(outDir: string): string {
  const missing = missingPackages();
  if (missing.length > 0) {
    throw new Error(`the chart renderer needs Debian packages that are not installed: apt-get install -y ${missing.join(" ")}`);
  }
  // A GOPATH of its own (see main.go): Debian's sources are the second GOPATH entry.
  const pkgDir = join(outDir, "gopath/src/chart-render");
  mkdirSync(pkgDir, { recursive: true });
  for (const f of SOURCE_FILES) copyFileSync(join(SOURCE, f), join(pkgDir, f));
  const bin = join(outDir, "chart-render");
  const env: NodeJS.ProcessEnv = { ...process.env, GO111MODULE: "off", GOPATH: `${join(outDir, "gopath")}:${GOCODE}`, GOFLAGS: "" };
  if (!env.GOCACHE && !env.HOME && !env.XDG_CACHE_HOME) env.GOCACHE = join(outDir, "go-build");
  execFileSync("go", ["build", "-o", bin, "."], { cwd: pkgDir, env, stdio: ["ignore", "inherit", "inherit"] });
  return bin;
}

/** The renderer in node_modules/.cache/chart-render, built unless it is there for this source. */
export function cachedRenderer(): string {
  const dir = join(ROOT, "node_modules/.cache/chart-render");
  const hash = createHash("sha256");
  for (const f of SOURCE_FILES) hash.update(readFileSync(join(SOURCE, f)));
  const stamp = join(dir, "source.sha256");
  const bin = join(dir, "chart-render");
  const want = hash.digest("hex");
  if (existsSync(bin) && existsSync(stamp) && readFileSync(stamp, "utf8") === want) return bin;
  buildRenderer(dir);
  writeFileSync(stamp, want);
  return bin;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const args = process.argv.slice(2);
  // The chart is the argument that is a chart directory; without one, this repository's.
  if (!args.some((a) => existsSync(join(a, "Chart.yaml")))) args.push(CHART_DIR);
  try {
    const r = spawnSync(cachedRenderer(), args, { stdio: "inherit" });
    process.exitCode = r.status ?? 1;
  } catch (err) {
    console.error((err as Error).message);
    process.exitCode = 1;
  }
}
