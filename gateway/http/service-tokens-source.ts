/**
 * The service tokens a gateway takes now: JETGATE_SERVICE_TOKEN and JETGATE_SERVICE_TOKENS_FILE,
 * read at start (a bad file stops the gateway, naming the variable) and again on SIGHUP or when
 * the file changes. A reload swaps the whole table at once and touches no connection; a file that
 * cannot be read or used keeps the table in force, logged and counted, so a bad edit never locks
 * every backend out.
 *
 * The file is polled (stat), not watched by inode: a Kubernetes Secret volume replaces its files
 * by swapping a symlink, which an inode watch does not follow.
 */
import { readFileSync, unwatchFile, watchFile, type Stats } from "node:fs";
import type { Logger } from "pino";
import { ConfigError, ServiceTokensError, ServiceTokenTable } from "../../protocol/index.js";

export interface ServiceTokensHooks {
  /** A reload's outcome: `ok` (the new table is in force) or `error` (the old one stays). */
  reloaded: (outcome: "ok" | "error") => void;
  /** The table now in force (at start and after every reload that took). */
  inForce: (table: ServiceTokenTable) => void;
}

/** How often the file is checked for a change. */
export const TOKENS_FILE_POLL_MS = 1000;

export class ServiceTokensSource {
  private current: ServiceTokenTable;
  private watching = false;

  /** Throws ConfigError naming JETGATE_SERVICE_TOKENS_FILE and each problem of the file. */
  constructor(
    private readonly file: string | undefined,
    private readonly single: string | undefined,
    private readonly log: Logger,
    private readonly hooks: ServiceTokensHooks,
  ) {
    try {
      this.current = this.read();
    } catch (err) {
      throw new ConfigError(problemsOf(err).map((p) => `JETGATE_SERVICE_TOKENS_FILE: ${p}`));
    }
    hooks.inForce(this.current);
  }

  get table(): ServiceTokenTable {
    return this.current;
  }

  /** Reads the file again; on any problem the table in force stays. Returns whether the new one took. */
  reload(why: "SIGHUP" | "change"): boolean {
    const before = new Set(this.current.tokens.map((t) => t.name));
    let next: ServiceTokenTable;
    try {
      next = this.read();
    } catch (err) {
      this.hooks.reloaded("error");
      this.log.error({ why, file: this.file, problems: problemsOf(err) }, "service tokens not reloaded: the tokens in force stay");
      return false;
    }
    this.current = next;
    const after = next.tokens.map((t) => t.name);
    this.hooks.reloaded("ok");
    this.hooks.inForce(next);
    this.log.info({ why, file: this.file, tokens: after, added: after.filter((n) => !before.has(n)), removed: [...before].filter((n) => !after.includes(n)) }, "service tokens reloaded");
    return true;
  }

  /** Polls the file every `intervalMs` and reloads when it changed. */
  watch(intervalMs = TOKENS_FILE_POLL_MS): void {
    if (this.file === undefined || this.watching) return;
    this.watching = true;
    watchFile(this.file, { interval: intervalMs, persistent: false }, (now: Stats, prev: Stats) => {
      if (now.mtimeMs !== prev.mtimeMs || now.size !== prev.size || now.ino !== prev.ino) this.reload("change");
    });
  }

  stop(): void {
    if (this.file !== undefined && this.watching) unwatchFile(this.file);
    this.watching = false;
  }

  private read(): ServiceTokenTable {
    let text: string | undefined;
    if (this.file !== undefined) {
      try {
        text = readFileSync(this.file, "utf8");
      } catch (err) {
        throw new ServiceTokensError([`cannot read ${this.file} (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`]);
      }
    }
    return ServiceTokenTable.from(text, this.single);
  }
}

function problemsOf(err: unknown): readonly string[] {
  if (err instanceof ServiceTokensError) return err.problems;
  throw err;
}
