/**
 * A session's synchronisation: everything that puts entries on the wire, in order, once.
 *
 * Steps of one session run one at a time on a serial chain (hocuspocus style): an async step
 * (AUTH's catch-up, a rebase, a gap or tail fill, a PULL) cannot be overtaken by the next frame or
 * push. A decision (AUTH's or a rebase's) is delivered here: the ERROR frame if any, old ranges,
 * catch-up, the pushes held meanwhile, SYNCED, live. Every entry goes out through `emit`, which
 * sends only what `Delivery` selects: seqs above the last one sent on this connection (anything
 * else is dropped and counted as a regression).
 */
import { Disconnect, seqEpoch, encodeEntry, encodeMsgsFrame, type Entry, type MailboxSeq, type Push } from "../../protocol/index.js";
import { planAnswer, type AnswerFor } from "./answer.js";
import type { CursorIn } from "../mailbox/auth-decision.js";
import { Delivery } from "./delivery.js";
import { gatherAndDecide, RETRY_LATER_MS, ShardNotReadyError, UnavailableError, type Gathered } from "../mailbox/gather.js";
import type { HubMember, Watermarks } from "../ports.js";
import { SessionOutput } from "./output.js";

/** An entry's bytes, encoded once however many sessions send it (fan-out shares the Entry object). */
const encodings = new WeakMap<Entry, Uint8Array>();
function encodedOnce(e: Entry): Uint8Array {
  let b = encodings.get(e);
  if (b === undefined) encodings.set(e, (b = encodeEntry(e)));
  return b;
}

/** A live MSGS frame for a batch's pushes of one user, encoded once for all of its sessions that send every one. */
const liveFrames = new WeakMap<readonly Push[], Uint8Array>();
function sharedFrame(pushes: readonly Push[], shard: number): Uint8Array {
  let b = liveFrames.get(pushes);
  if (b === undefined) liveFrames.set(pushes, (b = encodeMsgsFrame(shard, pushes.map((p) => encodedOnce(p.entry)))));
  return b;
}

/** Bytes per MSGS frame during catch-up. */
const FRAME_BYTES = 64 * 1024;
/** Catch-up waits for the socket to drain above this many buffered bytes. */
const PACE_BYTES = 256 * 1024;
/** Live pushes kept while syncing; beyond it the session re-reads the mailbox instead. */
export const MAX_HELD_PUSHES = 10_000;

export abstract class SessionSync extends SessionOutput implements HubMember {
  protected delivery = new Delivery(undefined, MAX_HELD_PUSHES);
  private chain: Promise<void> = Promise.resolve();
  private pendingSteps = 0;
  private drainWaiter: (() => void) | undefined;
  /** Where the session stood when a tail check last asked the stream for a head Redis lacked. */
  private tailAskedAt: MailboxSeq | undefined;

  /** The socket drained: a paced catch-up goes on. */
  onDrain(): void {
    const w = this.drainWaiter;
    this.drainWaiter = undefined;
    w?.();
  }

  // ---- the chain -------------------------------------------------------------------------------

  protected enqueue(step: () => Promise<void>): void {
    this.pendingSteps++;
    this.chain = this.chain
      .then(step)
      .catch((err: unknown) => {
        if (this.closed) return;
        // A dependency that did not answer, or a live read of a shard whose stream is not there
        // yet: the device resumes by cursor and loses nothing (4500 would name a server fault).
        if (err instanceof UnavailableError || err instanceof ShardNotReadyError) {
          this.p.log.warn({ err: err.message, session: this.id, user: this.user }, "session step: not ready");
          const retryMs = err instanceof UnavailableError ? err.retryMs : RETRY_LATER_MS;
          this.fail(Disconnect.UNAVAILABLE, err.message, { retry_ms: retryMs });
          return;
        }
        this.p.log.error({ err, session: this.id, user: this.user }, "session step failed");
        this.fail(Disconnect.INTERNAL, "internal error");
      })
      .finally(() => this.pendingSteps--);
  }

