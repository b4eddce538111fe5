/**
 * Soak (issue 17 item 5): the whole stack (2 gateways, 2 workers, 4 shards, its own nats-server
 * and redis-server) for M minutes under steady dispatch, SDK devices reconnecting at random, and
 * one fault a minute from the fault suite's list, drawn from a seed. Checks the fault suite's
 * invariants over the whole run, samples each jetgate process's RSS and event-loop delay every
 * 10 s, and prints one row per fault and a final line. Exit 1 when an invariant fails.
 *
 *   npm run soak -- --minutes 30 [--devices 80] [--seed S] [--rate 100]
 */
import { readFile } from "node:fs/promises";
import { randomInt } from "node:crypto";
import { parseFlags, usageError } from "../../protocol/io/index.js";
import { FaultRun } from "../harness/faults.js";
import type { Redis } from "ioredis";
import { freePortForTest, initStack, redisClient, startInfra, type Infra, type JetgateProcess } from "../harness/stack.js";
import { runCli } from "../harness/cli.js";
import { sleep, waitFor } from "../harness/wait.js";
import { faultSchedule, finalLine, formatTable, maxIn, metricValue, rssGrowth, seededRandom, vmRssBytes, type FaultKind, type Row, type Sample } from "./report.js";

const USAGE = `usage: npm run soak -- --minutes M [--devices N] [--seed S] [--rate R]
  --minutes M   minutes to run, one fault in each (required)
  --devices N   SDK devices, 2 per user (default 80)
  --seed S      seed of the fault schedule and of each fault's target (default: random, printed)
  --rate R      entries dispatched per second, about (default 100)
  --help        this text`;

interface Options {
  minutes: number;
  devices: number;
  seed: number;
  rate: number;
}

function options(): Options {
  const { values } = parseFlags({
    strict: true, allowPositionals: false,
    options: { minutes: { type: "string" }, devices: { type: "string" }, seed: { type: "string" }, rate: { type: "string" } },
  }, USAGE);
  const int = (name: keyof typeof values, fallback: number | undefined, min: number, max = 2 ** 32 - 1): number => {
    const v = values[name];
    if (v === undefined && fallback !== undefined) return fallback;
    if (v === undefined || !/^\d{1,10}$/.test(v) || Number(v) < min || Number(v) > max) usageError(`--${name} must be an integer from ${min} to ${max}, got ${v ?? "nothing"}`, USAGE);
    return Number(v);
  };
  return { minutes: int("minutes", undefined, 1, 10_000), devices: int("devices", 80, 2, 10_000), seed: int("seed", randomInt(2 ** 31), 0), rate: int("rate", 100, 1, 10_000) };
}

/** When in each minute its fault comes: 20 s of steady load before it. */
const FAULT_AT_MS = 20_000;
const SAMPLE_EVERY_MS = 10_000;

interface Slot {
  name: string;
  role: "gateway" | "worker";
  port: number;
  /** Every process the slot had, the current one last. */
  procs: JetgateProcess[];
}

const current = (s: Slot): JetgateProcess => s.procs[s.procs.length - 1]!;
const alive = (p: JetgateProcess): boolean => p.proc.exitCode === null && p.proc.signalCode === null;

async function scrape(p: JetgateProcess): Promise<string> {
  const res = await fetch(`http://127.0.0.1:${p.opsPort}/metrics`, { signal: AbortSignal.timeout(5000) });
  return res.text();
}

