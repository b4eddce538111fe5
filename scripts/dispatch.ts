/**
 * `npm run dispatch -- --to <user>[,<user>...] --text <text> [--lane <lane>]`: appends one entry to
 * each recipient's mailbox through the Dispatcher (the same library backends use). NATS is the one
 * JETGATE_NATS_URL names, else the running `npm start` stack's (protocol/io/local-stack.ts).
 * Whatever fails is said in one line, without a stack trace.
 */
import { randomBytes } from "node:crypto";
import { ConfigError, seqLabel, DispatchValidationError } from "../protocol/index.js";
import { loadConfig, parseFlags, usageError, Dispatcher, RegistryClient, connectNats, withLocalStack } from "../protocol/io/index.js";

const USAGE = `usage: npm run dispatch -- --to <user>[,<user>...] --text <text> [--lane <lane>]
  appends one entry to each recipient's mailbox; NATS and the lanes are the running npm start
  stack's, or the environment's (JETGATE_NATS_URL, JETGATE_LANES: docs/config.md)`;

async function main(): Promise<number> {
  const { values } = parseFlags({
    options: { to: { type: "string" }, text: { type: "string" }, lane: { type: "string" } },
    strict: true,
  }, USAGE);
  if (values.to === undefined || values.text === undefined) usageError("--to and --text are required", USAGE);
  const config = loadConfig(withLocalStack(process.env), "tool");
  const nc = await connectNats(config, "jetgate-dispatch").catch((err: unknown) => {
    throw new Error(`cannot reach NATS at ${config.JETGATE_NATS_URL.join(",")}: ${(err as Error).message}`);
  });
  const registry = await RegistryClient.open(nc);
  const dispatcher = new Dispatcher(nc, () => registry.shards, { lanes: config.JETGATE_LANES, ackTimeoutMs: 2000, attempts: 3 });
  try {
    const id = `cli-${randomBytes(6).toString("hex")}`;
    const results = await dispatcher.dispatch({
      dispatch_id: id,
      message_id: id,
      lane: values.lane ?? config.JETGATE_LANES[0]!,
      recipients: values.to.split(",").map((s) => s.trim()),
      body: new TextEncoder().encode(values.text),
    });
    for (const r of results) console.log("error" in r ? `${r.user}: ${r.error.code} ${r.error.message}` : `${r.user}: shard ${r.shard} seq ${seqLabel(r.seq)} offset ${r.offset}${r.duplicate ? " (duplicate)" : ""}`);
    return results.some((r) => "error" in r) ? 1 : 0;
  } finally {
    dispatcher.close();
    await registry.close();
    await nc.close();
  }
}

main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    // one line that names the cause: a config error, bad input, no stack, NATS away or too old
    console.error(err instanceof ConfigError || err instanceof DispatchValidationError ? err.message : `dispatch: ${err instanceof Error ? err.message : String(err)}`);
    process.exit(err instanceof DispatchValidationError ? 64 : 1);
  },
);
