/**
 * `npm start` as a new user meets it (scripts/start.ts): its own NATS and Redis in its stack dir
 * (whatever answers on 4222 and 6379), the greeting, `npm run dispatch` and the `jetgate` CLI
 * finding the running stack by themselves, Ctrl-C stopping everything at once with a line per
 * process, and a second start resuming the same mailboxes: the demo device sees every entry
 * once, old and new, across a split too. Then the ways it says no, in one line each.
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { NatsServer, OLD_NATS_BIN, freePort } from "../harness/servers.js";
import { waitFor } from "../harness/wait.js";

const ROOT = new URL("../../", import.meta.url);
const stackDir = mkdtempSync(join(tmpdir(), "jetgate-stack-"));
after(() => rmSync(stackDir, { recursive: true, force: true }));

/** The environment a new user has: no JETGATE_NATS_URL or JETGATE_REDIS_URL; ports free for the test. */
const userEnv = {
  PATH: process.env.PATH ?? "",
  HOME: process.env.HOME ?? "",
  JETGATE_STACK_DIR: stackDir,
  JETGATE_GATEWAY_PORT: String(await freePort()),
  JETGATE_WORKER_HTTP_PORT: String(await freePort()),
  JETGATE_GATEWAY_METRICS_PORT: String(await freePort()),
};

function npmStart(args: string[] = [], env: Record<string, string> = userEnv) {
  const start = spawn(process.execPath, ["--import", "tsx", "scripts/start.ts", ...args], { cwd: ROOT, env });
  let text = "";
  start.stdout.on("data", (d: Buffer) => (text += d.toString()));
  start.stderr.on("data", (d: Buffer) => (text += d.toString()));
  const exited = new Promise<number | null>((r) => start.once("exit", r));
  return { start, exited, out: () => text };
}

/** Ctrl-C: how long until it exited, and its exit code. */
async function ctrlC(s: ReturnType<typeof npmStart>): Promise<{ code: number | null; ms: number }> {
  const t0 = Date.now();
  s.start.kill("SIGINT");
  const code = await s.exited;
  return { code, ms: Date.now() - t0 };
}

const tool = (script: string[], env: Record<string, string> = userEnv) => spawnSync(process.execPath, script, { cwd: ROOT, env, encoding: "utf8" });
const dispatch = (text: string, env?: Record<string, string>) => tool(["--import", "tsx", "scripts/dispatch.ts", "--to", "demo", "--text", text], env);
/**
 * What a resume that went wrong prints, as the demo prints it: a close code in "connection closed
 * (<code>)", never a number inside a port or an id (a nats-server on 127.0.0.1:34503 once failed this).
 */
const RESUME_TROUBLE = /rebase failed|connection closed \(4503\)|\[demo\] its cursor is not one this stack gave out/;

test("npm start - the resume check reads close codes where they are printed, not inside ports", () => {
  assert.match("[demo] connection closed (4503); reconnecting", RESUME_TROUBLE);
  assert.match("[demo] its cursor is not one this stack gave out: starting over from the mailbox's start", RESUME_TROUBLE);
  assert.doesNotMatch("[start] starting nats-server (JetStream) on 127.0.0.1:34503, its store in .jetgate/nats", RESUME_TROUBLE);
  assert.doesNotMatch("[demo] seq 1:4503 lane=default id=m-4503 body=\"x\"", RESUME_TROUBLE);
});

const demoBodies = (out: string) => [...out.matchAll(/^\[demo\] seq .* body="([^"]*)"$/gm)].map((m) => m[1]);

