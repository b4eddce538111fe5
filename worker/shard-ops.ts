/**
 * Operator shard operations (E1-E4 of docs/design.md, "Epochs and logs"): `jetgate shard
 * takeover|split|rebuild <id>`, and the failover to a copy.
 *
 * Takeover, rebuild and failover write the registry first (the epoch bump and its boundary in one
 * record), then do the NATS work; a split creates the child's stream first, so that no process
 * ever sees a shard whose stream does not exist. Each reports every step through `out`, and reads
 * where a previous run stopped from the registry and the streams, so running it again after a
 * crash halfway finishes the same operation instead of starting another.
 *
 * Every epoch an operation writes is unclaimed (`owner: null`): the first worker that takes the
 * shard claims it instead of bumping again, so one ownership change spends one epoch.
 */
import type { NatsConnection } from "@nats-io/transport-node";
import { jetstreamManager, type JetStreamManager, type StreamInfo } from "@nats-io/jetstream";
import {
  countLabel,
  rangeLabel,
  registryRecord,
  seqLabel,
  JetgateError,
  bumpEpoch,
  isClaimed,
  REGISTRY_STREAM,
  REGISTRY_SUBJECT,
  halfRange,
  planTakeover,
  frozenSubject,
  shardStream,
  shardSubjects,
  splitShard,
  type ShardState,
} from "../protocol/index.js";
import {
  RegistryClient,
  ensureStream,
  ingressStreamConfig,
  isNotFound,
  logOfStream,
  newLogId,
  registryStreamConfig,
  shardStreamConfig,
  type StreamSettings,
} from "../protocol/io/index.js";
import { readAckFloor } from "./shard-adapters.js";

export class OperationError extends JetgateError {
  constructor(message: string) {
    super("OPERATION", message);
  }
}

export interface OpsContext {
  nc: NatsConnection;
  settings: StreamSettings;
  /** Written into registry records as `by`. */
  by: string;
  out: (line: string) => void;
  /**
   * On a terminal: a status line redrawn in place while a long step runs (the next `out` line
   * replaces it). Absent (a log, a pipe): long steps say how far they are with `out` every 5 s.
   */
  status?: (line: string) => void;
}


/** Where the shard's stream copy waits while the stream is recreated. */
export function rebuildHoldStream(shard: number): string {
  return `${shardStream(shard)}_REBUILD`;
}


async function withRegistry<T>(ctx: OpsContext, fn: (registry: RegistryClient, jsm: JetStreamManager) => Promise<T>): Promise<T> {
  const registry = await RegistryClient.open(ctx.nc);
  try {
    return await fn(registry, await jetstreamManager(ctx.nc));
  } finally {
    await registry.close();
  }
}

function activeShard(registry: RegistryClient, shard: number): ShardState {
  const s = registry.state.shards.get(shard);
  if (s === undefined) throw new OperationError(`shard ${shard} is not in the registry`);
  if (s.status !== "active") throw new OperationError(`shard ${shard} is ${s.status}`);
  return s;
}

async function streamInfo(jsm: JetStreamManager, name: string): Promise<StreamInfo | undefined> {
  try {
    return await jsm.streams.info(name);
  } catch (err) {
    if (isNotFound(err)) return undefined;
    throw err;
  }
}

/** How often a stream copy says how far it is. */
const PROGRESS_EVERY_MS = 5000;
/** A copy that gains nothing for this long is given up (run the command again to resume). */
const COPY_STALL_MS = 120_000;

/** One progress line of a stream copy: how many of how many, the rate since it began, the time left at that rate. */
export function copyProgress(name: string, done: number, total: number, elapsedMs: number): string {
  const pct = total > 0 ? Math.min(100, Math.floor((done / total) * 100)) : 100;
  const rate = elapsedMs > 0 ? (done / elapsedMs) * 1000 : 0;
  const left = rate > 0 ? Math.ceil(Math.max(0, total - done) / rate) : undefined;
  return `stream ${name}: copied ${done.toLocaleString("en-US")} of ${total.toLocaleString("en-US")} messages (${pct}%), ${Math.round(rate).toLocaleString("en-US")}/s, ${left === undefined ? "time left unknown" : `about ${left} s left`}`;
}

