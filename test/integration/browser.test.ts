import { test, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { connect } from "@nats-io/transport-node";
import { chromium, type Browser } from "playwright-core";
import { Dispatcher, RegistryClient } from "../../protocol/io/index.js";
import { buildSdk } from "../../scripts/build-sdk.js";
import { startInfra, initStack, spawnWorker, spawnGateway, freePortForTest, type JetgateProcess } from "../harness/stack.js";
import { waitFor } from "../harness/wait.js";

const CHROMIUM = process.env.CHROMIUM_PATH ?? "/usr/bin/chromium";
if (!existsSync(CHROMIUM)) throw new Error(`${CHROMIUM} is missing: apt-get install -y chromium (npm test does as root: scripts/test-deps.sh)`);

await buildSdk();
const infra = await startInfra({ JETGATE_LEASE_MS: "1000", JETGATE_DRAIN_MS: "500", JETGATE_DEMO_DIR: new URL("../../client/demo", import.meta.url).pathname });
await initStack(infra.env);
const port = String(await freePortForTest());
const worker = await spawnWorker(infra.env);
let gateway: JetgateProcess = await spawnGateway(infra.env, { JETGATE_GATEWAY_PORT: port });
const nc = await connect({ servers: infra.nats.url });
const registry = await RegistryClient.open(nc);
const dispatcher = new Dispatcher(nc, () => registry.shards, { lanes: ["default"] });
let browser: Browser | undefined;
after(async () => {
  await browser?.close();
  dispatcher.close();
  await registry.close();
  await nc.close();
  await gateway.kill();
  await worker.kill();
  await infra.dispose();
});

test("browser - the demo page connects, receives entries, and resumes without loss after the gateway restarts", async () => {
  await waitFor("the worker owns both shards", async () => (await worker.metric("jetgate_worker_lease_held")) === 2);
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  const page = await browser.newPage();
  const errors: string[] = [];
  page.on("pageerror", (e) => errors.push(e.message));
  // (the token fetches the SDK retries while the gateway restarts are refused: that is the test's own doing)
  page.on("console", (m) => void (m.type() === "error" && !m.text().includes("ERR_CONNECTION_REFUSED") && errors.push(`console: ${m.text()}`)));
  page.on("response", (r) => void (r.status() >= 400 && errors.push(`${r.status()} ${r.url()}`)));
  await page.goto(`http://127.0.0.1:${port}/demo/?user=web1`);
  const state = () => page.evaluate(() => document.getElementById("status")?.dataset.state);
  const ids = () => page.evaluate(() => Array.from(document.querySelectorAll("#entries li"), (li) => (li as HTMLElement).dataset.id));
  await waitFor("the page is live", async () => (await state()) === "live", { timeoutMs: 20_000 });
  const send = async (id: string) => {
    await dispatcher.dispatch({ dispatch_id: id, message_id: id, lane: "default", recipients: ["web1"], body: new TextEncoder().encode(`hello ${id}`) });
  };
  for (const id of ["w1", "w2", "w3"]) await send(id);
  await waitFor("three entries on the page", async () => (await ids()).length === 3, { timeoutMs: 30_000 });
  // the status box is current: it counts the last entry too (it once lagged one behind)
  await waitFor("the status counts all three", async () => (await page.evaluate(() => document.getElementById("status")!.dataset.applied)) === "3", { timeoutMs: 3000 });
  assert.match(await page.evaluate(() => document.querySelector("#entries li")!.textContent!), /hello w3/);
  assert.match(await page.evaluate(() => document.querySelector("#entries li")!.textContent!), /^seq \d+ \(\d+:\d+\) /, "the seq with its epoch:offset");

  // the gateway process goes away (drain) and a new one comes up on the same port
  await gateway.kill("SIGTERM");
  await send("w4"); // arrives while the page has no gateway
  gateway = await spawnGateway(infra.env, { JETGATE_GATEWAY_PORT: port });
  await send("w5");
  await waitFor("all five entries, after the restart", async () => (await ids()).length === 5, { timeoutMs: 30_000 });
  assert.deepEqual(((await ids()) as string[]).sort(), ["w1", "w2", "w3", "w4", "w5"]);
  const stats = await page.evaluate(() => ({ ...document.getElementById("status")!.dataset }));
  assert.equal(stats.regressions, "0");
  assert.equal(stats.applied, "5");
  assert.deepEqual(errors, []);
  // the cursor survives in localStorage
  const stored = await page.evaluate(() => localStorage.getItem("jetgate-demo-cursor-web1"));
  assert.ok(stored && JSON.parse(stored).seq !== "0");
});
