/**
 * Token revocations in a real Redis (issue 39): the revoke script (the later issued_before and
 * expiry win, every change logged, expired fields swept a few per call), a gateway's sync (a load
 * in chunks, then only the change log; the whole hash again only when the log cannot say), key
 * loss of the log at any point (a property), and a real gateway process with 200,000 revocations
 * in force that refuses their tokens and picks up one only Redis knows from the log alone.
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import fc from "fast-check";
import { CloseCode, RedisKeys, REVOCATION_FIELDS, REVOCATION_LOG_MAXLEN, REVOCATION_SWEEP_COUNT } from "../../protocol/index.js";
import { RevocationStore, RevocationSync, parseVersion, type LoadReason } from "../../gateway/hub/revocation-sync.js";
import { Revocations, parseRevocation, revocationField } from "../../gateway/hub/revocations.js";
import { initStack, redisClient, spawnGateway, startInfra, type JetgateProcess } from "../harness/stack.js";
import { TestDevice, deviceToken } from "../harness/device.js";
import { waitFor } from "../harness/wait.js";

const infra = await startInfra();
const redis = await redisClient(infra.redis.url);
const procs: JetgateProcess[] = [];
after(async () => {
  for (const p of procs) await p.kill();
  redis.disconnect();
  await infra.dispose();
});

const DAY = 86_400_000;
let prefixes = 0;

/** A store, a list and its sync over keys of their own; `loads`: why each whole read happened. */
function rig() {
  const keys = new RedisKeys(`rv${++prefixes}`);
  const store = new RevocationStore(redis, keys);
  const list = new Revocations();
  const loads: LoadReason[] = [];
  const seen = { changes: 0, hashGone: 0 };
  const sync = new RevocationSync(store, list, { loaded: (why) => void loads.push(why), changes: (n) => void (seen.changes += n), malformed: () => undefined, hashGone: () => void seen.hashGone++ });
  return { keys, store, list, sync, loads, changes: () => seen.changes, seen };
}

async function fill(keys: RedisKeys, n: number, value: (i: number) => string, name = (i: number) => `u:user${i}`): Promise<void> {
  for (let i = 0; i < n; i += 10_000) {
    const fields: string[] = [];
    for (let j = i; j < Math.min(n, i + 10_000); j++) fields.push(name(j), value(j));
    await redis.hset(keys.revocations(), ...fields);
  }
}

test("revocation store - the later issued_before and the later expiry win; every change moves the hash's version on and is logged with it", async () => {
  const { keys, store } = rig();
  const now = Date.now();
  assert.deepEqual(await store.write({ user: "ann", before: 2000, expires: now + 10_000 }, now), { user: "ann", before: 2000, expires: now + 10_000 });
  assert.deepEqual(await store.write({ user: "ann", before: 1000, expires: now + 20_000 }, now), { user: "ann", before: 2000, expires: now + 20_000 });
  assert.deepEqual(await store.write({ user: "ann", device: "phone", before: 5, expires: now + 1 }, now), { user: "ann", device: "phone", before: 5, expires: now + 1 });
  const version = await store.version();
  assert.ok(version !== undefined && version.n === 3 && /^\d{16}$/.test(version.epoch), JSON.stringify(version));
  const v = (n: number) => `${version.epoch}:${n}`;
  const log = await redis.xrange(keys.revocationLog(), "-", "+");
  assert.deepEqual(log.map(([, f]) => f), [
    ["f", "u:ann", "v", `2000/${now + 10_000}`, "n", v(1)], ["f", "u:ann", "v", `2000/${now + 20_000}`, "n", v(2)], ["f", "d:ann:phone", "v", `5/${now + 1}`, "n", v(3)],
  ]);
  // the hash lost and made again: a new epoch, so its versions never repeat the lost one's
  await redis.del(keys.revocations());
  await store.write({ user: "bob", before: 1, expires: now + 1 }, now);
  const again = await store.version();
  assert.ok(again !== undefined && again.n === 1 && again.epoch !== version.epoch);
  assert.equal(parseVersion("12:x"), undefined);
});