/**
 * How a long step says how far it is: every call redraws the terminal's status line, or, without a
 * terminal, every PROGRESS_EVERY_MS one line of output.
 */
export function progressReporter(ctx: Pick<OpsContext, "out" | "status">, start = Date.now()): (line: string, now?: number) => void {
  let lastSaid = start;
  return (line, now = Date.now()) => {
    if (ctx.status !== undefined) ctx.status(line);
    else if (now - lastSaid >= PROGRESS_EVERY_MS) {
      ctx.out(line);
      lastSaid = now;
    }
  };
}

/**
 * Waits until a sourcing stream has copied its source: it holds `want` messages, or its source
 * reports no lag twice in a row with nothing added in between (JetStream may drop a copy whose
 * Nats-Msg-Id repeats inside the duplicate window, so the count alone could fall short). Says how
 * far it is (a large stream takes minutes), and gives up only when the copy stalls.
 */
async function copied(jsm: JetStreamManager, name: string, want: number, ctx: OpsContext): Promise<void> {
  const start = Date.now();
  let last = -1;
  let lastGain = start;
  const report = progressReporter(ctx, start);
  for (;;) {
    const i = await jsm.streams.info(name);
    const n = i.state.messages;
    const idle = (i.sources ?? []).every((src) => src.lag === 0) && n === last;
    const now = Date.now();
    if (n > last) lastGain = now;
    last = n;
    if (n >= want || idle) return;
    if (now - lastGain > COPY_STALL_MS) throw new OperationError(`${name}: the copy gained nothing for ${COPY_STALL_MS / 1000} s at ${n} of ${want} messages; run the command again to continue`);
    report(copyProgress(name, n, want, now - start), now);
    await new Promise((r) => setTimeout(r, 400));
  }
}

/**
 * E1 by hand: bumps the shard's epoch from its consumers' ack floor. The owning worker is fenced
 * (it stops at its next batch) and a worker takes the shard over by claiming this epoch. An epoch
 * no worker has claimed (one a takeover, split, rebuild or `registry init` wrote) has nobody to
 * fence: the command says so and spends nothing (each epoch is 1 of 65,536, and a shard is reviewed
 * at 1,000: docs/design.md, "Review points").
 */
export async function takeoverShard(ctx: OpsContext, shard: number): Promise<void> {
  await withRegistry(ctx, async (registry, jsm) => {
    const before = activeShard(registry, shard);
    const { floor } = await readAckFloor(jsm, shard, before.epoch);
    let unclaimed: ShardState | undefined;
    const written = await registry.update((state) => {
      const s = state.shards.get(shard)!;
      // decided on the state the write is based on: a worker claiming meanwhile makes this run again
      if (!isClaimed(s)) {
        unclaimed = s;
        return null;
      }
      // the same start a worker's own takeover would take (a claimed epoch: a bump)
      const start = planTakeover(s, floor).boundaryStart;
      return registryRecord("takeover", ctx.by, [bumpEpoch(s, { cause: "takeover", start_offset: start, owner: null })]);
    });
    if (written === null) {
      const u = unclaimed!;
      const why = u.released_offset !== undefined ? `its worker released it at offset ${u.released_offset}` : "it is not claimed by any worker yet";
      ctx.out(`shard ${shard}: epoch ${u.epoch} is free (${why}), so there is nothing to fence; no epoch spent (the next worker to take the shard claims epoch ${u.epoch})`);
      return;
    }
    const after = written.state.shards.get(shard)!;
    const b = after.boundaries[after.boundaries.length - 1]!;
    ctx.out(`shard ${shard}: epoch ${before.epoch} -> ${after.epoch} (takeover from offset ${b.start_offset}); its worker is fenced and the next worker to take the shard claims this epoch`);
  });
}

