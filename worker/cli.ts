/**
 * The operator CLI, `jetgate <command>`. Settings come from the environment (docs/config.md), or
 * where it names no NATS, from the running `npm start` stack of this checkout
 * (protocol/io/local-stack.ts); flags override the few that a command takes.
 *
 *   jetgate registry init [--shards N]   create the registry, shard streams and INGRESS (idempotent)
 *   jetgate registry show                print every shard's range, epoch, log and boundaries
 *   jetgate shard takeover|split|rebuild <id>   epoch operations (docs/operations.md)
 *   jetgate replica setup --to <url> --source-api <prefix>   keep copies on a second deployment
 *   jetgate failover --to <url>          make that deployment's copies the primary
 *   jetgate worker                       run a worker process
 */
import { parseArgs, type ParseArgsConfig } from "node:util";
import { ConfigError, bigintsAsStrings, countLabel, loadConfig, rangeLabel, wantsHelp, MAX_OFFSET, seqLabel } from "../protocol/index.js";
import { RegistryClient, connectNats, withLocalStack } from "../protocol/io/index.js";
import { initRegistry } from "./registry-init.js";
import { runWorker } from "./main.js";
import { OperationError, failover, rebuildShard, setupReplica, splitShardOp, takeoverShard, type OpsContext } from "./shard-ops.js";

const USAGE = `usage:
  jetgate registry init [--shards N]
  jetgate registry show [--json]
  jetgate shard takeover <id>
  jetgate shard split <id> [--child N] [--lower]
  jetgate shard rebuild <id>
  jetgate replica setup --to <nats-url> --source-api <prefix>
  jetgate failover --to <nats-url> [--epoch-margin N]
  jetgate worker
  jetgate help | --help
Settings come from the environment (docs/config.md); exit codes: 0 done, 2 refused, 64 bad usage.`;

/** parseArgs, with its errors (unknown option, missing value) as usage errors. */
function parse<T extends ParseArgsConfig>(config: T): ReturnType<typeof parseArgs<T>> {
  try {
    return parseArgs(config);
  } catch (err) {
    throw new UsageError(`${(err as Error).message}\n${USAGE}`);
  }
}

function shardId(arg: string | undefined): number {
  if (arg === undefined || !/^\d{1,9}$/.test(arg)) throw new UsageError(`shard id must be a non-negative integer, got ${arg ?? "nothing"}\n${USAGE}`);
  return Number(arg);
}

function intFlag(name: string, v: string | undefined, fallback: number): number {
  if (v === undefined) return fallback;
  if (!/^\d{1,9}$/.test(v)) throw new UsageError(`--${name} must be a non-negative integer, got ${v}`);
  return Number(v);
}

const OPERATIONS = ["shard takeover", "shard split", "shard rebuild", "replica setup"];

async function operate(argv: string[], out: (line: string) => void, status?: (line: string) => void): Promise<number> {
  const [group, command, ...rest] = argv;
  // checked before connecting: a typo is a usage error even when NATS is away
  const known = group === "failover" ? command === undefined || command.startsWith("-") : OPERATIONS.includes(`${group} ${command}`);
  if (!known) throw new UsageError(`unknown command: ${argv.slice(0, 2).join(" ")}\n${USAGE}`);
  const { values, positionals } = parse({
    args: group === "shard" ? rest : [command ?? "", ...rest].filter((x) => x !== ""),
    options: {
      child: { type: "string" }, lower: { type: "boolean", default: false },
      to: { type: "string" }, "source-api": { type: "string" }, "epoch-margin": { type: "string" },
    },
    strict: true,
    allowPositionals: true,
  });
  const config = loadConfig(withLocalStack({ ...process.env }), "tool");
  if ((group === "failover" || group === "replica") && values.to === undefined) throw new UsageError(`--to <nats-url> is required\n${USAGE}`);
  // failover runs against the deployment taking over; everything else against the configured one
  const nc = await connectNats(group === "failover" ? { ...config, JETGATE_NATS_URL: values.to!.split(",") } : config, "jetgate-cli");
  const ctx: OpsContext = { nc, settings: config, by: "cli", out, ...(status !== undefined ? { status } : {}) };
  try {
    if (group === "shard" && command === "takeover") await takeoverShard(ctx, shardId(positionals[0]));
    else if (group === "shard" && command === "split") {
      const child = values.child === undefined ? undefined : intFlag("child", values.child, 0);
      await splitShardOp(ctx, shardId(positionals[0]), { ...(child !== undefined ? { child } : {}), lower: values.lower });
    } else if (group === "shard" && command === "rebuild") await rebuildShard(ctx, shardId(positionals[0]));
    else if (group === "replica" && command === "setup") {
      if (values["source-api"] === undefined) throw new UsageError(`--source-api <prefix> is required (e.g. '$JS.primary.API')\n${USAGE}`);
      const to = await connectNats({ ...config, JETGATE_NATS_URL: values.to!.split(",") }, "jetgate-cli-replica");
      try {
        await setupReplica(ctx, to, values["source-api"]);
      } finally {
        await to.close();
      }
    } else if (group === "failover" && positionals.length === 0) await failover(ctx, intFlag("epoch-margin", values["epoch-margin"], 100));
    else throw new UsageError(USAGE);
    return 0;
  } finally {
    await nc.close();
  }
}

