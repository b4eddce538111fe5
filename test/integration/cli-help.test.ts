/**
 * Every command a user runs answers `--help` with its usage (exit 0), and an unknown flag with what
 * is wrong and the usage (exit 64), never a stack trace.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));

function run(cmd: string, args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  // no NATS or Redis to reach: nothing here may get that far
  const proc = spawn(cmd, args, { cwd: ROOT, env: { PATH: process.env.PATH ?? "", JETGATE_NATS_URL: "nats://127.0.0.1:1", JETGATE_REDIS_URL: "redis://127.0.0.1:1" } });
  let stdout = "";
  let stderr = "";
  proc.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
  proc.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
  return new Promise((resolve) => proc.on("exit", (code) => resolve({ code, stdout, stderr })));
}

const node = (script: string) => (args: string[]) => run(process.execPath, ["--import", "tsx", script, ...args]);
const COMMANDS: [string, (args: string[]) => ReturnType<typeof run>][] = [
  ["jetgate", (args) => run(process.execPath, ["bin/jetgate.mjs", ...args])],
  ["npm start", node("scripts/start.ts")],
  ["npm run dispatch", node("scripts/dispatch.ts")],
  ["npm run bench", node("bench/compare/run.ts")],
  ["npm run soak", node("test/soak/soak.ts")],
];

const STACK = /^\s+at .+:\d+:\d+\)?$/m;

for (const [name, cmd] of COMMANDS) {
  test(`cli - ${name} --help: usage, exit 0; an unknown flag: what is wrong and usage, exit 64, no stack trace`, async () => {
    const help = await cmd(["--help"]);
    assert.equal(help.code, 0, help.stderr);
    assert.match(help.stdout, /^usage:/);
    const bad = await cmd(["--no-such-flag"]);
    assert.equal(bad.code, 64, bad.stdout + bad.stderr);
    assert.match(bad.stderr, /no-such-flag/);
    assert.match(bad.stderr, /usage:/);
    assert.doesNotMatch(bad.stderr, STACK);
  });
}

test("cli - npm passes --help through: `npm run dispatch -- --help` exits 0", async () => {
  const r = await run("npm", ["run", "--silent", "dispatch", "--", "--help"]);
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /^usage: npm run dispatch/);
});

test("cli - npm run bench with a bad --generators names it, with the usage (64), before starting anything", async () => {
  const r = await node("bench/compare/run.ts")(["hot", "--generators", "0"]);
  assert.equal(r.code, 64, r.stdout + r.stderr);
  assert.match(r.stderr, /--generators must be a positive integer, got 0\nusage:/);
  assert.doesNotMatch(r.stderr, STACK);
});

test("cli - jetgate with an unknown command names it (64)", async () => {
  const r = await run(process.execPath, ["bin/jetgate.mjs", "shard", "explode", "1"]);
  assert.equal(r.code, 64);
  assert.match(r.stderr, /^unknown command: shard explode\nusage:/);
});
