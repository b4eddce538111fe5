/**
 * The operator CLI, `jetgate <command>`. Settings come from the environment (docs/config.md), or
 * where it names no NATS, from the running `npm start` stack of this checkout
 * (protocol/io/local-stack.ts); flags override the few that a command takes.
 *
 * Every command is one row of COMMANDS (its words, its arguments, what it does, its handler): the
 * usage text, the check of a command's name and the dispatch all come from that table, so a new
 * command is one new row (and its line in docs/operations.md).
 */
import { randomBytes } from "node:crypto";
import { parseArgs, type ParseArgsConfig } from "node:util";
import type { NatsConnection } from "@nats-io/transport-node";
import { ConfigError, SERVICE_SCOPES, serviceTokenHash, ServiceTokensError, ServiceTokenTable, bigintsAsStrings, countLabel, rangeLabel, MAX_OFFSET, seqLabel, type Config } from "../protocol/index.js";
import { RegistryClient, connectNats, loadConfig, wantsHelp, withLocalStack } from "../protocol/io/index.js";
import { initRegistry } from "./registry-init.js";
import { runWorker } from "./main.js";
import { OperationError, failover, rebuildShard, setupReplica, splitShardOp, takeoverShard, type OpsContext } from "./shard-ops.js";

/** Where a command's lines go; `status`: a long step's progress, redrawn in place (a terminal only). */
export interface Output {
  out: (line: string) => void;
  status?: ((line: string) => void) | undefined;
}

export interface Command {
  /** Its words after `jetgate`, e.g. "shard split". */
  readonly name: string;
  /** Its arguments as the usage text shows them ("" for none). */
  readonly args: string;
  /** What it does, in one line of the usage text. */
  readonly description: string;
  /** Runs it on the words after its name; resolves to the exit code (-1: it keeps running). */
  readonly run: (args: string[], o: Output) => Promise<number>;
}

export const COMMANDS: readonly Command[] = [
  {
    name: "registry init",
    args: "[--shards N]",
    description: "create the registry, shard streams, INGRESS and JETGATE_FLOORS (idempotent)",
    run: (args, o) => withRegistry(args, (nc, config) => registryInit(nc, config, o.out)),
  },
  {
    name: "registry show",
    args: "[--json]",
    description: "print each shard's range, epoch, log and boundaries",
    run: (args, o) => withRegistry(args, (nc, _config, json) => registryShow(nc, json, o.out)),
  },
  {
    name: "shard takeover",
    args: "<id>",
    description: "fence the shard's owner: a new epoch from its ack floor",
    run: (args, o) => operation(args, o, "ignored", (ctx, { positionals }) => takeoverShard(ctx, shardId(positionals[0]))),
  },
  {
    name: "shard split",
    args: "<id> [--child N] [--lower]",
    description: "move half of the shard's range to a new shard",
    run: (args, o) =>
      operation(args, o, "ignored", (ctx, { values, positionals }) => {
        const child = values.child === undefined ? undefined : intFlag("child", values.child, 0);
        return splitShardOp(ctx, shardId(positionals[0]), { ...(child !== undefined ? { child } : {}), lower: values.lower });
      }),
  },
  {
    name: "shard rebuild",
    args: "<id>",
    description: "recreate the shard's stream on a new log",
    run: (args, o) => operation(args, o, "ignored", (ctx, { positionals }) => rebuildShard(ctx, shardId(positionals[0]))),
  },
  {
    name: "replica setup",
    args: "--to <nats-url> --source-api <prefix>",
    description: "keep copies on a second deployment",
    run: (args, o) =>
      operation(args, o, "required", async (ctx, { values }, config) => {
        if (values["source-api"] === undefined) throw new UsageError(`--source-api <prefix> is required (e.g. '$JS.primary.API')\n${USAGE}`);
        const to = await connectNats({ ...config, JETGATE_NATS_URL: values.to!.split(",") }, "jetgate-cli-replica");
        try {
          await setupReplica(ctx, to, values["source-api"]);
        } finally {
          await to.close();
        }
      }),
  },
  {
    name: "failover",
    args: "--to <nats-url> [--epoch-margin N]",
    description: "make that deployment's copies the primary",
    run: async (args, o) => {
      // a word after `failover` is a mistyped command, told before connecting
      if (args[0] !== undefined && !args[0].startsWith("-")) throw unknownCommand(["failover", args[0]]);
      return operation(args, o, "connect", (ctx, { values, positionals }) => {
        if (positionals.length > 0) throw new UsageError(USAGE);
        return failover(ctx, intFlag("epoch-margin", values["epoch-margin"], 100));
      });
    },
  },
  {
    name: "token new",
    args: "--name <name> --scopes <scope,...> [--not-after <iso-time>]",
    description: `make a service token (scopes: ${SERVICE_SCOPES.join(" ")}): the token once, and its tokens-file entry`,
    run: (args, o) => Promise.resolve(tokenNew(args, o.out)),
  },
  {
    name: "worker",
    args: "",
    description: "run a worker process",
    run: async () => {
      await runWorker();
      return -1; // keeps running
    },
  },
  {
    name: "help",
    args: "| --help",
    description: "print this usage",
    run: (_args, o) => {
      o.out(USAGE);
      return Promise.resolve(0);
    },
  },
];

