/**
 * The process's configuration from its environment (protocol/config.ts parses it; here the files
 * it names are checked from the process), so a secret file that cannot be read is named at start,
 * not at connect.
 */
import { accessSync, constants } from "node:fs";
import { parseConfig, type Config, type ConfigRole } from "../config.js";

function unreadable(path: string): string | undefined {
  try {
    accessSync(path, constants.R_OK);
    return undefined;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code ?? "error";
  }
}

/** Throws ConfigError naming every variable that is wrong. */
export function loadConfig(env: Record<string, string | undefined> = process.env, role: ConfigRole = "gateway"): Config {
  return parseConfig(env, role, unreadable);
}
