/**
 * The operator CLI, `jetgate <command>`. Settings come from the environment (docs/config.md);
 * flags override the few that a command takes.
 *
 *   jetgate registry init [--shards N]   create the registry, shard streams and INGRESS (idempotent)
 *   jetgate registry show                print every shard's range, epoch, log and boundaries
 *   jetgate worker                       run a worker process
 */
import { parseArgs } from "node:util";
import { ConfigError, RegistryClient, connectNats, loadConfig, MAX_OFFSET } from "../protocol/index.js";
import { initRegistry } from "./registry-init.js";
import { runWorker } from "./main.js";

const USAGE = `usage:
  jetgate registry init [--shards N]
  jetgate registry show [--json]
  jetgate worker`;

export class UsageError extends Error {
  override readonly name = "UsageError";
}

export async function cli(argv: string[], out: (line: string) => void = console.log): Promise<number> {
  const [group, command, ...rest] = argv;
  if (group === "worker") {
    await runWorker();
    return -1; // keeps running
  }
  if (group !== "registry" || (command !== "init" && command !== "show")) throw new UsageError(USAGE);
  const { values } = parseArgs({
    args: rest,
    options: { shards: { type: "string" }, json: { type: "boolean", default: false } },
    strict: true,
  });
  const env = { ...process.env };
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
      for (const s of r.mismatched) out(`WARNING stream ${s}: its log id differs from the registry's; workers will refuse it`);
      return r.mismatched.length > 0 ? 2 : 0;
    }
    const registry = await RegistryClient.open(nc);
    try {
      const shards = [...registry.state.shards.values()].sort((a, b) => a.shard - b.shard);
      if (values.json) {
        out(JSON.stringify({ seq: registry.state.seq, shards }, (_k, v: unknown) => (typeof v === "bigint" ? v.toString() : v), 2));
        return 0;
      }
      out(`registry at record ${registry.state.seq}: ${shards.length} shards`);
      for (const s of shards) {
        out(`shard ${s.shard} ${s.status} range ${s.range.lo}..${s.range.hi} epoch ${s.epoch} log ${s.log} (${s.boundaries.length} boundaries, ${s.splits.length} splits)`);
        for (const b of s.boundaries) {
          out(`  epoch ${b.epoch} ${b.cause} log ${b.log} start_offset ${b.start_offset} start_seq ${b.start_seq} prev_end_seq ${b.prev_end_seq}`);
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
      console.error(err instanceof ConfigError || err instanceof UsageError ? err.message : err);
      process.exit(err instanceof UsageError ? 64 : 1);
    },
  );
}