/**
 * E2: the upper half of the shard's range (the lower with `lower`) moves to a new child shard on a
 * stream of its own. The cut is the parent stream's last offset when the record is written:
 * entries up to it stay the parent's (split_at_seq); later ones for moved users are forwarded to
 * the child by the parent's worker with the same Nats-Msg-Id.
 *
 * Order: the child's stream `MBX_<child>` first (on the child's new log), then the registry record.
 * Every gateway and worker follows the registry, so none can see the child before its stream
 * exists (a gateway reading a moved session's mailbox from a missing stream closed it with 4500).
 * A run that stopped between the two leaves an empty stream for a shard the registry does not
 * know: the next run for that child id adopts it (and its log id) and writes the record. A stream
 * of that name that holds messages is refused: nothing may have been appended to a shard before
 * the registry had it.
 */
export async function splitShardOp(ctx: OpsContext, shard: number, opts: { child?: number; lower?: boolean } = {}): Promise<void> {
  await withRegistry(ctx, async (registry, jsm) => {
    // A split recorded before its child's stream (older versions wrote the record first): finish it.
    const pending = [...registry.state.shards.values()].find(
      (c) => c.status === "active" && c.splits.some((x) => x.parent === shard && x.child === c.shard),
    );
    if (pending !== undefined && (await streamInfo(jsm, shardStream(pending.shard))) === undefined) {
      ctx.out(`shard ${shard}: split into ${pending.shard} is recorded; creating the child's stream (resuming)`);
      await createShardStream(ctx, jsm, pending);
      return;
    }
    const parent = activeShard(registry, shard);
    if (parent.range.hi - parent.range.lo < 1) throw new OperationError(`shard ${shard} owns a single hash: nothing to split`);
    const child = opts.child ?? Math.max(...registry.state.shards.keys()) + 1;
    if (registry.state.shards.has(child)) throw new OperationError(`shard ${child} exists already`);
    const moved = halfRange(parent.range, opts.lower !== true);
    // 1. the child's stream, before anyone can see the child
    const childLog = await childStream(ctx, jsm, child);
    // 2. the registry record; the cut is the parent's last offset now
    const info = await jsm.streams.info(shardStream(shard));
    const written = await registry.update((state) => {
      if (state.shards.has(child)) throw new OperationError(`shard ${child} exists already`);
      const p = state.shards.get(shard)!;
      if (p.range.lo !== parent.range.lo || p.range.hi !== parent.range.hi) throw new OperationError(`shard ${shard} changed range meanwhile; run again`);
      // Never cut below the current boundary: what is below it has been numbered already.
      const cutOffset = Math.max(info.state.last_seq, p.boundaries[p.boundaries.length - 1]!.start_offset - 1);
      return registryRecord("split", ctx.by, splitShard(p, { child, childLog, moved, cutOffset }));
    });
    const state = written!.state;
    const p = state.shards.get(shard)!;
    const c = state.shards.get(child)!;
    const split = c.splits[0]!;
    ctx.out(`shard ${shard}: split recorded; hashes ${rangeLabel(moved)} move to shard ${child}`);
    const pb = p.boundaries[p.boundaries.length - 1]!;
    ctx.out(`  parent epoch ${countLabel(parent.epoch)} -> ${countLabel(p.epoch)}, keeps ${rangeLabel(p.range)}; split_at_seq ${seqLabel(split.split_at_seq)}`);
    ctx.out(`  parent boundary: epoch ${pb.epoch} from offset ${pb.start_offset} (seq ${seqLabel(pb.start_seq)}); offsets up to ${pb.start_offset - 1} stay the parent's for moved users`);
    ctx.out(`  child ${child} starts at epoch ${c.epoch}, seq ${seqLabel(split.child_start_seq)}, log ${c.log} (nothing is copied: the parent's worker forwards moved users' later entries)`);
  });
}

/**
 * The log id of the stream the child shard `child` will use: a new stream on a new log, or an
 * empty one a previous run created before it stopped (its log is adopted). The registry does not
 * know `child` (the caller checked).
 */
