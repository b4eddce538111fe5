/**
 * The operator console against a real stack: off without JETGATE_ADMIN_TOKEN, the token required,
 * the state's shape, and in Chromium the page showing the registry, the processes, and a split done
 * with the CLI appearing. UPDATE_SCREENSHOTS=1 writes the screenshot docs/operations.md
 * shows (docs/img/console.png); otherwise it goes to a temp dir.
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium, type Browser } from "playwright-core";
import { UserLookupSchema } from "../../gateway/http/users-api.js";
import { AdminStateSchema } from "../../gateway/http/admin.js";
import { redisClient, startStack, spawnGateway, spawnWorker, type JetgateProcess } from "../harness/stack.js";
import { OPS_STATS_SUBJECT, rangeLabel } from "../../protocol/index.js";
import { runCli } from "../harness/cli.js";
import { TestDevice, deviceToken } from "../harness/device.js";
import { waitFor } from "../harness/wait.js";

const CHROMIUM = process.env.CHROMIUM_PATH ?? "/usr/bin/chromium";
if (!existsSync(CHROMIUM)) throw new Error(`${CHROMIUM} is missing: apt-get install -y chromium (npm test does as root: scripts/test-deps.sh)`);

const TOKEN = "console-test-token-0123456789";
const stack = await startStack({ env: { JETGATE_LEASE_MS: "1000" }, gateway: { JETGATE_ADMIN_TOKEN: TOKEN } });
const extra: JetgateProcess[] = [await spawnWorker(stack.infra.env), await spawnGateway(stack.infra.env)];
let browser: Browser | undefined;
const devices: TestDevice[] = [];
after(async () => {
  for (const d of devices) d.ws.close();
  await browser?.close();
  for (const p of extra) await p.kill();
  await stack.dispose();
});

const base = () => `http://127.0.0.1:${stack.gateway!.httpPort}`;
const state = (token?: string) => fetch(`${base()}/admin/api/state`, { headers: token === undefined ? {} : { authorization: `Bearer ${token}` } });

test("console - off without JETGATE_ADMIN_TOKEN: 404 saying how to turn it on", async () => {
  const other = extra[1]!;
  for (const path of ["/admin/", "/admin/api/state"]) {
    const res = await fetch(`http://127.0.0.1:${other.httpPort}${path}`);
    assert.equal(res.status, 404);
    assert.equal(await res.text(), "the console is off: set JETGATE_ADMIN_TOKEN\n");
  }
});

test("console - the state needs the token (401 without or wrong), and has every shard, stream head and process", async () => {
  assert.equal((await state()).status, 401);
  const wrong = await state("nope-nope-nope-nope");
  assert.equal(wrong.status, 401);
  assert.deepEqual(await wrong.json(), { error: "missing or wrong bearer token (JETGATE_ADMIN_TOKEN)" });
  await waitFor("both workers and gateways answer", async () => {
    const st = AdminStateSchema.parse(await (await state(TOKEN)).json());
    return st.processes.filter((p) => p.kind === "worker").length === 2 && st.processes.filter((p) => p.kind === "gateway").length === 2;
  }, { timeoutMs: 20_000 });
  const st = AdminStateSchema.parse(await (await state(TOKEN)).json());
  assert.equal(st.registry.shards.length, 2);
  assert.deepEqual(st.streams.map((s) => s.shard), [0, 1]);
  assert.equal(st.limits.maxOffset, String(2n ** 48n - 1n));
  assert.ok(st.processes.every((p) => p.regressions === 0 && p.dependencies.nats && p.dependencies.redis));
  assert.equal(st.processes.filter((p) => p.kind === "worker").flatMap((w) => w.shards ?? []).length, 2, "every shard run by one worker");
});

test("console - the page, its script and stylesheet: a CSP without inline script or style and no framing, nosniff, DENY", async () => {
  const page = await fetch(`${base()}/admin/`);
  assert.equal(page.status, 200);
  const csp = page.headers.get("content-security-policy") ?? "";
  assert.match(csp, /script-src 'self'/);
  assert.match(csp, /style-src 'self'/);
  assert.match(csp, /frame-ancestors 'none'/);
  assert.doesNotMatch(csp, /unsafe-inline/);
  assert.equal(page.headers.get("x-frame-options"), "DENY");
  assert.equal(page.headers.get("x-content-type-options"), "nosniff");
  const html = await page.text();
  assert.doesNotMatch(html, /<script>|<script(?![^>]*\ssrc=)[^>]*>|<style/, "no inline script or style");
  assert.match(html, /<script src="\/admin\/app\.js" defer><\/script>/);
  for (const [path, type] of [["/admin/app.js", "text/javascript"], ["/admin/app.css", "text/css"]] as const) {
    const res = await fetch(`${base()}${path}`);
    assert.equal(res.status, 200, path);
    assert.match(res.headers.get("content-type") ?? "", new RegExp(`^${type}`));
    assert.equal(res.headers.get("x-content-type-options"), "nosniff");
    assert.ok((await res.text()).length > 1000, path);
  }
  const st = await state(TOKEN);
  assert.equal(st.headers.get("x-content-type-options"), "nosniff");
  assert.equal(st.headers.get("cache-control"), "no-store");
});

test("console - wrong tokens are throttled per client address: after 10, 429 with Retry-After; the right token is still served", async () => {
  const g = await spawnGateway(stack.infra.env, { JETGATE_ADMIN_TOKEN: TOKEN });
  try {
    const at = (token: string) => fetch(`http://127.0.0.1:${g.httpPort}/admin/api/state`, { headers: { authorization: `Bearer ${token}` } });
    for (let i = 0; i < 10; i++) assert.equal((await at(`wrong-token-${i}`)).status, 401, `attempt ${i}`);
    const throttled = await at("wrong-again");
    assert.equal(throttled.status, 429);
    const retry = Number(throttled.headers.get("retry-after"));
    assert.ok(retry >= 1 && retry <= 6, `Retry-After ${retry}`);
    assert.match(((await throttled.json()) as { error: string }).error, /^too many wrong tokens from this address: try again in \d+ s$/);
    // another tab at the same address (an office NAT) is not locked out by a mistyped token
    assert.equal((await at(TOKEN)).status, 200, "the right token, while the address is held off");
    assert.equal((await at("wrong-once-more")).status, 429, "wrong ones still are");
  } finally {
    await g.kill();
  }
});

test("console - the state is read once however many tabs poll: 20 polls at once, one request on jetgate.ops.stats", async () => {
  const g = await spawnGateway(stack.infra.env, { JETGATE_ADMIN_TOKEN: TOKEN });
  const requests = stack.nc.subscribe(OPS_STATS_SUBJECT);
  let seen = 0;
  void (async () => {
    for await (const _ of requests) seen++;
  })();
  try {
    await stack.nc.flush();
    const polls = await Promise.all(Array.from({ length: 20 }, () => fetch(`http://127.0.0.1:${g.httpPort}/admin/api/state`, { headers: { authorization: `Bearer ${TOKEN}` } })));
    assert.ok(polls.every((r) => r.status === 200));
    assert.equal(seen, 1, "one stats request for 20 polls");
  } finally {
    requests.unsubscribe();
    await g.kill();
  }
});

test("console - with JETGATE_OPS_KEY only signed answers are shown: a fake worker's, and unsigned ones, are counted, not shown; an oversized answer is not read", async () => {
  const key = Buffer.alloc(32, 9).toString("base64");
  const g = await spawnGateway(stack.infra.env, { JETGATE_ADMIN_TOKEN: TOKEN, JETGATE_OPS_KEY: key });
  const fake = stack.nc.subscribe(OPS_STATS_SUBJECT, {
    callback: (_e, m) => void m.respond(JSON.stringify({ kind: "worker", id: "fake", startedAt: 0, regressions: 123456, dependencies: { nats: true, redis: true }, shards: [{ shard: 0, offset: 0, lag: 0 }] })),
  });
  const flood = stack.nc.subscribe(OPS_STATS_SUBJECT, { callback: (_e, m) => void m.respond(new Uint8Array(600 * 1024)) });
  try {
    await stack.nc.flush();
    const st = AdminStateSchema.parse(await (await fetch(`http://127.0.0.1:${g.httpPort}/admin/api/state`, { headers: { authorization: `Bearer ${TOKEN}` } })).json());
    assert.deepEqual(st.processes.map((p) => p.kind), ["gateway"], "only the keyed gateway's own answer");
    assert.ok(st.processes.every((p) => p.regressions === 0));
    assert.ok(st.replies.unverified >= 4, `the fake and the processes without the key (${JSON.stringify(st.replies)})`);
    assert.equal(st.replies.tooLarge, 1);
  } finally {
    fake.unsubscribe();
    flood.unsubscribe();
    await g.kill();
  }
});

test("console - a dependency that does not answer is named, the rest shown: Redis paused, the state within 3 s with `down` naming the lease read", async () => {
  const g = await spawnGateway(stack.infra.env, { JETGATE_ADMIN_TOKEN: TOKEN });
  const r = await redisClient(stack.infra.redis.url);
  try {
    assert.equal(await r.call("CLIENT", "PAUSE", "5000", "ALL"), "OK");
    const t0 = Date.now();
    const res = await fetch(`http://127.0.0.1:${g.httpPort}/admin/api/state`, { headers: { authorization: `Bearer ${TOKEN}` } });
    const ms = Date.now() - t0;
    assert.equal(res.status, 200);
    const st = AdminStateSchema.parse(await res.json());
    assert.ok(ms < 3000, `answered in ${ms} ms`);
    assert.deepEqual(st.down.map((d) => [d.dependency, d.what]), [["redis", "lease holders"]]);
    assert.match(st.down[0]!.error, /^no answer in 1500 ms$/);
    assert.equal(st.registry.shards.length > 0 && st.streams.every((s) => s.error === undefined), true, "what answered is shown");
  } finally {
    await r.call("CLIENT", "UNPAUSE").catch(() => undefined);
    r.disconnect();
    await g.kill();
  }
});

test("console - the user lookup: 401 without the token, 400 for a bad id, else the mailbox's position, the live sessions and the newest entries", async () => {
  const lookup = (user: string, token?: string) => fetch(`${base()}/admin/api/user/${user}`, { headers: token === undefined ? {} : { authorization: `Bearer ${token}` } });
  assert.equal((await lookup("lu0")).status, 401);
  const bad = await lookup("a.b", TOKEN);
  assert.equal(bad.status, 400);
  assert.match(((await bad.json()) as { error: string }).error, /user id/);
  const dev = await TestDevice.connect(extra[1]!.httpPort);
  devices.push(dev);
  dev.send({ t: "AUTH", v: 1, token: await deviceToken("lu0"), device: "tab" });
  await dev.next("SYNCED");
  const ids = Array.from({ length: 25 }, (_, i) => `lu${i}`);
  for (const id of ids) await stack.dispatcher.dispatch({ dispatch_id: id, message_id: id, lane: "default", recipients: ["lu0"], body: new Uint8Array(3) });
  const body = await waitFor("every entry processed", async () => {
    const r = await lookup("lu0", TOKEN);
    const b = UserLookupSchema.parse(await r.json());
    return b.entries.at(-1)?.id === "lu24" ? b : undefined;
  });
  assert.deepEqual(body.entries.map((e) => e.id), ids.slice(5), "the newest 20, newest last");
  assert.equal(body.entries[0]!.bytes, 3);
  assert.equal(body.mailbox.shard, stack.registry.shards.shardOf("lu0"));
  assert.equal(body.mailbox.head, body.entries.at(-1)!.seq);
  assert.deepEqual(body.presence.map((p) => p.device), ["tab"]);
});

test("console - in Chromium: the token, the shards with their bars, the processes, and a split done with the CLI appears", async () => {
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  // something to show: devices on both gateways, entries in the streams
  for (const [i, g] of [stack.gateway!, extra[1]!, stack.gateway!].entries()) {
    const dev = await TestDevice.connect(g.httpPort);
    devices.push(dev);
    dev.send({ t: "AUTH", v: 1, token: await deviceToken(`cu${i}`), device: "d1" });
    await dev.next("AUTH_OK");
  }
  for (let i = 0; i < 300; i++) await stack.dispatcher.dispatch({ dispatch_id: `c${i}`, message_id: `c${i}`, lane: "default", recipients: [`cu${i % 30}`], body: new Uint8Array(8) });
  const page = await browser.newPage({ viewport: { width: 1440, height: 900 } });
  const problems: string[] = [];
  page.on("pageerror", (e) => problems.push(e.message));
  // the wrong token's 401 is the browser's one expected error line
  page.on("console", (m) => m.type() === "error" && !m.text().includes("status of 401") && problems.push(m.text()));
  await page.goto(`${base()}/admin/`);
  await page.fill("#token", "a-wrong-token-of-length");
  await page.click("button");
  await page.waitForSelector("#error:has-text('wrong token')");
  await page.fill("#token", TOKEN);
  await page.click("button");
  await page.waitForSelector("#shards tr:nth-child(3)");
  assert.equal(await page.locator("#shards tr").count(), 3, "a header and two shards");
  // ranges read as the CLI prints them
  const range1 = stack.registry.state.shards.get(1)!.range;
  assert.match(await page.textContent("#shards tr:nth-child(3)") ?? "", new RegExp(`\\(${rangeLabel(range1)}\\)`));
  await page.waitForFunction(() => document.querySelectorAll("#gateways tr").length === 3 && document.querySelectorAll("#workers tr").length === 3);
  await page.waitForFunction(() => Array.from(document.querySelectorAll("#gateways td.num")).some((td) => td.textContent === "2"));
  assert.match(await page.textContent("#regressions") ?? "", /regressions 0/);

  // the user lookup (before the split: it reads the user's current shard): the mailbox's position, the device online, the newest entries
  await page.fill("#user", "cu0");
  await page.click("#user-form button");
  await page.waitForSelector("#user-entries tr:nth-child(2)");
  assert.match(await page.textContent("#user-mailbox") ?? "", /shard \d+ · epoch \d+ · log \S+ · head \d+ \(\d+:\d+\) · trim 0 \(0:0\) · lanes default \d+ \(\d+:\d+\)/);
  assert.equal(await page.textContent("#user-presence tr:nth-child(2) td:first-child"), "d1");
  assert.equal(await page.locator("#user-entries tr").count(), 11, "a header and cu0's ten entries");
  const split = await runCli(stack.infra.env, ["shard", "split", "0"]);
  assert.equal(split.code, 0, split.text);
  await page.waitForSelector("#shards tr:nth-child(4)", { timeout: 15_000 });
  // the timeline has the split: a green (split) marker and the link to the child
  await page.waitForFunction(() => Array.from(document.querySelectorAll("#timeline circle title")).some((t) => t.textContent?.includes(": split")));
  await page.waitForFunction(() => document.querySelectorAll("#timeline path").length >= 1);
  assert.equal(await page.textContent("#shards tr:nth-child(4) td:first-child"), "2", "the child shard has a row");
  const dir = process.env.UPDATE_SCREENSHOTS === "1" ? fileURLToPath(new URL("../../docs/img/", import.meta.url)) : mkdtempSync(join(tmpdir(), "jetgate-console-"));
  await page.screenshot({ path: join(dir, "console.png"), fullPage: true });
  assert.deepEqual(problems, [], "no script errors on the page");
});
