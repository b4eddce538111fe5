/**
 * Every process refuses a nats-server older than 2.12.1 at start-up, naming the version it found
 * (Debian's 2.9.10 plays the old server; scripts/test-deps.sh installs it).
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { natsVersionProblem } from "../../protocol/index.js";
import { loadConfig, connectNats, NatsServerTooOldError } from "../../protocol/io/index.js";
import { NatsServer, OLD_NATS_BIN } from "../harness/servers.js";

const old = await NatsServer.start({ bin: OLD_NATS_BIN });
const current = await NatsServer.start();
after(async () => {
  await old.dispose();
  await current.dispose();
});

test("nats version - connectNats refuses an old server with NATS_SERVER_TOO_OLD and the version found, and takes the pinned one", async () => {
  await assert.rejects(connectNats(loadConfig({ JETGATE_NATS_URL: old.url }), "test"), (err: unknown) => {
    assert.ok(err instanceof NatsServerTooOldError);
    assert.equal(err.code, "NATS_SERVER_TOO_OLD");
    assert.match(err.message, /nats-server 2\.9\.\d+ is too old: jetgate needs 2\.12\.1 or later/);
    assert.match(err.message, new RegExp(`connected to 127\\.0\\.0\\.1:${old.port}`));
    return true;
  });
  const nc = await connectNats(loadConfig({ JETGATE_NATS_URL: current.url }), "test");
  assert.equal(natsVersionProblem(nc.info?.version), undefined, nc.info?.version);
  await nc.close();
});

test("nats version - a worker started against an old server exits 1 with one line naming the version", async () => {
  const p = spawn(process.execPath, ["--import", "tsx", "worker/main.ts"], {
    env: { ...process.env, JETGATE_NATS_URL: old.url, JETGATE_REDIS_URL: "redis://127.0.0.1:1", JETGATE_LOG_LEVEL: "warn" },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stderr = "";
  p.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
  const code = await new Promise<number | null>((r) => p.on("exit", r));
  assert.equal(code, 1);
  assert.match(stderr, /^nats-server 2\.9\.\d+ is too old: jetgate needs 2\.12\.1 or later .*; connected to 127\.0\.0\.1:\d+\n$/);
});

test("nats version - the pinned server's build: a cached binary is used as it is; with no cache and no Go, a clear error names what to install", async () => {
  const run = (env: Record<string, string>) =>
    spawnSync(process.execPath, ["--import", "tsx", "scripts/pinned.ts", "install"], { env: { ...env, PATH: "/nonexistent" }, encoding: "utf8" });
  const cached = run({ HOME: process.env.HOME ?? "/root", ...(process.env.JETGATE_CACHE_DIR ? { JETGATE_CACHE_DIR: process.env.JETGATE_CACHE_DIR } : {}) });
  assert.equal(cached.status, 0, cached.stderr);
  assert.match(cached.stdout, /nats-server-v2\.15\.2\/nats-server\n$/);
  const empty = run({ JETGATE_CACHE_DIR: mkdtempSync(join(tmpdir(), "jetgate-cache-")) });
  assert.equal(empty.status, 1);
  assert.match(empty.stderr, /nats-server v2\.15\.2 is built with Go \(go install github\.com\/nats-io\/nats-server\/v2@v2\.15\.2\), and go is not on the PATH: install Go >= 1\.26/);
  // Debian bookworm's Go first on the PATH: named, not a build that fails halfway
  const bin = mkdtempSync(join(tmpdir(), "jetgate-oldgo-"));
  writeFileSync(join(bin, "go"), "#!/bin/sh\necho 'go version go1.19.8 linux/amd64'\n", { mode: 0o755 });
  const oldGo = spawnSync(process.execPath, ["--import", "tsx", "scripts/pinned.ts", "install"], { env: { JETGATE_CACHE_DIR: mkdtempSync(join(tmpdir(), "jetgate-cache-")), PATH: `${bin}:/usr/bin:/bin` }, encoding: "utf8" });
  assert.equal(oldGo.status, 1);
  assert.match(oldGo.stderr, /go version go1\.19\.8 linux\/amd64 is too old to build it: install Go >= 1\.26/);
  const usage = spawnSync(process.execPath, ["--import", "tsx", "scripts/pinned.ts"], { encoding: "utf8" });
  assert.equal(usage.status, 2);
  assert.match(usage.stderr, /usage: node --import tsx scripts\/pinned\.ts install/);
});