test("revocation store - expired and malformed fields are swept a few per call, whatever the hash holds; fields in force stay", async () => {
  const { keys, store } = rig();
  const now = Date.now();
  await fill(keys, 4000, () => `1/${now - 1}`, (i) => `u:gone${i}`);
  await fill(keys, 100, () => `1/${now + DAY}`, (i) => `u:kept${i}`);
  await redis.hset(keys.revocations(), "u:bad", "soon");
  const calls: number[] = [];
  for (let i = 0; (await redis.hlen(keys.revocations())) > 100 + i + 1; i++) {
    const size = await redis.hlen(keys.revocations());
    await store.write({ user: `new${i}`, before: 1, expires: now + DAY }, now);
    calls.push(size + 1 - (await redis.hlen(keys.revocations())));
    assert.ok(i < 1000, "the sweep goes round the hash");
  }
  assert.ok(Math.max(...calls) <= 200, `a call sweeps a few fields (at most ${Math.max(...calls)})`);
  assert.ok(calls.length >= 4001 / 200, `it took ${calls.length} calls`);
  const left = await redis.hgetall(keys.revocations());
  for (let i = 0; i < 100; i++) assert.ok(left[`u:kept${i}`] !== undefined, `u:kept${i} is in force and stays`);
  assert.equal(Object.keys(left).filter((f) => f.startsWith("u:gone") || f === "u:bad").length, 0);
  assert.ok(Object.keys(left).every((f) => Object.values(REVOCATION_FIELDS).includes(f as ":ver") || parseRevocation(f, left[f]!) !== undefined));
  assert.ok(left[REVOCATION_FIELDS.version] !== undefined, "the version is no revocation: never swept");
});

test("revocation sync - loads the hash in chunks, then reads only the change log: a sync with nothing new reads nothing", async () => {
  const { keys, store, list, sync, loads, changes } = rig();
  const now = Date.now();
  await fill(keys, 2500, () => `100/${now + DAY}`);
  await store.write({ user: "first", before: 100, expires: now + DAY }, now);
  await sync.sync();
  assert.deepEqual([loads, list.size, list.loaded], [["start"], 2501, true]);
  assert.equal(list.revoked("user2499", "d", 99, now), true);
  for (const u of ["x", "y", "z"]) await store.write({ user: u, before: 100, expires: now + DAY }, now);
  await sync.sync();
  await sync.sync();
  assert.deepEqual([loads, changes(), list.size], [["start"], 3, 2504], "three changes read from the log, no second load");
  assert.equal(list.revoked("z", "d", 99, now), true);
});

test("revocation sync - no hash at start is no revocation; the first ones are read from the log; expired ones are forgotten; a hash that vanishes is told", async () => {
  const { keys, store, list, sync, loads, changes, seen } = rig();
  await sync.sync();
  assert.deepEqual([loads, list.size, list.loaded], [["start"], 0, true]);
  const now = Date.now();
  await store.write({ user: "brief", before: 100, expires: now + 300 }, now);
  await store.write({ user: "long", before: 100, expires: now + DAY }, now);
  await sync.sync();
  assert.deepEqual([loads, changes(), list.size], [["start"], 2, 2], "versions 1 and 2, from the log");
  await waitFor("the revocation expired", () => Date.now() > now + 300);
  await sync.sync();
  assert.equal(list.size, 1, "forgotten at its expiry");
  await redis.del(keys.revocations());
  await sync.sync();
  await sync.sync();
  assert.deepEqual([seen.hashGone, loads, list.revoked("long", "d", 99, now)], [1, ["start"], true], "told once; what the gateway holds still applies");
});

test("revocation sync - Redis failing: the first load rejects and leaves the list unloaded; a failing sync keeps what is held", async () => {
  const { store } = rig();
  const events = { loaded: () => undefined, changes: () => undefined, malformed: () => undefined, hashGone: () => undefined };
  let down = true;
  const list = new Revocations();
  const sync = new RevocationSync({ version: () => (down ? Promise.reject(new Error("redis down")) : store.version()), scan: (c, sink) => store.scan(c, sink), logBackwards: (id) => store.logBackwards(id) }, list, events);
  await assert.rejects(sync.sync(), /redis down/);
  assert.equal(list.loaded, false);
  down = false;
  await store.write({ user: "ann", before: 100, expires: Date.now() + DAY }, Date.now());
  await sync.sync();
  down = true;
  await assert.rejects(sync.sync(), /redis down/);
  assert.deepEqual([list.loaded, list.size], [true, 1]);
});