  private get chainIdle(): boolean {
    return this.pendingSteps === 0;
  }

  // ---- output of entries -----------------------------------------------------------------------

  /** Sends what `Delivery` selects of `entries` (of `shard`), in MSGS frames; `paced` waits for the socket. */
  protected async emit(shard: number, entries: readonly Entry[], paced: boolean): Promise<void> {
    if (this.closed) return;
    // Entries numbered by an epoch this session's token does not have: a step queued before the
    // rebase read them on a registry view that has moved on since (a gap fill after a rebuild).
    // Sent now, they would reach the device under the older epoch's token (CURSOR_INVALID at its
    // next AUTH); the rebase reads them again from what was sent.
    // entries ascend: only when the last is beyond is any (no scan per entry otherwise)
    const last = entries[entries.length - 1];
    const beyond = last !== undefined && seqEpoch(last.seq) > this.epoch ? entries.findIndex((e) => seqEpoch(e.seq) > this.epoch) : -1;
    if (beyond >= 0) {
      this.onShardChange();
      entries = entries.slice(0, beyond);
    }
    const out = this.select(entries);
    let frame: Uint8Array[] = [];
    let bytes = 0;
    for (let i = 0; i < out.length; i++) {
      const enc = encodedOnce(out[i]!);
      frame.push(enc);
      bytes += enc.byteLength;
      if (bytes < FRAME_BYTES && i < out.length - 1) continue;
      this.sendBytes(encodeMsgsFrame(shard, frame), "MSGS");
      frame = [];
      bytes = 0;
      if (this.closed) return;
      if (paced && this.t.buffered() > PACE_BYTES) await new Promise<void>((r) => (this.drainWaiter = r));
    }
  }

  /** What `Delivery` lets out of `entries`, counted. */
  private select(entries: readonly Entry[]): Entry[] {
    const before = this.delivery.regressions;
    const out = this.delivery.select(entries);
    if (this.delivery.regressions > before) this.p.metrics.regressions.inc({ component: "gateway" }, this.delivery.regressions - before);
    if (out.length > 0) this.p.metrics.entriesSent.inc(out.length);
    return out;
  }

  // ---- a decision delivered: AUTH's or a rebase's -----------------------------------------------

  /** Answers a decision inline: the ERROR frame if any, AUTH_OK (on AUTH), old ranges, catch-up, SYNCED, live. */
  protected async answerAndDeliver(g: Gathered & { decision: Parameters<typeof planAnswer>[0] }, to: AnswerFor): Promise<void> {
    const d = g.decision;
    this.state = { type: "syncing" };
    this.shard = d.shard;
    this.epoch = d.epoch;
    this.log = d.log;
    this.p.hub.watch(this);
    // A registry change between the decision's view and `watch` reached no session of this one's
    // shard: look again after this step (a split landing mid-AUTH left a moved user's session on
    // the parent for good; the split fault scenario found it).
    if (this.p.registry.state !== g.view) this.onShardChange();
    const answer = planAnswer(d, g.view, (s, e, l) => this.p.cursors.sign(this.user, s, e, l), to);
    for (const f of answer.frames) this.send(f);
    // Old ranges of a split: their seqs (older shards' numbering) are all below the new shard's.
    for (const r of answer.ranges) {
      this.delivery.moveTo(r.after);
      for await (const page of this.p.mailbox.read(r.shard, this.user, r.after, { until: r.until })) {
        this.p.metrics.catchupEntries.inc({ source: page.source }, page.entries.length);
        await this.emit(r.shard, page.entries, true);
      }
    }
    this.delivery.moveTo(d.from);
    await this.catchUp(g.wm);
  }