export class UsageError extends Error {
  override readonly name = "UsageError";
}

/**
 * Output on a terminal: a status line (a long step's progress) redrawn in place, which the next
 * plain line replaces. `write` is the terminal's (process.stdout.write).
 */
export function terminal(write: (s: string) => void): { out: (line: string) => void; status: (line: string) => void } {
  let drawn = false;
  return {
    out: (line) => {
      write(`${drawn ? "\r\x1b[2K" : ""}${line}\n`);
      drawn = false;
    },
    status: (line) => {
      write(`\r\x1b[2K${line}`);
      drawn = true;
    },
  };
}

/** `out`: where lines go (a test's collector); left out, stdout, with a live status line when it is a terminal. */
export async function cli(argv: string[], given?: (line: string) => void): Promise<number> {
  const term = given === undefined && process.stdout.isTTY === true ? terminal((s) => void process.stdout.write(s)) : undefined;
  const out = given ?? term?.out ?? console.log;
  if (wantsHelp(argv) || argv[0] === "help") {
    out(USAGE);
    return 0;
  }
  const [group, command, ...rest] = argv;
  if (group === "worker") {
    await runWorker();
    return -1; // keeps running
  }
  if (group === "shard" || group === "replica" || group === "failover") return operate(argv, out, term?.status);
  if (group !== "registry" || (command !== "init" && command !== "show")) {
    throw new UsageError(`${group === undefined ? "which command?" : `unknown command: ${argv.slice(0, 2).join(" ")}`}
${USAGE}`);
  }
  const { values } = parse({
    args: rest,
    options: { shards: { type: "string" }, json: { type: "boolean", default: false } },
    strict: true,
  });
  const env = withLocalStack({ ...process.env });
  if (values.shards !== undefined) env.JETGATE_SHARDS = values.shards;
  const config = loadConfig(env, "tool");
  const nc = await connectNats(config, "jetgate-cli");
  try {
    if (command === "init") {
      const r = await initRegistry(nc, { ...config, shards: config.JETGATE_SHARDS, by: "cli" });
      out(r.layoutWritten ? `registry: initialised with ${r.shards} shards` : `registry: already initialised (${r.shards} shards); nothing changed`);
      if (r.registryCreated) out("stream JETGATE_REGISTRY: created");
      for (const s of r.streamsCreated) out(`stream ${s}: created`);
      for (const s of r.streamsExisting) out(`stream ${s}: exists`);
      for (const s of r.atomicEnabled) out(`stream ${s}: atomic batches allowed (allow_atomic)`);
      for (const s of r.mismatched) out(`WARNING stream ${s}: its log id differs from the registry's; workers will refuse it`);
      return r.mismatched.length > 0 ? 2 : 0;
    }
    const registry = await RegistryClient.open(nc);
    try {
      const shards = [...registry.state.shards.values()].sort((a, b) => a.shard - b.shard);
      if (values.json) {
        out(JSON.stringify({ seq: registry.state.seq, shards }, bigintsAsStrings, 2));
        return 0;
      }
      out(`registry at record ${registry.state.seq}: ${shards.length} shards`);
      for (const s of shards) {
        // who works under the current epoch: unclaimed (written by an operation, or released by a
        // planned stop: the next worker resumes it), or the worker
        const released = s.released_offset !== undefined ? `, released at offset ${s.released_offset}` : "";
        const owner = s.owner === null ? `unclaimed${released}` : s.owner === undefined ? "claimed" : `claimed by ${s.owner}${released ? ` (resumed after a release at offset ${s.released_offset})` : ""}`;
        out(`shard ${s.shard} ${s.status} range ${rangeLabel(s.range)} epoch ${countLabel(s.epoch)} log ${s.log} (${s.boundaries.length} boundaries, ${s.splits.length} splits; epoch ${owner})`);
        for (const b of s.boundaries) {
          out(`  epoch ${b.epoch} ${b.cause} log ${b.log} start_offset ${b.start_offset} start_seq ${seqLabel(b.start_seq)} prev_end_seq ${seqLabel(b.prev_end_seq)}`);
        }
      }
      out(`offset limit per log: ${MAX_OFFSET}`);
      return 0;
    } finally {
      await registry.close();
    }
  } finally {
    await nc.close();
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  cli(process.argv.slice(2)).then(
    (code) => {
      if (code >= 0) process.exit(code);
    },
    (err: unknown) => {
      console.error(err instanceof ConfigError || err instanceof UsageError || err instanceof OperationError ? err.message : err);
      process.exit(err instanceof UsageError ? 64 : err instanceof OperationError ? 2 : 1);
    },
  );
}
