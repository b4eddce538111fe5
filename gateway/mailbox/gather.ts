/**
 * The first step of answering a cursor: read what the decision needs, on one registry view. The
 * user's watermarks and the bounds (trim, last offset) of every shard the decision may look at
 * (`shardsInvolved`): a parent's retention counts as much as the child's.
 *
 * A registry view ahead of the streams (a shard recorded before its stream answers) is "not yet",
 * never an internal error: the reads are retried for a while, then the device is told to come back
 * (UNAVAILABLE, 4503) rather than dropped with 4500.
 */
import { JetgateError, backoffCeiling, sleep, systemClock, type Clock, type RegistryState } from "../../protocol/index.js";
import { decideAuth, type AuthDecision, type AuthInput, type CursorIn, type ShardBounds } from "./auth-decision.js";
import { shardsInvolved } from "./positions.js";
import type { MailboxSource, RegistryView, Watermarks } from "../ports.js";

/** A shard the registry names whose stream does not answer yet (it is being created, or moved). */
export class ShardNotReadyError extends JetgateError {
  constructor(
    readonly shard: number,
    options?: { cause?: unknown },
  ) {
    super("SHARD_NOT_READY", `shard ${shard} is in the registry but its stream does not answer yet`, options);
  }
}

/**
 * How soon a device sent away because the registry or a stream did not answer (or a shard was not
 * ready) should come back (`retry_ms`): one value for every such case.
 */
export const RETRY_LATER_MS = 2000;

/** The registry or the streams could not answer in time: the device should come back later. */
export class UnavailableError extends JetgateError {
  constructor(
    message: string,
    readonly retryMs: number,
    options?: { cause?: unknown },
  ) {
    super("UNAVAILABLE", message, options);
  }
}

export interface Gathered {
  input: AuthInput;
  wm: Watermarks;
  /** The registry view the decision is made on. */
  view: RegistryState;
}

/** Waits between attempts while a shard is not ready: 100 ms doubling to 3 s, six of them (about 6 s in all). */
const NOT_READY_BACKOFF = { baseMs: 100, capMs: 3000 };
const NOT_READY_ATTEMPTS = 6;

export interface GatherOptions {
  fresh?: boolean;
  closed?: () => boolean;
  /** Waits while a shard is not ready (default: NOT_READY_ATTEMPTS of NOT_READY_BACKOFF). */
  retries?: number;
  /** Test-only (JETGATE_FAULT_AUTH_PAUSE_MS): a wait between taking the view and the reads. */
  pauseMs?: number;
  /** What the waits (the pause, the not-ready backoff) run on (default: systemClock); a session's timers will do. */
  clock?: Pick<Clock, "setTimeout">;
}

async function gatherOnce(registry: RegistryView, mailbox: MailboxSource, user: string, cursor: CursorIn | undefined, opts: GatherOptions): Promise<Gathered> {
  // One registry view for the whole decision: the registry may change during the reads below.
  const view = registry.state;
  const userShard = registry.shards.shardOf(user);
  if (userShard === undefined) throw new Error("no shard owns this user");
  if (opts.pauseMs !== undefined && opts.pauseMs > 0) await sleep(opts.clock ?? systemClock, opts.pauseMs);
  const fresh = opts.fresh === true;
  const shards = shardsInvolved(view, user, cursor?.shard, userShard);
  const [wm, ...each] = await Promise.all([mailbox.watermarks(userShard, user), ...shards.map((s) => mailbox.bounds(s, { fresh }))]);
  const bounds = new Map<number, ShardBounds>(shards.map((s, i) => [s, each[i]!]));
  return { input: { user, cursor, registry: view, userShard, bounds, head: wm.head }, wm, view };
}

/** Reads, retrying while a shard is not ready; throws UnavailableError when it never gets ready. */
export async function gather(
  registry: RegistryView,
  mailbox: MailboxSource,
  user: string,
  cursor: CursorIn | undefined,
  opts: GatherOptions = {},
): Promise<Gathered> {
  const retries = opts.retries ?? NOT_READY_ATTEMPTS;
  for (let attempt = 0; ; attempt++) {
    try {
      return await gatherOnce(registry, mailbox, user, cursor, opts);
    } catch (err) {
      if (!(err instanceof ShardNotReadyError)) throw err;
      if (attempt >= retries || opts.closed?.() === true) {
        throw new UnavailableError(`${err.message}; reconnect later`, RETRY_LATER_MS, { cause: err });
      }
      await sleep(opts.clock ?? systemClock, backoffCeiling(attempt, NOT_READY_BACKOFF));
    }
  }
}

/**
 * Gather and decide. A cursor beyond a shard's head is judged again on bounds read fresh: the
 * cached last offset may be a second old, and the device may hold an entry appended since.
 */
export async function gatherAndDecide(
  registry: RegistryView,
  mailbox: MailboxSource,
  user: string,
  cursor: CursorIn | undefined,
  opts: Omit<GatherOptions, "fresh"> = {},
): Promise<Gathered & { decision: AuthDecision }> {
  let g = await gather(registry, mailbox, user, cursor, opts);
  let decision = decideAuth(g.input);
  if (decision.case === "invalid" && decision.check === "beyond_head") {
    g = await gather(registry, mailbox, user, cursor, { ...opts, fresh: true, pauseMs: 0 });
    decision = decideAuth(g.input);
  }
  return { ...g, decision };
}