function usage(commands: readonly Command[]): string {
  const calls = commands.map((c) => `jetgate ${c.name}${c.args === "" ? "" : ` ${c.args}`}`);
  const width = Math.max(...calls.map((call) => call.length));
  const lines = commands.map((c, i) => `  ${calls[i]!.padEnd(width)}  ${c.description}`);
  return `usage:\n${lines.join("\n")}\nSettings come from the environment (docs/config.md); exit codes: 0 done, 2 refused, 64 bad usage.`;
}

export const USAGE = usage(COMMANDS);

function unknownCommand(argv: readonly string[]): UsageError {
  return new UsageError(`${argv[0] === undefined ? "which command?" : `unknown command: ${argv.slice(0, 2).join(" ")}`}\n${USAGE}`);
}

/** The row whose words begin `argv`, and the words after them; an unknown command is a usage error. */
function find(argv: readonly string[]): { command: Command; args: string[] } {
  for (const command of COMMANDS) {
    const words = command.name.split(" ");
    if (words.every((w, i) => argv[i] === w)) return { command, args: argv.slice(words.length) };
  }
  throw unknownCommand(argv);
}

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

/** An operation's flags: one set for all of them (a flag of another operation is accepted and unused). */
function operationFlags(args: string[]) {
  return parse({
    args,
    options: {
      child: { type: "string" }, lower: { type: "boolean", default: false },
      to: { type: "string" }, "source-api": { type: "string" }, "epoch-margin": { type: "string" },
    },
    strict: true,
    allowPositionals: true,
  });
}

/**
 * Runs an epoch operation: its flags, the settings, then `op` on a NATS connection (closed after).
 * `to`: whether --to is ignored, required, or required and the deployment to connect to (failover
 * runs against the one taking over; everything else against the configured one).
 */
async function operation(
  args: string[],
  o: Output,
  to: "ignored" | "required" | "connect",
  op: (ctx: OpsContext, flags: ReturnType<typeof operationFlags>, config: Config) => Promise<void>,
): Promise<number> {
  const flags = operationFlags(args);
  const config = loadConfig(withLocalStack({ ...process.env }), "tool");
  if (to !== "ignored" && flags.values.to === undefined) throw new UsageError(`--to <nats-url> is required\n${USAGE}`);
  const nc = await connectNats(to === "connect" ? { ...config, JETGATE_NATS_URL: flags.values.to!.split(",") } : config, "jetgate-cli");
  const ctx: OpsContext = { nc, settings: config, by: "cli", out: o.out, ...(o.status !== undefined ? { status: o.status } : {}) };
  try {
    await op(ctx, flags, config);
    return 0;
  } finally {
    await nc.close();
  }
}

