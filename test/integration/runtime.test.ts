/**
 * scripts/runtime.ts: the node `npm start`, `npm test` and the benchmarks run on. These tests run
 * on such a node themselves (npm test starts them through runtime.ts: Node 24, or 22 for
 * test:node22), one that loads uWebSockets.js natively: asked from it, runtime.ts picks it. The
 * provisioning's error paths run in a cache folder of their own.
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ProvisionError, fetchTarball, moveIntoPlace } from "../../scripts/runtime-provision.js";

const ROOT = new URL("../../", import.meta.url);
const dir = mkdtempSync(join(tmpdir(), "jetgate-runtime-"));
after(() => rmSync(dir, { recursive: true, force: true }));

const runtime = (args: string[], env: NodeJS.ProcessEnv = process.env) =>
  spawnSync(process.execPath, ["--import", "tsx", "scripts/runtime.ts", ...args], { cwd: ROOT, env, encoding: "utf8" });

test("runtime - npm run runtime on a node >= 22 that loads uWebSockets.js natively prints that node, and says so in one line", () => {
  const r = runtime([]);
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.stdout, `${process.execPath}\n`);
  assert.equal(r.stderr, `[runtime] node ${process.version} (this host's: it loads uWebSockets.js natively)\n`);
  const probe = spawnSync(r.stdout.trim(), ["-e", "require('uWebSockets.js'); console.log(Object.keys(require.cache).find((k) => k.endsWith('.node')))"], { cwd: ROOT, encoding: "utf8" });
  assert.equal(probe.status, 0, probe.stderr);
  assert.match(probe.stdout, new RegExp(`/uws_linux_x64_${process.versions.modules}\\.node\\n$`));
});

test("runtime - `--` runs the command on that node and exits as it exits", () => {
  const r = runtime(["--", "-e", "console.log(process.version, process.execPath); process.exit(7)"]);
  assert.equal(r.status, 7, r.stderr);
  assert.equal(r.stdout, `${process.version} ${process.execPath}\n`);
  const killed = runtime(["--", "-e", "process.kill(process.pid, 'SIGTERM')"]);
  assert.equal(killed.status, 128 + 15, "a signal's death is the shell's 128 + its number");
});

test("runtime - a bad option is refused with the usage", () => {
  const r = runtime(["--node", "20"]);
  assert.equal(r.status, 2);
  assert.match(r.stderr, /usage: node --import tsx scripts\/runtime\.ts \[--node 22\|24\]/);
});

test("runtime - provisioning without its tools names every one missing, and builds nothing", () => {
  // an empty cache and nothing on the PATH
  const cache = join(dir, "cache-no-tools");
  const r = spawnSync(process.execPath, ["--import", "tsx", "-e", "import('./scripts/runtime-provision.ts').then((m) => m.ensureRuntime('22', 'a test', console.error)).catch((e) => { console.error(e.name + ': ' + e.message); process.exit(1); })"], {
    cwd: ROOT,
    env: { JETGATE_CACHE_DIR: cache, PATH: "/nonexistent" },
    encoding: "utf8",
  });
  assert.equal(r.status, 1);
  assert.equal(r.stderr, "ProvisionError: provisioning Node 22.23.5 on Debian trixie's glibc needs apt-get, apt-config, dpkg-deb, tar, npm, gpgv\n");
  assert.equal(existsSync(join(cache, "node-v22.23.5-trixie")), false);
});

test("runtime - a tarball whose sha512 is not the pinned one is refused, naming both", async () => {
  const lock = JSON.parse(readFileSync(new URL("package-lock.json", ROOT), "utf8")) as { packages: Record<string, { version: string; integrity: string }> };
  const { version, integrity } = lock.packages["node_modules/cluster-key-slot"]!;
  const good = join(dir, "good");
  const bad = join(dir, "bad");
  mkdirSync(good);
  mkdirSync(bad);
  assert.match(await fetchTarball(`cluster-key-slot@${version}`, integrity, good), /cluster-key-slot-1\.1\.2\.tgz$/);
  const wrong = `sha512-${Buffer.alloc(64, 1).toString("base64")}`;
  await assert.rejects(fetchTarball(`cluster-key-slot@${version}`, wrong, bad), (err: unknown) => {
    assert.ok(err instanceof ProvisionError);
    assert.equal(err.message, `cluster-key-slot@${version}: the tarball's sha512 is ${integrity}, not the pinned ${wrong}`);
    return true;
  });
});

test("runtime - two runs provisioning at once: the first rename wins, the second keeps out of its way", () => {
  const final = join(dir, "race", "node-v24-trixie");
  const [a, b] = [join(dir, "race", "tmp-a"), join(dir, "race", "tmp-b")];
  for (const [d, who] of [[a, "a"], [b, "b"]] as const) {
    mkdirSync(join(d, "bin"), { recursive: true });
    writeFileSync(join(d, "runtime.json"), who);
  }
  assert.equal(moveIntoPlace(a, final), true);
  assert.equal(moveIntoPlace(b, final), false);
  assert.equal(readFileSync(join(final, "runtime.json"), "utf8"), "a", "the first one's runtime stays whole");
  assert.equal(existsSync(b), true, "the loser's temp folder is its own to remove");
});
