/**
 * The gateway's open files against its limit, from /proc (Linux, where the gateway runs): the
 * limit (RLIMIT_NOFILE), raising its soft value to the hard one at start (Node has no setrlimit:
 * `prlimit`, util-linux, does it for this process), and how many files are open now.
 */
import { execFileSync } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";

export interface FileLimit {
  soft: number;
  hard: number;
}

/** RLIMIT_NOFILE as /proc/self/limits says it ("unlimited" reads as the largest safe integer). */
export function fileLimit(): FileLimit {
  const m = /^Max open files\s+(\S+)\s+(\S+)\s+files/m.exec(readFileSync("/proc/self/limits", "utf8"));
  if (m === null) throw new Error("cannot read the open files limit from /proc/self/limits");
  const n = (v: string) => (v === "unlimited" ? Number.MAX_SAFE_INTEGER : Number(v));
  return { soft: n(m[1]!), hard: n(m[2]!) };
}

/**
 * Raises the soft limit to the hard one; returns the limit before and after, and why it could not
 * when it could not (no `prlimit` on the host, say): the caller logs both.
 */
export function raiseFileLimit(): { before: FileLimit; after: FileLimit; failed?: string } {
  const before = fileLimit();
  if (before.soft >= before.hard) return { before, after: before };
  try {
    execFileSync("prlimit", ["--pid", String(process.pid), `--nofile=${before.hard}:${before.hard}`], { stdio: "ignore", timeout: 5000 });
  } catch (err) {
    return { before, after: fileLimit(), failed: `prlimit failed (${(err as NodeJS.ErrnoException).code ?? (err as Error).message}): raise it with ulimit -n before starting` };
  }
  return { before, after: fileLimit() };
}

/**
 * Files open now (the entries of /proc/self/fd), or undefined when even that cannot be read: the
 * read needs a file of its own, so at the limit it fails (EMFILE), which says as much.
 */
export function openFiles(): number | undefined {
  try {
    return readdirSync("/proc/self/fd").length;
  } catch {
    return undefined;
  }
}