async function soak(opts: Options, infra: Infra): Promise<boolean> {
  const users = Array.from({ length: Math.ceil(opts.devices / 2) }, (_, i) => `su${i}`);
  const run = new FaultRun({ JETGATE_LEASE_MS: "1000", JETGATE_RATE_USER_FRAMES_PER_S: "100000", JETGATE_TAIL_CHECK_S: "5", ...infra.env, JETGATE_SHARDS: "4" }, users);
  const schedule = faultSchedule(opts.seed, opts.minutes);
  // targets (which worker, which shard) from a second stream of the same seed: the schedule stays a pure function of it
  const random = seededRandom(opts.seed ^ 0x5eed);
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(random() * xs.length)]!;
  const failures: string[] = [];
  const samples: Sample[] = [];
  /** Last mailbox_seq regression count read from each process: a killed one's counter dies with it. */
  const regressions = new Map<number, { slot: string; value: number }>();
  const killed = new Set<number>();
  const crashReported = new Set<number>();
  const slots: Slot[] = [];
  let load: { stop: () => Promise<void> } | undefined;
  let chaos: { stop: () => Promise<void> } | undefined;
  let sampler: NodeJS.Timeout | undefined;
  let sampling: Promise<void> = Promise.resolve();

  const noteRegressions = (slot: Slot, p: JetgateProcess, text: string): void => {
    const v = metricValue(text, "jetgate_mailbox_seq_regression_total");
    if (v !== undefined) regressions.set(p.pid, { slot: slot.name, value: v });
  };

  const sampleAll = async (): Promise<void> => {
    const t = Date.now();
    await Promise.all(slots.map(async (slot) => {
      const p = current(slot);
      if (!alive(p)) {
        if (!killed.has(p.pid) && !crashReported.has(p.pid)) {
          crashReported.add(p.pid);
          failures.push(`${slot.name} (pid ${p.pid}) exited by itself (${p.proc.exitCode ?? p.proc.signalCode}); last lines:\n${p.output.slice(-20).join("\n")}`);
        }
        return;
      }
      const s: Sample = { t, slot: slot.name, pid: p.pid };
      s.rss = vmRssBytes(await readFile(`/proc/${p.pid}/status`, "utf8").catch(() => ""));
      try {
        const text = await scrape(p);
        // prom-client resets the histogram at each scrape: this p99 covers the ~10 s since the last one
        s.loopP99 = metricValue(text, `jetgate_${slot.role}_nodejs_eventloop_lag_p99_seconds`);
        noteRegressions(slot, p, text);
      } catch {
        // mid-fault (its NATS restarting, say): this sample has RSS only
      }
      samples.push(s);
    }));
  };

  const killSlot = async (slot: Slot): Promise<void> => {
    const p = current(slot);
    await scrape(p).then((text) => noteRegressions(slot, p, text), () => undefined);
    killed.add(p.pid);
    await p.kill("SIGKILL");
  };

  const activeShards = () => [...run.registry.state.shards.values()].filter((s) => s.status === "active");
  const userOn = (shard: number | undefined): string => run.users.find((u) => run.registry.shards.shardOf(u) === shard) ?? pick(run.users);
  const epochsNow = () => new Map([...run.registry.state.shards.values()].map((s) => [s.shard, s.epoch]));
  const epochMoves = (before: Map<number, number>, after: Map<number, number>): string[] =>
    [...after].filter(([s, e]) => before.get(s) !== e).map(([s, e]) => `${s}:${before.get(s) ?? "new"}->${e}`);
  const duplicatesNow = () => run.devices.reduce((n, d) => n + d.client.stats.duplicatesDropped + d.pastSdkDuplicates + d.appDuplicates, 0);

  const cli = async (args: string[]): Promise<void> => {
    const out = await runCli(run.env, args);
    if (out.code !== 0) throw new Error(`jetgate ${args.join(" ")} exited ${out.code}: ${out.text}`);
  };

  /** Injects one fault as test/faults/ does; returns the user whose probe entry measures recovery. */
  const inject = async (kind: FaultKind, minute: number): Promise<string> => {
    switch (kind) {
      case "worker-kill": {
        const slot = pick(slots.filter((s) => s.role === "worker"));
        const held: number[] = [];
        for (const s of activeShards()) if ((await current(slot).metric("jetgate_worker_lease_held", { shard: String(s.shard) })) === 1) held.push(s.shard);
        await killSlot(slot);
        slot.procs.push(await run.spawnWorker());
        // a user of a shard the victim held, so recovery includes the takeover
        return userOn(held.length > 0 ? pick(held) : undefined);
      }
      case "gateway-kill": {
        const slot = pick(slots.filter((s) => s.role === "gateway"));
        await killSlot(slot);
        slot.procs.push(await run.spawnGateway(slot.port));
        return pick(run.users);
      }
      case "redis-restart":
        await infra.redis.kill();
        await sleep(1000);
        await infra.redis.start();
        return pick(run.users);
      case "nats-restart":
        await infra.nats.kill();
        await sleep(1000);
        await infra.nats.start();
        return pick(run.users);
      case "shard-split": {
        const parent = activeShards().sort((a, b) => b.range.hi - b.range.lo - (a.range.hi - a.range.lo) || a.shard - b.shard)[0]!;
        // as E2: some apps are closed across the split and start again from their stored cursors
        const offline = run.devices.filter((_, i) => i % 5 === minute % 5);
        for (const d of offline) await run.closeApp(d);
        try {
          await cli(["shard", "split", String(parent.shard)]);
        } finally {
          for (const d of offline) await run.reopen(d);
        }
        await run.registry.sync();
        const child = Math.max(...run.registry.state.shards.keys());
        return run.users.some((u) => run.registry.shards.shardOf(u) === child) ? userOn(child) : userOn(parent.shard);
      }
      case "takeover": {
        const shard = pick(activeShards()).shard;
        await cli(["shard", "takeover", String(shard)]);
        return userOn(shard);
      }
      case "redis-evict":
        // as test/faults/redis-memory.test.ts: allkeys-lru just above what Redis holds, apps closed through it
        return squeezeRedis(minute, async (r) => {
          await r.config("SET", "maxmemory-policy", "allkeys-lru");
          await r.config("SET", "maxmemory", String(Number(/used_memory:(\d+)/.exec(await r.info("memory"))![1]) + 256 * 1024));
        }, 8000);
      case "redis-oom":
        // every write refused (noeviction, maxmemory reached): workers wait, nothing is lost
        return squeezeRedis(minute, async (r) => {
          await r.config("SET", "maxmemory-policy", "noeviction");
          await r.config("SET", "maxmemory", "1");
        }, 5000);
    }
  };

  /** Redis short of memory for `holdMs` (set by `squeeze`), a fifth of the apps closed through it; then as before. */
  const squeezeRedis = async (minute: number, squeeze: (r: Redis) => Promise<void>, holdMs: number): Promise<string> => {
    const r = await redisClient(infra.redis.url);
    const offline = run.devices.filter((_, i) => i % 5 === minute % 5);
    const [, policy] = (await r.config("GET", "maxmemory-policy")) as [string, string];
    try {
      for (const d of offline) await run.closeApp(d);
      await squeeze(r);
      await sleep(holdMs);
    } finally {
      await r.config("SET", "maxmemory", "0");
      await r.config("SET", "maxmemory-policy", policy);
      r.disconnect();
      for (const d of offline) await run.reopen(d);
    }
    return pick(offline.map((d) => d.user));
  };

  try {
    console.log(`soak: ${opts.minutes} min, seed ${opts.seed}, ${users.length} users x 2 devices, ~${opts.rate} entries/s; faults: ${schedule.join(" ")}`);
    await initStack(run.env);
    await run.connectControl();
    for (const n of [1, 2]) slots.push({ name: `worker-${n}`, role: "worker", port: 0, procs: [await run.spawnWorker()] });
    for (const n of [1, 2]) {
      const port = await freePortForTest();
      run.gatewayPorts.push(port);
      slots.push({ name: `gateway-${n}`, role: "gateway", port, procs: [] });
    }
    for (const s of slots.filter((x) => x.role === "gateway")) s.procs.push(await run.spawnGateway(s.port));
    await waitFor("every shard owned", async () => {
      let held = 0;
      for (const w of run.live(run.workers)) held += await w.metric("jetgate_worker_lease_held");
      return held === run.shardCount;
    }, { timeoutMs: 20_000 });
    await run.startDevices(2);

    const t0 = Date.now();
    const minuteOf = () => Math.min(opts.minutes - 1, Math.floor((Date.now() - t0) / 60_000));
    // steady load as FaultRun.load, with the minute in each id so each row can count its own entries
    let running = true;
    let n = 0;
    const loop = (async () => {
      while (running) {
        const m = minuteOf();
        await Promise.all(Array.from({ length: Math.max(1, Math.round(opts.rate / 10)) }, () =>
          run.dispatch(run.users[Math.floor(Math.random() * run.users.length)]!, `m${m}-${n++}`).catch(() => false)));
        await sleep(100);
      }
    })();
    load = { stop: async () => { running = false; await loop; } };
    chaos = run.chaos(1, 250);
    sampling = sampleAll();
    sampler = setInterval(() => {
      sampling = sampling.then(sampleAll).catch((err: unknown) => console.error(`soak: sampling: ${(err as Error).message}`));
    }, SAMPLE_EVERY_MS);

    const minutes: { kind: FaultKind; faultMs: number; recoverMs: number | undefined; duplicates: number }[] = [];
    let dupsBefore = duplicatesNow();
    const epochChanged: boolean[] = [];
    let epochsBefore = epochsNow();
    for (let m = 0; m < opts.minutes; m++) {
      const start = t0 + m * 60_000;
      await sleep(start + FAULT_AT_MS - Date.now());
      const kind = schedule[m]!;
      const f0 = Date.now();
      let faultMs: number | undefined;
      let recoverMs: number | undefined;
      try {
        const probeUser = await inject(kind, m);
        faultMs = Date.now() - f0;
        // as runScenario: the first entry dispatched after the fault marks recovery
        const probeId = `m${m}-probe`;
        await waitFor("the probe entry acknowledged", () => run.dispatch(probeUser, probeId), { timeoutMs: 60_000, intervalMs: 200 });
        await waitFor(`the probe entry on every device of ${probeUser}`, () => run.devices.filter((d) => d.user === probeUser).every((d) => d.ids.has(probeId)), { timeoutMs: 60_000, intervalMs: 50 });
        recoverMs = Date.now() - f0;
      } catch (err) {
        failures.push(`minute ${m} (${kind}): ${(err as Error).message}`);
      }
      faultMs ??= Date.now() - f0;
      console.log(`minute ${m}: ${kind} took ${faultMs} ms, recovered in ${recoverMs ?? "(not recovered)"} ms`);
      await sleep(start + 60_000 - Date.now());
      const dups = duplicatesNow();
      const epochs = epochsNow();
      const moves = epochMoves(epochsBefore, epochs);
      minutes.push({ kind, faultMs, recoverMs, duplicates: dups - dupsBefore });
      epochChanged.push(moves.length > 0);
      console.log(`minute ${m}: ${dups - dupsBefore} duplicates; shard epochs changed: ${moves.join(" ") || "none"}`);
      [dupsBefore, epochsBefore] = [dups, epochs];
    }
    await load.stop();
    load = undefined;
    await chaos.stop();
    chaos = undefined;
    const owed = () => run.devices.every((d) => (run.sent.get(d.user) ?? []).every((id) => d.ids.has(id)));
    await waitFor("every device has every entry of its user", owed, { timeoutMs: 120_000, intervalMs: 500 }).catch(() => undefined);
    clearInterval(sampler);
    sampler = undefined;
    await sampling;
    await sampleAll();

    // the fault suite's checks, over the whole run
    const perMinute = opts.minutes;
    const dispatched = new Array<number>(perMinute).fill(0);
    const delivered = new Array<number>(perMinute).fill(0);
    const missing = new Array<number>(perMinute).fill(0);
    for (const ids of run.sent.values()) for (const id of ids) dispatched[Number(/^m(\d+)-/.exec(id)![1])]! += 1;
    let sdkRegressions = 0;
    let handlerErrors = 0;
    const missingNote: string[] = [];
    for (const d of run.devices) {
      const lacking: string[] = [];
      for (const id of run.sent.get(d.user) ?? []) {
        const m = Number(/^m(\d+)-/.exec(id)![1]);
        if (d.ids.has(id)) delivered[m]! += 1;
        else {
          missing[m]! += 1;
          lacking.push(id);
        }
      }
      if (lacking.length > 0 && missingNote.length < 5) {
        const where = missingNote.length === 0 ? `; in the streams: ${await run.whereIs(d.user, lacking.slice(0, 5)).catch((err: unknown) => `unknown: ${(err as Error).message}`)}` : "";
        missingNote.push(`${d.user}/${d.name}: ${lacking.length} entries missing, first ${lacking.slice(0, 5).join(" ")}${where}; state ${JSON.stringify(d.client.state)}`);
      }
      for (let i = 1; i < d.applied.length; i++) {
        const [a, b] = [d.applied[i - 1]!, d.applied[i]!];
        if (b.seq <= a.seq) {
          failures.push(`${d.user}/${d.name}: seqs must increase, but ${a.id}@${a.seq.toString(16)} came before ${b.id}@${b.seq.toString(16)}`);
          break;
        }
      }
      const r = d.client.stats.mailboxSeqRegressionCount + d.pastSdkRegressions;
      if (r > 0) failures.push(`${d.user}/${d.name}: the SDK counted ${r} mailbox_seq regressions`);
      sdkRegressions += r;
      handlerErrors += d.client.stats.handlerErrors;
    }
    if (handlerErrors > 0) failures.push(`${handlerErrors} onEntry errors (an SDK instance applied an entry twice)`);
    for (const note of missingNote) failures.push(`missing: ${note}`);
    let processRegressions = 0;
    for (const [pid, { slot, value }] of regressions) {
      if (value > 0) failures.push(`${slot} (pid ${pid}): jetgate_mailbox_seq_regression_total ${value}`);
      processRegressions += value;
    }
    minutes.forEach((x, m) => {
      if (x.duplicates > 0 && !epochChanged[m] && !(m > 0 && epochChanged[m - 1])) {
        failures.push(`minute ${m} (${x.kind}): ${x.duplicates} duplicates, but no shard epoch changed in it or the minute before`);
      }
    });

    const rows: Row[] = minutes.map((x, m) => {
      const [from, to] = [t0 + m * 60_000, t0 + (m + 1) * 60_000];
      return {
        minute: m, fault: x.kind, faultMs: x.faultMs, recoverMs: x.recoverMs, dispatched: dispatched[m]!, delivered: delivered[m]!, missing: missing[m]!, duplicates: x.duplicates,
        gatewayRss: maxIn(samples, from, to, (s) => s.rss, "gateway"), workerRss: maxIn(samples, from, to, (s) => s.rss, "worker"), loopP99: maxIn(samples, from, to, (s) => s.loopP99),
      };
    });
    const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);
    console.log(`\n${formatTable(rows)}\n`);
    const stats = run.devices.reduce((a, d) => ({ reconnects: a.reconnects + d.client.stats.reconnects, rebases: a.rebases + d.client.stats.rebases, gaps: a.gaps + d.client.stats.gapsFilled }), { reconnects: 0, rebases: 0, gaps: 0 });
    console.log(`soak: seed ${opts.seed}; failed dispatches ${run.failed} (not owed); SDK reconnects ${stats.reconnects}, rebases ${stats.rebases}, gaps filled ${stats.gaps} (current SDK instances); shards at the end ${run.shardCount}; duplicates after the last minute ${duplicatesNow() - dupsBefore}`);
    console.log(finalLine({
      minutes: opts.minutes, faults: minutes.length, dispatched: sum(dispatched), delivered: sum(delivered), missing: sum(missing),
      duplicates: duplicatesNow(), regressions: processRegressions + sdkRegressions, growth: rssGrowth(samples, t0, t0 + 60_000),
    }));
  } catch (err) {
    failures.push(`the soak itself failed: ${(err as Error).stack ?? String(err)}`);
  } finally {
    if (sampler !== undefined) clearInterval(sampler);
    await load?.stop();
    await chaos?.stop();
    await sampling.catch(() => undefined);
    for (const d of run.devices) await d.client.close();
    await run.closeControl();
    for (const s of slots) for (const p of s.procs) await p.kill();
  }
  if (failures.length === 0) return true;
  console.error(`soak FAILED (seed ${opts.seed}):\n- ${failures.join("\n- ")}`);
  // what the processes logged (warn and up) is often the only clue
  for (const s of slots) for (const p of s.procs) console.error(`--- ${s.name} ${p.name} (pid ${p.pid}), last lines:\n${p.output.slice(-30).join("\n")}`);
  return false;
}

async function main(): Promise<number> {
  const opts = options();
  // the harness kills every server and jetgate process it started on exit
  for (const sig of ["SIGINT", "SIGTERM"] as const) process.on(sig, () => {
    console.error(`soak: ${sig}, stopping`);
    process.exit(130);
  });
  const infra = await startInfra({ JETGATE_SHARDS: "4" });
  try {
    return (await soak(opts, infra)) ? 0 : 1;
  } finally {
    await infra.dispose();
  }
}

// exit at once: whatever is left (a reconnecting client) must not hold the run open
process.exit(await main());
