/** Process-level helpers shared by the jetgate processes. */

/**
 * Last words for anything that escaped a handler: one fatal JSON log line, then exit 1 (the
 * platform restarts the process). Without it Node 20 also exits, but the logs would not say why.
 */
export function exitOnUnhandledRejection(component: string): void {
  process.on("unhandledRejection", (err) => {
    console.error(JSON.stringify({ level: 60, component, msg: "unhandled rejection", err: String((err as Error)?.stack ?? err) }));
    process.exit(1);
  });
}