async function childStream(ctx: OpsContext, jsm: JetStreamManager, child: number): Promise<string> {
  const name = shardStream(child);
  let info = await streamInfo(jsm, name);
  if (info === undefined) {
    const log = newLogId();
    try {
      info = await jsm.streams.add(shardStreamConfig(child, log, ctx.settings));
      ctx.out(`stream ${name}: created on log ${log}`);
      return log;
    } catch (err) {
      // another run created it meanwhile: judge that one like any existing stream
      info = await streamInfo(jsm, name);
      if (info === undefined) throw err;
    }
  }
  const log = logOfStream(info);
  if (log === undefined || !(info.config.subjects ?? []).includes(shardSubjects(child))) {
    throw new OperationError(`stream ${name} exists but is not a shard stream jetgate created for shard ${child}, which the registry does not know: inspect and remove it, or choose another id with --child`);
  }
  if (info.state.messages > 0 || info.state.last_seq > 0) {
    throw new OperationError(
      `stream ${name} exists and has had entries appended (${info.state.messages} held, last offset ${info.state.last_seq}) but shard ${child} is not in the registry: inspect and remove it, or choose another id with --child`,
    );
  }
  ctx.out(`stream ${name}: exists, empty, on log ${log} (a previous run stopped before its registry write); using it (resuming)`);
  return log;
}

async function createShardStream(ctx: OpsContext, jsm: JetStreamManager, s: ShardState): Promise<void> {
  const { created } = await ensureStream(jsm, shardStreamConfig(s.shard, s.log, ctx.settings));
  ctx.out(`stream ${shardStream(s.shard)}: ${created ? "created" : "exists"}`);
}

/**
 * E3: recreates the shard's stream (offsets restart at 1 on a new log) with what the old one held
 * re-appended first, in order, with their Nats-Msg-Id headers.
 *
 *   1. freeze: the old stream's subjects move away, so nothing more is appended to it (producers
 *      get no-responders and retry until step 6);
 *   2. registry: epoch bump onto the new log, prev_end_seq = the frozen stream's last entry;
 *   3. a holding stream sources the frozen one until it has every message;
 *   4. the old stream is deleted and the holding stream cut loose from it;
 *   5. the new stream sources the holding stream until it has every message;
 *   6. the new stream takes the shard's subjects; the holding stream is deleted.
 * Workers refuse the shard while its stream is not the registry's log, and take it over at 5.
 */