  /** Everything after lastSent in the current shard, then the pushes held meanwhile, then live. */
  private async catchUp(wm: Watermarks): Promise<void> {
    if (wm.head > this.delivery.lastSent || wm.from === "stream") {
      for await (const page of this.p.mailbox.read(this.shard, this.user, this.delivery.lastSent, { wm })) {
        if (this.closed) return;
        this.p.metrics.catchupEntries.inc({ source: page.source }, page.entries.length);
        await this.emit(this.shard, page.entries, true);
      }
    }
    await this.releaseHeld();
    if (this.closed) return;
    this.send({ t: "SYNCED", seq: this.delivery.lastSent });
    this.state = { type: "live" };
  }

  private async releaseHeld(): Promise<void> {
    while (!this.closed) {
      const next = this.delivery.nextHeld();
      if (next === undefined) return;
      if (next === "overflow") {
        // Too many pushes arrived while syncing: read the mailbox again instead of keeping them.
        await this.readAfterKnown();
        continue;
      }
      await this.deliver(next);
    }
  }

  private async readAfterKnown(until?: bigint): Promise<void> {
    for await (const page of this.p.mailbox.read(this.shard, this.user, this.delivery.lastKnown, until === undefined ? {} : { until })) {
      await this.emit(this.shard, page.entries, true);
    }
  }

  /** The registry changed this session's shard (epoch bump, split): rebase mid-session. */
  onShardChange(): void {
    if (this.state.type !== "live" && this.state.type !== "syncing") return;
    this.enqueue(async () => {
      const reg = this.p.registry.state;
      const cur = reg.shards.get(this.shard);
      const userShard = this.p.registry.shards.shardOf(this.user);
      if (cur === undefined || userShard === undefined) return;
      if (cur.epoch === this.epoch && cur.log === this.log && userShard === this.shard) return;
      const position: CursorIn = { shard: this.shard, epoch: this.epoch, log: this.log, seq: this.delivery.lastSent, sigValid: true };
      const g = await gatherAndDecide(this.p.registry, this.p.mailbox, this.user, position, { closed: () => this.closed });
      this.p.metrics.midSessionRebases.inc({ case: g.decision.case });
      if (g.decision.case === "invalid") {
        // The session's own position does not fit the registry (never expected): the device
        // reconnects with its cursor and gets a full AUTH answer.
        this.p.log.warn({ session: this.id, user: this.user, reason: g.decision.reason }, "mid-session rebase: position refused");
        throw new UnavailableError(`cursor rebase failed: ${g.decision.reason}`, 1000);
      }
      await this.answerAndDeliver(g, { kind: "rebase" });
    });
  }

  // ---- live ------------------------------------------------------------------------------------

  /**
   * Live pushes for this user (already checked against the registry's epoch by the hub), in order.
   * The common case (live, nothing on the chain, each push following the one before) goes out at
   * once as one MSGS frame, with no promise; a gap or a busy chain goes through the chain.
   */
  onPushes(pushes: readonly Push[]): void {
    if (this.closed || this.state.type === "awaiting_auth" || this.state.type === "authenticating") return;
    let i = 0;
    if (this.state.type === "live" && this.chainIdle) {
      let known = this.delivery.lastKnown;
      while (i < pushes.length) {
        const p = pushes[i]!;
        if (p.shard !== this.shard || p.epoch > this.epoch || p.entry.seq <= known || p.prevAll === null || p.prevAll > known) break;
        known = p.entry.seq;
        i++;
      }
      if (i > 0) this.emitLive(i === pushes.length ? pushes : pushes.slice(0, i));
    }
    for (; i < pushes.length; i++) {
      const push = pushes[i]!;
      if (push.shard !== this.shard) continue;
      // held pushes go out when the catch-up ends, before anything queued on the chain; one of a
      // newer epoch waits on the chain behind the rebase that the registry change queued, or the
      // device would get its seq under a token of the older epoch (a CURSOR_INVALID at its next AUTH)
      if (this.state.type === "syncing" && push.epoch <= this.epoch) this.delivery.hold(push);
      else {
        const at = performance.now();
        this.enqueue(() => this.deliver(push, at));
      }
    }
  }