test("npm start - its own stack, the greeting; dispatch and the CLI find it; Ctrl-C stops it all within 2 s, a line per process, no raw JSON", async () => {
  const s = npmStart();
  try {
    await waitFor("the welcome entry at the demo device", () => s.out().includes('body="welcome to jetgate"'), { timeoutMs: 90_000 });
    assert.match(s.out(), /starting nats-server \(JetStream\) on 127\.0\.0\.1:\d+, its store in .*nats/);
    assert.match(s.out(), /starting redis-server on 127\.0\.0\.1:\d+, its data in .*redis/);
    assert.match(s.out(), /registry initialised with 4 shards/);
    for (const row of ["devices", "demo page", "console", "metrics", "dispatch", "HTTP API"]) assert.match(s.out(), new RegExp(`^  ${row} +\\S`, "m"), row);
    assert.match(s.out(), /console +http:\/\/127\.0\.0\.1:\d+\/admin\/ +token: \S{16,}/);

    const d = dispatch("hello there");
    assert.equal(d.status, 0, d.stderr);
    assert.match(d.stdout, /^demo: shard \d+ seq \d+ \(\d+:\d+\) offset \d+/m, "the seq with its epoch:offset");
    await waitFor("the dispatched entry at the demo device", () => s.out().includes('body="hello there"'), { timeoutMs: 20_000 });
    const show = tool(["bin/jetgate.mjs", "registry", "show"]);
    assert.equal(show.status, 0, show.stderr);
    assert.match(show.stdout, /shard 0/);
    const bad = dispatch("x", { ...userEnv, JETGATE_LANES: "a.b" });
    assert.equal(bad.status, 1);
    assert.match(bad.stderr, /JETGATE_LANES: /, "a bad setting is named");
    assert.doesNotMatch(bad.stderr, /^\s+at /m, "no stack trace");
  } finally {
    const { code, ms } = await ctrlC(s);
    assert.equal(code, 0, s.out().slice(-2000));
    assert.ok(ms < 2000, `stopped in ${ms} ms`);
  }
  for (const p of ["the demo device", "worker", "gateway", "nats", "redis"]) assert.match(s.out(), new RegExp(`\\[start\\] stopped ${p}`), p);
  assert.doesNotMatch(s.out(), /^\s*\{|"level":/m, "no raw JSON");
  assert.deepEqual(demoBodies(s.out()), ["welcome to jetgate", "hello there"]);
});

test("npm start - stopped, dispatch and the CLI say so in one line, with the fix; a second start resumes: every entry once, old and new, across a split", async () => {
  for (const r of [dispatch("nobody home"), tool(["bin/jetgate.mjs", "registry", "show"])]) {
    assert.equal(r.status, 1);
    assert.equal(r.stderr.trim().split("\n").length, 1, `one line: ${r.stderr}`);
    assert.match(r.stderr, /is not running .*start it again with `npm start`/);
  }
  const none = dispatch("x", { ...userEnv, JETGATE_STACK_DIR: join(stackDir, "none") });
  assert.match(none.stderr, /no jetgate stack is running here .*npm start/);

  const s = npmStart();
  try {
    await waitFor("the demo device synced", () => /\[demo\] synced at seq/.test(s.out()), { timeoutMs: 60_000 });
    assert.match(s.out(), /registry of 4 shards found: resuming/);
    assert.match(s.out(), /the mailboxes of the last run, resumed/);
    assert.equal(dispatch("second run").status, 0);
    await waitFor("the new entry", () => s.out().includes('body="second run"'), { timeoutMs: 20_000 });
    const split = tool(["bin/jetgate.mjs", "shard", "split", "0"]);
    assert.equal(split.status, 0, split.stderr + split.stdout);
    assert.equal(dispatch("after the split").status, 0);
    await waitFor("the entry after the split", () => s.out().includes('body="after the split"'), { timeoutMs: 30_000 });
  } finally {
    const { code } = await ctrlC(s);
    assert.equal(code, 0, s.out().slice(-2000));
  }
  assert.deepEqual(demoBodies(s.out()), ["second run", "after the split"], "nothing of the first run again, nothing new twice");
  assert.doesNotMatch(s.out(), RESUME_TROUBLE);
});

test("npm start - --fresh starts clean and says so; a second npm start beside a running one is refused in one line", async () => {
  const s = npmStart(["--fresh"]);
  try {
    await waitFor("the welcome entry", () => s.out().includes('body="welcome to jetgate"'), { timeoutMs: 60_000 });
    assert.match(s.out(), /--fresh: removed the last run's nats, redis, demo-cursor\.json, stack\.json/);
    assert.match(s.out(), /registry initialised with 4 shards/);
    const again = npmStart();
    assert.equal(await again.exited, 1);
    assert.match(again.out(), /a jetgate stack already runs from .* \(npm start pid \d+/);
    assert.equal(again.out().trim().split("\n").length, 1, again.out());
  } finally {
    assert.equal((await ctrlC(s)).code, 0, s.out().slice(-2000));
  }
  assert.deepEqual(demoBodies(s.out()), ["welcome to jetgate"]);
});

test("npm start - a nats-server older than 2.12.1 named in JETGATE_NATS_URL is refused in one line, with the fix", async () => {
  const old = await NatsServer.start({ bin: OLD_NATS_BIN });
  try {
    const s = npmStart([], { ...userEnv, JETGATE_NATS_URL: old.url, JETGATE_STACK_DIR: join(stackDir, "old") });
    assert.equal(await s.exited, 1);
    assert.match(s.out(), new RegExp(`not using NATS at ${old.url.replaceAll(".", "\\.")} \\(JETGATE_NATS_URL\\): nats-server 2\\.9\\.\\d+ is too old: .*unset JETGATE_NATS_URL and npm start runs its own`));
    assert.doesNotMatch(s.out(), /^\s+at /m, "no stack trace");
  } finally {
    await old.dispose();
  }
});