export async function rebuildShard(ctx: OpsContext, shard: number): Promise<void> {
  await withRegistry(ctx, async (registry, jsm) => {
    const name = shardStream(shard);
    const hold = rebuildHoldStream(shard);
    let s = activeShard(registry, shard);
    let info = await streamInfo(jsm, name);
    if (info !== undefined && logOfStream(info) === s.log && (info.config.subjects ?? []).includes(shardSubjects(shard))) {
      // Not started (or finished before): begin a new rebuild.
      if ((await streamInfo(jsm, hold)) !== undefined) throw new OperationError(`stream ${hold} exists but the registry shows no rebuild: inspect and remove it`);
      info = await jsm.streams.update(name, { ...info.config, subjects: [frozenSubject(shard)] });
      ctx.out(`stream ${name}: frozen at offset ${info.state.last_seq} (appends refused until the rebuild ends)`);
      const oldLast = info.state.last_seq;
      const before = s.epoch;
      const written = await registry.update((state) => {
        const cur = state.shards.get(shard)!;
        return registryRecord("rebuild", ctx.by, [bumpEpoch(cur, { cause: "rebuild", log: newLogId(), start_offset: 1, prev_end_offset: oldLast, owner: null })]);
      });
      s = written!.state.shards.get(shard)!;
      ctx.out(`shard ${shard}: epoch ${before} -> ${s.epoch} on new log ${s.log}; prev_end_seq ${seqLabel(s.boundaries[s.boundaries.length - 1]!.prev_end_seq)}`);
    } else if (info !== undefined && logOfStream(info) === s.log) {
      ctx.out(`shard ${shard}: the new stream exists; finishing (resuming)`);
    } else if (info !== undefined && (info.config.subjects ?? []).includes(shardSubjects(shard))) {
      throw new OperationError(`stream ${name} is log ${logOfStream(info)} but the registry says ${s.log}, and it is not frozen: not a rebuild this command started`);
    } else {
      ctx.out(`shard ${shard}: rebuild onto log ${s.log} is recorded; continuing (resuming)`);
    }

    info = await streamInfo(jsm, name);
    if (info !== undefined && logOfStream(info) !== s.log) {
      // 3. copy the frozen stream into the holding stream
      const old = info;
      if ((await streamInfo(jsm, hold)) === undefined) {
        await jsm.streams.add({ name: hold, description: `jetgate rebuild of ${name}`, storage: old.config.storage, num_replicas: old.config.num_replicas, sources: [{ name }] });
      }
      await copied(jsm, hold, old.state.messages, ctx);
      ctx.out(`stream ${hold}: holds the ${old.state.messages} messages of the old log`);
      // 4. the old stream goes; the holding stream no longer follows it
      await jsm.streams.delete(name);
      ctx.out(`stream ${name}: old log deleted`);
      info = undefined;
    }
    const holdInfo = await streamInfo(jsm, hold);
    if (info === undefined) {
      if (holdInfo === undefined) throw new OperationError(`neither ${name} nor ${hold} exists: the old log's messages are gone`);
      if ((holdInfo.config.sources ?? []).length > 0) await jsm.streams.update(hold, { ...holdInfo.config, sources: [] });
      // 5. the new log, filled from the holding stream before it takes appends
      const cfg = shardStreamConfig(shard, s.log, ctx.settings);
      await jsm.streams.add({ ...cfg, subjects: [], sources: [{ name: hold }] });
      ctx.out(`stream ${name}: created on log ${s.log}; re-appending`);
      info = await jsm.streams.info(name);
    }
    if ((info.config.subjects ?? []).length === 0) {
      if (holdInfo !== undefined) {
        const want = holdInfo.state.messages;
        await copied(jsm, name, want, ctx);
        ctx.out(`stream ${name}: ${want} messages re-appended`);
      }
      // 6. open for appends
      const cfg = shardStreamConfig(shard, s.log, ctx.settings);
      await jsm.streams.update(name, { ...info.config, subjects: cfg.subjects, sources: [] });
      ctx.out(`stream ${name}: takes appends again`);
    }
    if ((await streamInfo(jsm, hold)) !== undefined) {
      await jsm.streams.delete(hold);
      ctx.out(`stream ${hold}: deleted`);
    }
    // what changed, in one place: the epoch and log, the new boundary, the offsets the new log holds
    const b = s.boundaries[s.boundaries.length - 1]!;
    const prev = s.boundaries[s.boundaries.length - 2];
    const now = await jsm.streams.info(name);
    ctx.out(`shard ${shard}: rebuilt: epoch ${prev?.epoch ?? "?"} -> ${s.epoch}, log ${prev?.log ?? "?"} -> ${s.log}`);
    ctx.out(`  boundary: epoch ${b.epoch} from offset ${b.start_offset} (seq ${seqLabel(b.start_seq)}), prev_end_seq ${seqLabel(b.prev_end_seq)}`);
    ctx.out(`  stream ${name}: offsets ${now.state.first_seq}..${now.state.last_seq} (${now.state.messages} messages) on the new log`);
  });
}

/**
 * Keeps copies for E4 on a second NATS deployment (`to`): the registry and every active shard
 * stream of this one, as streams there that source them through `sourceApi` (the JetStream API
 * prefix of this deployment as seen from there, e.g. `$JS.primary.API` over a leafnode with
 * JetStream domains). The copies take no appends of their own (no subjects) until a failover.
 * Run it again after a split to add the new shard's copy.
 */
export async function setupReplica(ctx: OpsContext, to: NatsConnection, sourceApi: string): Promise<void> {
  await withRegistry(ctx, async (registry) => {
    const jsm = await jetstreamManager(to);
    const copy = async (name: string, extra: Partial<StreamConfigLike>) => {
      if ((await streamInfo(jsm, name)) !== undefined) {
        ctx.out(`copy ${name}: exists`);
        return;
      }
      await jsm.streams.add({ ...extra, name, subjects: [], sources: [{ name, external: { api: sourceApi, deliver: "" } }] } as StreamConfigLike);
      ctx.out(`copy ${name}: created, sourcing ${name} through ${sourceApi}`);
    };
    const reg = registryStreamConfig(ctx.settings.JETGATE_STREAM_REPLICAS);
    await copy(REGISTRY_STREAM, { ...reg, description: COPY_DESCRIPTION });
    for (const s of registry.state.shards.values()) {
      if (s.status !== "active") continue;
      const cfg = shardStreamConfig(s.shard, s.log, ctx.settings);
      await copy(cfg.name, { ...cfg, description: COPY_DESCRIPTION });
    }
  });
}