  /** The next pushes of a live, idle session: one MSGS frame, the same bytes for every session of the user that sends them all. */
  private emitLive(pushes: readonly Push[]): void {
    const entries = pushes.length === 1 ? [pushes[0]!.entry] : pushes.map((p) => p.entry);
    const out = this.select(entries);
    if (out.length === 0) return;
    const bytes = out.length === entries.length ? sharedFrame(pushes, this.shard) : encodeMsgsFrame(this.shard, out.map(encodedOnce));
    this.sendBytes(bytes, "MSGS");
  }

  /** A push through the chain; `at`: when it was received, for the gateway_chain stage. */
  private async deliver(push: Push, at?: number): Promise<void> {
    const kind = this.delivery.classify(push);
    if (kind === "duplicate") {
      this.p.metrics.duplicatesDropped.inc();
      return;
    }
    if (kind === "gap") {
      // A lost push (or one whose predecessor the worker could not know): fill from the mailbox first.
      this.p.metrics.gapFills.inc();
      const got = await this.p.mailbox.fill(this.shard, this.user, this.delivery.lastKnown, push.entry.seq);
      if (got === "too_many") await this.readAfterKnown(push.entry.seq - 1n);
      else await this.emit(this.shard, got, false);
    }
    await this.emit(this.shard, [push.entry], false);
    if (at !== undefined) this.p.metrics.stages.observe("gateway_chain", (performance.now() - at) / 1000);
  }

  // ---- tail and route repairs ------------------------------------------------------------------

  /**
   * Anti-entropy for live sessions: a push lost with no later entry of the user (a NATS node dying
   * with it in flight) would otherwise wait for the device's next reconnect. Every
   * JETGATE_TAIL_CHECK_S the hub reads the heads of its sessions' users (the Redis watermark, which
   * the worker raises before it pushes, so a lost push shows there) in one round trip, and compares
   * each with `tailPosition`: undefined while the session is not live or has work in its chain.
   */
  tailPosition(): MailboxSeq | undefined {
    return this.state.type === "live" && this.chainIdle ? this.delivery.lastKnown : undefined;
  }

  /**
   * The hub saw the user's head past `tailPosition`, or Redis had no head for the user (its hash
   * vanished, with it the proof that nothing is missing): the rest is read and sent through the
   * chain. An unknown head asks the stream once per position: only the worker re-creates the hash,
   * and it does so with the next entry it processes, whose push then shows any gap.
   */
  fillTail(head: MailboxSeq | undefined): void {
    if (this.tailPosition() === undefined) return;
    if (head === undefined) {
      if (this.tailAskedAt === this.delivery.lastKnown) return;
      this.tailAskedAt = this.delivery.lastKnown;
    }
    this.enqueue(() => this.readToHead());
  }

  /**
   * The user's route was registered again (gateway/hub/routes.ts) with `head` then: entries up to it
   * may not have been routed here. Whatever the session is doing, it reads them after its current
   * step (a session still syncing reads them in its catch-up; this finds nothing more).
   */
  catchUpTo(head: MailboxSeq | undefined): void {
    if (this.closed || (head !== undefined && head <= this.delivery.lastKnown)) return;
    this.enqueue(() => this.readToHead());
  }

  private async readToHead(): Promise<void> {
    if (this.state.type !== "live") return;
    const wm = await this.p.mailbox.watermarks(this.shard, this.user);
    // a push may have delivered it meanwhile
    if (wm.head <= this.delivery.lastKnown || this.closed) return;
    this.p.metrics.tailFills.inc();
    for await (const page of this.p.mailbox.read(this.shard, this.user, this.delivery.lastKnown, { wm })) {
      await this.emit(this.shard, page.entries, true);
    }
  }
}
