/**
 * scripts/runtime.ts: the node `npm start`, `npm test` and the benchmarks run on. These tests run
 * on that node themselves (npm test starts them through it), so it is there and loads uWebSockets.js;
 * the provisioning's error paths run in a cache folder of their own.
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

test("runtime - npm run runtime prints a Node 24 that loads uWebSockets.js natively, and says which in one line", () => {
  const r = runtime([]);
  assert.equal(r.status, 0, r.stderr);
  const node = r.stdout.trim();
  assert.ok(existsSync(node), node);
  assert.match(r.stderr, /^\[runtime\] node v24\.\d+\.\d+ (\(this host's: it loads uWebSockets\.js natively\)|on Debian 13's glibc, provisioned \(.+\): \S+)\n$/);
  const probe = spawnSync(node, ["-e", "require('uWebSockets.js'); console.log(process.versions.node, Object.keys(require.cache).find((k) => /uws_linux_x64_\\d+\\.node$/.test(k)))"], { cwd: ROOT, encoding: "utf8" });
  assert.equal(probe.status, 0, probe.stderr);
  assert.match(probe.stdout, /^24\.\d+\.\d+ \S+uws_linux_x64_137\.node\n$/);
});

test("runtime - `--` runs the command on that node and exits as it exits", () => {
  const r = runtime(["--", "-e", "console.log(process.version, process.execPath); process.exit(7)"]);
  assert.equal(r.status, 7, r.stderr);
  assert.match(r.stdout, /^v24\.\d+\.\d+ \//);
  const killed = runtime(["--", "-e", "process.kill(process.pid, 'SIGTERM')"]);
  assert.equal(killed.status, 128 + 15, "a signal's death is the shell's 128 + its number");
});

test("runtime - a bad option is refused with the usage", () => {
  const r = runtime(["--node", "20"]);
  assert.equal(r.status, 2);
  assert.match(r.stderr, /usage: node --import tsx scripts\/runtime\.ts \[--node 22\|24\]/);
});

test("runtime - provisioning without its tools names every one missing, and builds nothing", () => {
  // Node 22 asked of a Node 24: it must be provisioned, here in an empty cache with nothing on the PATH
  const cache = join(dir, "cache-no-tools");
  const r = runtime(["--node", "22"], { JETGATE_CACHE_DIR: cache, PATH: "/nonexistent" });
  assert.equal(r.status, 1);
  assert.match(r.stderr, /^\[runtime\] provisioning Node 22\.\d+\.\d+ on Debian trixie's glibc needs apt-get, apt-config, dpkg-deb, tar, npm, gpgv\n/);
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
