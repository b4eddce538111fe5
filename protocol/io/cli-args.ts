/**
 * Flags of jetgate's commands, read the same way everywhere: `--help` (or `-h`) prints the usage to
 * stdout and exits 0; an unknown flag or a missing value prints what is wrong and the usage to
 * stderr and exits 64 (EX_USAGE), never a stack trace.
 */
import { parseArgs, type ParseArgsConfig } from "node:util";

export const EX_USAGE = 64;

export function wantsHelp(args: readonly string[]): boolean {
  return args.includes("--help") || args.includes("-h");
}

export function parseFlags<T extends ParseArgsConfig>(config: T, usage: string): ReturnType<typeof parseArgs<T>> {
  const args = config.args ?? process.argv.slice(2);
  if (wantsHelp(args)) {
    process.stdout.write(`${usage}\n`);
    process.exit(0);
  }
  try {
    return parseArgs({ ...config, args }) as ReturnType<typeof parseArgs<T>>;
  } catch (err) {
    return usageError((err as Error).message, usage);
  }
}

/** Says what is wrong and how to call the command, and exits 64. */
export function usageError(problem: string, usage: string): never {
  process.stderr.write(`${problem}\n${usage}\n`);
  process.exit(EX_USAGE);
}
