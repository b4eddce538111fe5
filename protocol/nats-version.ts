/**
 * The oldest nats-server jetgate runs on, and the check every process makes when it connects.
 *
 * 2.12.1: atomic batch publish with Nats-Msg-Id in a batch, which the Dispatcher uses to pipeline
 * a user's entries without reordering them (docs/registry-and-worker.md, "Ordering"). Older
 * servers answer a batch as an ordinary publish of its first message, silently: refusing them at
 * start-up is the only safe answer.
 */
export const MIN_NATS_SERVER = "2.12.1";

/** [major, minor, patch] of a server's version string ("2.15.2", "v2.12.1-RC.3", "2.14.0-beta"); undefined if unreadable. */
export function parseServerVersion(v: string): [number, number, number] | undefined {
  const m = /^v?(\d+)\.(\d+)\.(\d+)/.exec(v);
  return m === null ? undefined : [Number(m[1]), Number(m[2]), Number(m[3])];
}

/** Why a server of this version cannot serve jetgate; undefined when it can. A pre-release of the minimum counts as too old. */
export function natsVersionProblem(version: string | undefined): string | undefined {
  const found = version === undefined ? undefined : parseServerVersion(version);
  if (found === undefined) return `nats-server reported no readable version (${JSON.stringify(version ?? null)}); jetgate needs ${MIN_NATS_SERVER} or later`;
  const min = parseServerVersion(MIN_NATS_SERVER)!;
  for (let i = 0; i < 3; i++) {
    if (found[i]! > min[i]!) return undefined;
    if (found[i]! < min[i]!) return `nats-server ${version} is too old: jetgate needs ${MIN_NATS_SERVER} or later (atomic batch publish with Nats-Msg-Id)`;
  }
  return /^v?\d+\.\d+\.\d+-/.test(version!) ? `nats-server ${version} is a pre-release of ${MIN_NATS_SERVER}: jetgate needs ${MIN_NATS_SERVER} or later` : undefined;
}
