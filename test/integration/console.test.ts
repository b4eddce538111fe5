/**
 * The operator console against a real stack: off without JETGATE_ADMIN_TOKEN, the token required,
 * the state's shape, and in Chromium the page showing the registry, the processes, and a split done
 * with the CLI appearing. JETGATE_UPDATE_SCREENSHOTS=1 writes the screenshot docs/operations.md
 * shows (docs/img/console.png); otherwise it goes to a temp dir.
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium, type Browser } from "playwright-core";
import { AdminStateSchema } from "../../gateway/admin.js";
import { startStack, spawnGateway, spawnWorker, type JetgateProcess } from "../harness/stack.js";
import { runCli } from "../harness/cli.js";
import { TestDevice, deviceToken } from "../harness/device.js";
import { waitFor } from "../harness/wait.js";

const CHROMIUM = process.env.CHROMIUM_PATH ?? "/usr/bin/chromium";
if (!existsSync(CHROMIUM)) throw new Error(`${CHROMIUM} is missing: apt-get install -y chromium (.ci/run does)`);

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
  await page.waitForFunction(() => document.querySelectorAll("#gateways tr").length === 3 && document.querySelectorAll("#workers tr").length === 3);
  await page.waitForFunction(() => Array.from(document.querySelectorAll("#gateways td.num")).some((td) => td.textContent === "2"));
  assert.match(await page.textContent("#regressions") ?? "", /regressions 0/);

  const split = await runCli(stack.infra.env, ["shard", "split", "0"]);
  assert.equal(split.code, 0, split.text);
  await page.waitForSelector("#shards tr:nth-child(4)", { timeout: 15_000 });
  // the timeline has the split: a green (split) marker and the link to the child
  await page.waitForFunction(() => Array.from(document.querySelectorAll("#timeline circle title")).some((t) => t.textContent?.includes(": split")));
  await page.waitForFunction(() => document.querySelectorAll("#timeline path").length >= 1);
  assert.equal(await page.textContent("#shards tr:nth-child(4) td:first-child"), "2", "the child shard has a row");
  const dir = process.env.JETGATE_UPDATE_SCREENSHOTS === "1" ? fileURLToPath(new URL("../../docs/img/", import.meta.url)) : mkdtempSync(join(tmpdir(), "jetgate-console-"));
  await page.screenshot({ path: join(dir, "console.png"), fullPage: true });
  assert.deepEqual(problems, [], "no script errors on the page");
});
