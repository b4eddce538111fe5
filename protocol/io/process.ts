/** Process-level helpers shared by the jetgate processes. */

/**
 * Last words for anything that escaped a handler: one fatal JSON log line, then exit 1 (the
 * platform restarts the process). Without it Node also exits (since 15), but the logs would not say why.
 */
export function exitOnUnhandledRejection(component: string): void {
  process.on("unhandledRejection", (err) => {
    console.error(JSON.stringify({ level: 60, component, msg: "unhandled rejection", err: String((err as Error)?.stack ?? err) }));
    process.exit(1);
  });
}

/** Registry callbacks that log: a skipped record is an error, a follow failure a warning. */
export function registryLogging(log: { error(o: object, msg: string): void; warn(o: object, msg: string): void }) {
  return {
    onBadRecord: (seq: number, err: unknown) => log.error({ seq, err }, "skipping a bad registry record"),
    onFollowError: (err: unknown) => log.warn({ err: (err as Error).message }, "following the registry failed; resuming"),
  };
}

/** Calls `stop` once on the first SIGTERM or SIGINT. */
export function onShutdownSignal(stop: (signal: string) => void): void {
  let called = false;
  const once = (signal: string) => {
    if (called) return;
    called = true;
    stop(signal);
  };
  process.on("SIGTERM", () => once("SIGTERM"));
  process.on("SIGINT", () => once("SIGINT"));
}

/**
 * Runs a process's main when its module is the entry point (`metaUrl` is its import.meta.url).
 * A start-up failure exits 1; a config error prints just its list of bad variables, a server too
 * old just its version.
 */
export function runAsMain(metaUrl: string, main: () => Promise<void>): void {
  if (metaUrl !== `file://${process.argv[1]}`) return;
  main().catch((err: unknown) => {
    // errors that say all there is to say: their message, without a stack
    console.error(["ConfigError", "NatsServerTooOldError", "UwsLoadError"].includes((err as Error)?.name) ? (err as Error).message : err);
    process.exit(1);
  });
}
