#!/usr/bin/env node
// The `jetgate` command: runs the compiled CLI when built (npm run build), else the TypeScript
// sources through tsx (a development checkout).
import { existsSync } from "node:fs";

const dist = new URL("../dist/worker/cli.js", import.meta.url);
const mod = existsSync(dist) ? await import(dist.href) : await (async () => {
  const { register } = await import("tsx/esm/api");
  register();
  return import(new URL("../worker/cli.ts", import.meta.url).href);
})();
mod.cli(process.argv.slice(2)).then(
  (code) => {
    if (code >= 0) process.exit(code);
  },
  (err) => {
    const known = ["ConfigError", "UsageError", "OperationError", "NatsServerTooOldError", "LocalStackError"].includes(err?.name);
    // one line; the stack trace only when asked for (JETGATE_LOG_LEVEL=debug)
    const debug = ["debug", "trace"].includes(process.env.JETGATE_LOG_LEVEL ?? "");
    console.error(known || !debug ? (known ? err.message : `jetgate: ${err?.message ?? String(err)}`) : err);
    // 64: bad usage (EX_USAGE); 2: the operation was refused or cannot go on; 1: anything else
    process.exit(err?.name === "UsageError" ? 64 : err?.name === "OperationError" ? 2 : 1);
  },
);