test("key loss - revocations: the change log deleted or trimmed, the hash deleted, at any point: the hash is read whole again iff the log lacks a change the gateway has not applied; every revocation in the hash is held (property)", async () => {
  type Op = { op: "revoke"; user: number; before: number } | { op: "delLog" } | { op: "trimLog" } | { op: "delHash" } | { op: "sync" };
  const op = fc.oneof(
    { arbitrary: fc.record({ op: fc.constant("revoke" as const), user: fc.nat(5), before: fc.integer({ min: 1, max: 50 }) }), weight: 4 },
    { arbitrary: fc.constantFrom({ op: "delLog" as const }, { op: "trimLog" as const }, { op: "delHash" as const }), weight: 1 },
    { arbitrary: fc.constant({ op: "sync" as const }), weight: 2 },
  );
  await fc.assert(fc.asyncProperty(fc.array(op, { minLength: 1, maxLength: 25 }), async (ops: Op[]) => {
    const { keys, store, list, sync, loads } = rig();
    const now = Date.now();
    await sync.sync();
    let applied = await store.version();
    for (const o of [...ops, { op: "sync" } as const]) {
      if (o.op === "revoke") await store.write({ user: `u${o.user}`, before: o.before, expires: now + DAY }, now);
      else if (o.op === "delLog") await redis.del(keys.revocationLog());
      else if (o.op === "trimLog") await redis.xtrim(keys.revocationLog(), "MAXLEN", 0);
      else if (o.op === "delHash") await redis.del(keys.revocations());
      else {
        // what the gateway lacks: the versions after the one it applied, in the hash's epoch
        const v = await store.version();
        const base = applied !== undefined && v !== undefined && applied.epoch === v.epoch ? applied.n : 0;
        const logged = new Set((await redis.xrange(keys.revocationLog(), "-", "+")).map(([, f]) => f[f.indexOf("n") + 1]));
        const lacking = v === undefined ? [] : Array.from({ length: v.n - base }, (_, i) => `${v.epoch}:${base + i + 1}`).filter((n) => !logged.has(n));
        const before = loads.length;
        await sync.sync();
        assert.equal(loads.length - before, lacking.length > 0 ? 1 : 0, `a whole read iff the log lacks a change (lacking: ${lacking.join(",")})`);
        for (const [field, value] of Object.entries(await redis.hgetall(keys.revocations()))) {
          const r = parseRevocation(field, value);
          if (r !== undefined) assert.equal(list.revoked(r.user, r.device, r.before - 1, now), true, `${field} is held`);
        }
        applied = v;
      }
    }
  }), { numRuns: Number(process.env.KEYLOSS_RUNS ?? 100) });
});

test("revocations at scale - 200,000 in force: a gateway process loads them and refuses their tokens; one only Redis holds (no NATS message) applies from the change log alone; a lost log makes it read the hash again", async () => {
  const N = 200_000;
  const keys = new RedisKeys("jg");
  const now = Date.now();
  const before = Math.floor(now / 1000);
  await fill(keys, N, () => `${before}/${now + DAY}`);
  await initStack(infra.env);
  const gw = await spawnGateway(infra.env, { JETGATE_REVOCATIONS_SYNC_MS: "200" });
  procs.push(gw);
  assert.equal(await gw.metric("jetgate_gateway_revocations"), N);
  assert.equal(await gw.metric("jetgate_gateway_revocation_loads_total"), 1);
  const auth = async (user: string, iat: number) => {
    const d = await TestDevice.connect(gw.httpPort);
    d.send({ t: "AUTH", v: 1, token: await deviceToken(user, { issuedAt: iat }), device: "phone" });
    await waitFor(`AUTH of ${user} answered`, () => d.frames.some((f) => f.t === "SYNCED" || f.t === "ERROR"));
    const refused = d.frames.some((f) => f.t === "ERROR" && f.msg === "token revoked");
    if (refused) await waitFor("closed 4401", () => d.closed?.code === CloseCode.UNAUTHENTICATED);
    d.ws.close();
    return refused ? "revoked" : "accepted";
  };
  assert.equal(await auth("user0", before - 1), "revoked");
  assert.equal(await auth(`user${N - 1}`, before - 1), "revoked");
  assert.equal(await auth("user7", before), "accepted", "a token issued at issued_before");
  assert.equal(await auth("bystander", before - 1), "accepted");
  // written to Redis only, as when a gateway's NATS link drops the revoke request
  const write = (user: string) => [keys.revocations(), keys.revocationLog(), revocationField(user), before, now + DAY, now, REVOCATION_LOG_MAXLEN, REVOCATION_SWEEP_COUNT] as const;
  await redis.jgRevoke(...write("late"));
  await waitFor("the gateway read the change", async () => (await gw.metric("jetgate_gateway_revocation_changes_total")) >= 1);
  assert.equal(await auth("late", before - 1), "revoked");
  assert.equal(await gw.metric("jetgate_gateway_revocation_loads_total"), 1, "read from the log: no second load of 200,000");
  assert.equal(await gw.metric("jetgate_gateway_revocations"), N + 1);
  // the log lost between two revocations, at once (MULTI): the first is in the hash only
  type Multi = { jgRevoke(...a: ReturnType<typeof write>): Multi; del(key: string): Multi; exec(): Promise<unknown> };
  await (redis.multi() as unknown as Multi).jgRevoke(...write("lost")).del(keys.revocationLog()).jgRevoke(...write("after")).exec();
  await waitFor("the gateway read the hash again", async () => (await gw.metric("jetgate_gateway_revocation_loads_total", { why: "log_gap" })) === 1);
  assert.equal(await auth("lost", before - 1), "revoked");
  assert.equal(await auth("after", before - 1), "revoked");
});