type StreamConfigLike = Parameters<JetStreamManager["streams"]["add"]>[0];

const COPY_DESCRIPTION = "jetgate copy";

/**
 * E4: makes the copies on this deployment (the one `ctx.nc` is connected to) the primary. The
 * registry copy takes appends, then one record moves every active shard onto a new log (the copy's
 * offsets are its own) with its epoch raised by `epochMargin`, so that cursors of epochs the lost
 * primary wrote after the copy's last record are still below it; then each copy takes its shard's
 * subjects. Workers and gateways are pointed here by configuration and restarted.
 */
export async function failover(ctx: OpsContext, epochMargin: number): Promise<void> {
  if (!Number.isInteger(epochMargin) || epochMargin < 1) throw new OperationError(`--epoch-margin must be a positive integer, got ${epochMargin}`);
  const jsm = await jetstreamManager(ctx.nc);
  const reg = await streamInfo(jsm, REGISTRY_STREAM);
  if (reg === undefined) throw new OperationError(`no ${REGISTRY_STREAM} here: this deployment keeps no copy (see jetgate replica setup)`);
  if (!(reg.config.subjects ?? []).includes(REGISTRY_SUBJECT)) {
    await jsm.streams.update(REGISTRY_STREAM, { ...reg.config, subjects: [REGISTRY_SUBJECT], sources: [], description: "" });
    ctx.out(`${REGISTRY_STREAM}: the copy takes appends (${reg.state.messages} records)`);
  }
  await withRegistry(ctx, async (registry) => {
    const copies = new Map<number, StreamInfo>();
    for (const s of registry.state.shards.values()) {
      if (s.status !== "active") continue;
      const info = await streamInfo(jsm, shardStream(s.shard));
      if (info === undefined) throw new OperationError(`shard ${s.shard}: no copy of ${shardStream(s.shard)} here`);
      if (logOfStream(info) !== s.log) copies.set(s.shard, info);
    }
    // Shards whose copy is not yet the registry's log and whose last boundary is not this failover's.
    const toBump = [...copies.keys()].filter((id) => registry.state.shards.get(id)!.boundaries.at(-1)!.cause !== "failover");
    if (toBump.length > 0) {
      const written = await registry.update((state) =>
        registryRecord("failover", ctx.by, toBump.map((id) => bumpEpoch(state.shards.get(id)!, { cause: "failover", log: newLogId(), start_offset: 1, epochs: epochMargin, owner: null }))),
      );
      for (const id of toBump) {
        const s = written!.state.shards.get(id)!;
        ctx.out(`shard ${id}: epoch -> ${s.epoch} (margin ${epochMargin}) on log ${s.log}`);
      }
    }
    const report = progressReporter(ctx);
    let done = 0;
    for (const [id, info] of copies) {
      const s = registry.state.shards.get(id)!;
      const cfg = shardStreamConfig(id, s.log, ctx.settings);
      await jsm.streams.update(cfg.name, { ...info.config, subjects: cfg.subjects, sources: [], description: cfg.description });
      ctx.out(`stream ${cfg.name}: the copy (${info.state.messages} entries, offsets ${info.state.first_seq}..${info.state.last_seq}) is log ${s.log} and takes appends`);
      report(`failover: ${++done} of ${copies.size} shards switched to their copies`);
    }
    if (copies.size > 0) {
      const epochs = [...copies.keys()].map((id) => `${id}@${registry.state.shards.get(id)!.epoch}`).join(" ");
      ctx.out(`failover: ${copies.size} shards moved to new logs (shard@epoch: ${epochs}), each numbered from offset 1 of its copy; registry at record ${registry.state.seq}`);
    }
    const ingress = await ensureStream(jsm, ingressStreamConfig(ctx.settings));
    ctx.out(`stream ${ingress.info.config.name}: ${ingress.created ? "created" : "exists"}`);
    ctx.out(`failover done: point JETGATE_NATS_URL of workers and gateways here and restart them`);
  });
}