/** Runs a registry command: its flags (--shards overrides JETGATE_SHARDS), the settings, then `run` on a NATS connection (closed after). */
async function withRegistry(args: string[], run: (nc: NatsConnection, config: Config, json: boolean) => Promise<number>): Promise<number> {
  const { values } = parse({
    args,
    options: { shards: { type: "string" }, json: { type: "boolean", default: false } },
    strict: true,
  });
  const env = withLocalStack({ ...process.env });
  if (values.shards !== undefined) env.JETGATE_SHARDS = values.shards;
  const config = loadConfig(env, "tool");
  const nc = await connectNats(config, "jetgate-cli");
  try {
    return await run(nc, config, values.json);
  } finally {
    await nc.close();
  }
}

async function registryInit(nc: NatsConnection, config: Config, out: (line: string) => void): Promise<number> {
  const r = await initRegistry(nc, { ...config, shards: config.JETGATE_SHARDS, by: "cli" });
  out(r.layoutWritten ? `registry: initialised with ${r.shards} shards` : `registry: already initialised (${r.shards} shards); nothing changed`);
  if (r.registryCreated) out("stream JETGATE_REGISTRY: created");
  for (const s of r.streamsCreated) out(`stream ${s}: created`);
  for (const s of r.streamsExisting) out(`stream ${s}: exists`);
  for (const s of r.atomicEnabled) out(`stream ${s}: atomic batches allowed (allow_atomic)`);
  for (const s of r.mismatched) out(`WARNING stream ${s}: its log id differs from the registry's; workers will refuse it`);
  return r.mismatched.length > 0 ? 2 : 0;
}

async function registryShow(nc: NatsConnection, json: boolean, out: (line: string) => void): Promise<number> {
  const registry = await RegistryClient.open(nc);
  try {
    const shards = [...registry.state.shards.values()].sort((a, b) => a.shard - b.shard);
    if (json) {
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
}

/**
 * A new service token: 32 random bytes (256 bits, far over the 96 production asks), printed once,
 * and the entry that names it in JETGATE_SERVICE_TOKENS_FILE (its SHA-256, never the token). The
 * entry is checked as the gateway will read it, so a bad name or scope is told here.
 */
function tokenNew(args: string[], out: (line: string) => void): number {
  const { values } = parse({ args, options: { name: { type: "string" }, scopes: { type: "string" }, "not-after": { type: "string" } }, strict: true });
  if (values.name === undefined || values.scopes === undefined) throw new UsageError(`--name and --scopes are required (scopes: ${SERVICE_SCOPES.join(", ")})\n${USAGE}`);
  const token = randomBytes(32).toString("base64url");
  const entry = {
    name: values.name,
    sha256: serviceTokenHash(token),
    scopes: values.scopes.split(",").map((s) => s.trim()).filter((s) => s !== ""),
    ...(values["not-after"] !== undefined ? { not_after: values["not-after"] } : {}),
  };
  try {
    ServiceTokenTable.from(JSON.stringify({ tokens: [entry] }), undefined);
  } catch (err) {
    if (err instanceof ServiceTokensError) throw new UsageError(err.problems.map((p) => p.replace(/^tokens\.0\./, "--").replace("--not_after", "--not-after")).join("\n"));
    throw err;
  }
  out(`token: ${token}`);
  out("  give it to the backend as its bearer token; it is shown only now (the file keeps its hash)");
  out("entry for JETGATE_SERVICE_TOKENS_FILE (under `tokens:`):");
  out(`  - name: ${entry.name}`);
  out(`    sha256: "${entry.sha256}"`); // quoted: YAML would read an all-digit hash as a number
  out(`    scopes: [${entry.scopes.join(", ")}]`);
  if (entry.not_after !== undefined) out(`    not_after: "${entry.not_after}"`);
  return 0;
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

/** `given`: where lines go (a test's collector); left out, stdout, with a live status line when it is a terminal. */
export async function cli(argv: string[], given?: (line: string) => void): Promise<number> {
  const term = given === undefined && process.stdout.isTTY === true ? terminal((s) => void process.stdout.write(s)) : undefined;
  const out = given ?? term?.out ?? console.log;
  // `--help` anywhere asks for the usage, whatever command it follows
  const { command, args } = wantsHelp(argv) ? find(["help"]) : find(argv);
  return command.run(args, { out, status: term?.status });
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
