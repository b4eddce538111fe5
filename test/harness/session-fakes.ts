/**
 * In-memory ports for Session tests: a mailbox of shard logs numbered by a registry the test
 * controls, the gateway's real hub (SessionRegistry) fed by an in-memory push source, a transport
 * that records every frame, and timers a test can drive by hand. No NATS, no Redis: the
 * integration tests cover those.
 */
import { pino } from "pino";
import { type Disconnect, type TimerHandle, ShardMap, applyRecord, decodeServerFrame, deriveSeq, type Config, type Entry, type MailboxSeq, type Push, type RegistryState, type ServerFrame, type ShardState } from "../../protocol/index.js";
import { loadConfig, cursorSigner } from "../../protocol/io/index.js";
import type { ShardBounds } from "../../gateway/mailbox/auth-decision.js";
import { ShardNotReadyError } from "../../gateway/mailbox/gather.js";
import { GatewayMetrics } from "../../gateway/metrics.js";
import type { MailboxSource, PushSource, ReadOptions, RegistryFeed, RegistryView, RoutePort, SessionPorts, Source, TimerPort, Transport, Watermarks } from "../../gateway/ports.js";
import { Revocations } from "../../gateway/hub/revocations.js";
import { ManualClock } from "./manual-clock.js";
import { Session } from "../../gateway/session/session.js";
import { SessionRegistry } from "../../gateway/hub/sessions.js";

interface Stored {
  offset: number;
  user: string;
  lane: string;
  id: string;
}

/** The registry as a session sees it; `apply` writes a record and tells the hub. */
export class FakeRegistry implements RegistryView, RegistryFeed {
  state: RegistryState;
  shards: ShardMap;
  syncs = 0;
  syncFails = false;
  private readonly listeners: ((s: RegistryState) => void)[] = [];

  constructor(shards: ShardState[]) {
    this.state = applyRecord({ seq: 0, shards: new Map() }, 1, { v: 1, op: "init", at: 0, by: "test", shards });
    this.shards = new ShardMap(this.state);
  }

  apply(shards: ShardState[], op: "takeover" | "split" | "rebuild" = "takeover"): void {
    this.state = applyRecord(this.state, this.state.seq + 1, { v: 1, op, at: 0, by: "test", shards });
    this.shards = new ShardMap(this.state);
    for (const l of this.listeners) l(this.state);
  }

  onChange(l: (s: RegistryState) => void): () => void {
    this.listeners.push(l);
    return () => this.listeners.splice(this.listeners.indexOf(l), 1);
  }

  async sync(): Promise<void> {
    this.syncs++;
    if (this.syncFails) throw new Error("registry unavailable");
  }
}

/** Shard logs held in memory; seqs are derived from the registry when read, as the reader does. */
export class FakeMailbox implements MailboxSource {
  private readonly logs = new Map<number, Stored[]>();
  /** Offsets at or below these were removed by retention. */
  readonly trimmed = new Map<number, number>();
  /** Shards whose stream does not answer yet (ShardNotReadyError), and how many more calls fail. */
  readonly notReady = new Map<number, number>();
  /** Stream reads served, for tests that count them. */
  reads: { shard: number; after: MailboxSeq }[] = [];
  /** Each entry's body size as read (1 byte unless a test needs frames of some size). */
  bodyBytes = 1;
  private next = 0;

  constructor(private readonly registry: FakeRegistry) {}

  private state(shard: number): ShardState {
    const s = this.registry.state.shards.get(shard);
    if (s === undefined) throw new Error(`shard ${shard} unknown`);
    return s;
  }

  private check(shard: number): void {
    const left = this.notReady.get(shard) ?? 0;
    if (left > 0) {
      this.notReady.set(shard, left - 1);
      throw new ShardNotReadyError(shard);
    }
  }

  /** Appends one entry of `user` to shard `shard`'s current log; returns it as it will be read. */
  append(shard: number, user: string, lane = "default"): Entry {
    const log = this.logs.get(shard) ?? [];
    this.logs.set(shard, log);
    const offset = (log.at(-1)?.offset ?? 0) + 1;
    const stored = { offset, user, lane, id: `m${++this.next}` };
    log.push(stored);
    return this.toEntry(shard, stored, null);
  }

  /** Appends and returns the live push the owning worker would publish (`pa` from the user's previous entry). */
  appendPush(shard: number, user: string, lane = "default"): Push {
    const log = this.logs.get(shard) ?? [];
    const before = log.findLast((x) => x.user === user);
    const entry = this.append(shard, user, lane);
    const s = this.state(shard);
    return { user, shard, epoch: s.epoch, entry, prevAll: before === undefined ? 0n : deriveSeq(s, s.log, before.offset)! };
  }

  lastOffset(shard: number): number {
    return this.logs.get(shard)?.at(-1)?.offset ?? 0;
  }

  private toEntry(shard: number, x: Stored, prev: MailboxSeq | null): Entry {
    const s = this.state(shard);
    return { seq: deriveSeq(s, s.log, x.offset)!, id: x.id, lane: x.lane, prev, ts: 1_700_000_000_000, b: new Uint8Array(this.bodyBytes).fill(1) };
  }

  userEntries(shard: number, user: string): Entry[] {
    const trim = this.trimmed.get(shard) ?? 0;
    return (this.logs.get(shard) ?? []).filter((x) => x.user === user && x.offset > trim).map((x) => this.toEntry(shard, x, null));
  }

  /** Calls of `watermarks`, for tests that count them. */
  watermarkCalls = 0;

  async watermarks(shard: number, user: string): Promise<Watermarks> {
    this.watermarkCalls++;
    this.check(shard);
    const lanes = new Map<string, MailboxSeq>();
    let head = 0n;
    for (const e of this.userEntries(shard, user)) {
      lanes.set(e.lane, e.seq);
      if (e.seq > head) head = e.seq;
    }
    return { lanes, head, from: "redis" };
  }

  async bounds(shard: number): Promise<ShardBounds> {
    this.check(shard);
    const s = this.state(shard);
    const t = this.trimmed.get(shard) ?? 0;
    return { trim: t === 0 ? 0n : deriveSeq(s, s.log, t)!, lastOffset: this.lastOffset(shard) };
  }

  async *read(shard: number, user: string, after: MailboxSeq, opts: ReadOptions = {}): AsyncIterable<{ entries: Entry[]; source: Source }> {
    this.check(shard);
    this.reads.push({ shard, after });
    let got = this.userEntries(shard, user).filter((e) => e.seq > after && (opts.until === undefined || e.seq <= opts.until));
    if (opts.limit !== undefined) got = got.slice(0, opts.limit);
    let prev = after;
    for (const e of got) {
      e.prev = prev;
      prev = e.seq;
    }
    for (let i = 0; i < got.length; i += 3) yield { entries: got.slice(i, i + 3), source: "stream" };
  }

  /** Errors the next fills throw (a NATS request that timed out, say). */
  readonly fillErrors: Error[] = [];
  /** Fills asked for. */
  fills = 0;

  async fill(shard: number, user: string, after: MailboxSeq, before: MailboxSeq): Promise<Entry[] | "too_many"> {
    this.fills++;
    this.check(shard);
    const err = this.fillErrors.shift();
    if (err !== undefined) throw err;
    const got = this.userEntries(shard, user).filter((e) => e.seq > after && e.seq < before);
    return got.length > 32 ? "too_many" : got;
  }
}

/** Routes in memory: what sessions acquired and released, and what the hub asked. */
export class FakeRoutes implements RoutePort {
  readonly held = new Map<string, number>();
  readonly asked: string[] = [];
  async acquire(user: string): Promise<void> {
    this.held.set(user, (this.held.get(user) ?? 0) + 1);
  }
  release(user: string): void {
    const n = (this.held.get(user) ?? 0) - 1;
    if (n > 0) this.held.set(user, n);
    else this.held.delete(user);
  }
  reassert(user: string): void {
    this.asked.push(`reassert ${user}`);
  }
  verify(user: string, routes: readonly string[]): void {
    this.asked.push(`verify ${user} ${routes.join(",")}`);
  }
  stray(user: string): void {
    this.asked.push(`stray ${user}`);
  }
}

/** A push source the test feeds by hand. */
export class MemoryPushSource implements PushSource {
  private handler: ((pushes: readonly Push[], broadcast: boolean) => void) | undefined;
  start(onPushes: (pushes: readonly Push[], broadcast: boolean) => void): void {
    this.handler = onPushes;
  }
  stop(): void {
    this.handler = undefined;
  }
  deliver(pushes: readonly Push[], broadcast = false): void {
    this.handler?.(pushes, broadcast);
  }
}

/** Timers a test moves by hand: `advance` runs what falls due, in order, at its own time. */
/**
 * The sessions' clock in tests: a ManualClock (test/harness/manual-clock.ts) that starts at the
 * wall clock's now (tokens carry wall times), records every delay asked for, and moves to a time.
 */
export class ManualTimers extends ManualClock {
  /** Every delay asked for, in order. */
  readonly delays: number[] = [];

  constructor(nowMs = Date.now()) {
    super(nowMs);
  }

  override setTimeout<A = undefined>(fn: (arg: A) => void, ms: number, ...arg: undefined extends A ? [arg?: A] : [arg: A]): TimerHandle {
    this.delays.push(ms);
    return super.setTimeout(fn, ms, ...arg);
  }

  /** Timers armed and not yet run. */
  get armed(): number {
    return this.pending;
  }

  /** Moves the clock to `at` (ms since the epoch). */
  advanceTo(at: number): void {
    this.advance(Math.max(0, at - this.now()));
  }
}

/** One turn of the event loop: what a session's promises and the fakes' answers need to move on. */
export const nextTurn = () => new Promise<void>((r) => setImmediate(r));

/** A socket that records what the session sends; `buffered` can be set to act as a slow device. */
export class RecordingTransport implements Transport {
  readonly frames: ServerFrame[] = [];
  closed: { code: number; reason: string } | undefined;
  bufferedBytes = 0;
  /** `until`s waiting for the next frame or the close: woken the moment it comes, not a turn later. */
  private waiters: (() => void)[] = [];

  send(bytes: Uint8Array): boolean {
    this.frames.push(decodeServerFrame(bytes));
    for (const w of this.waiters.splice(0)) w();
    return true;
  }
  buffered(): number {
    return this.bufferedBytes;
  }
  close(d: Disconnect): void {
    this.closed = { code: d.close, reason: d.reason };
    for (const w of this.waiters.splice(0)) w();
  }

  /**
   * Lets the session work until `pred` holds over the frames so far, for at most `turns` turns of
   * the event loop: the fakes answer in promises and turns, so nothing here waits on the wall clock.
   */
  async until(pred: (frames: ServerFrame[]) => boolean, what: string, turns = 2000): Promise<void> {
    for (let i = 0; !pred(this.frames); i++) {
      if (i >= turns) throw new Error(`still waiting for ${what} after ${turns} turns; frames: ${this.frames.map((f) => f.t + ("code" in f ? `:${f.code}` : "")).join(", ")}${this.closed ? `; closed ${this.closed.code}` : ""}`);
      await new Promise<void>((r) => {
        this.waiters.push(r);
        setImmediate(r);
      });
    }
  }

  of<T extends ServerFrame["t"]>(t: T): Extract<ServerFrame, { t: T }>[] {
    return this.frames.filter((f): f is Extract<ServerFrame, { t: T }> => f.t === t);
  }

  /** Seqs of every entry in MSGS frames that are not PULL replies, in order. */
  liveSeqs(): MailboxSeq[] {
    return this.of("MSGS").filter((f) => f.id === undefined).flatMap((f) => f.e.map((e) => e.seq));
  }
}

export const CURSOR_KEY = new Uint8Array(32).fill(7);

export interface SessionRig {
  registry: FakeRegistry;
  mailbox: FakeMailbox;
  /** The gateway's hub, as main.ts builds it, over in-memory ports. */
  hub: SessionRegistry<Session>;
  /** Delivers pushes to the hub as one batch from the push source (stale ones are dropped by the hub's rule). */
  push(...pushes: Push[]): void;
  routes: FakeRoutes;
  ports: SessionPorts;
  acks: { user: string; device: string; seq: MailboxSeq }[];
  sent: { user: string; cmid: string }[];
  /** The revocations the sessions check (loaded: empty), and the `iat` of the tokens the fake verifier accepts. */
  revocations: Revocations;
  issued: { at: number | undefined };
  /** Tokens (any text) the fake verifier accepts for `user`, expiring at `expiresAt`, once `until` resolves (a slow check the test releases). */
  tokenPlan: Map<string, { user: string; until?: Promise<void>; expiresAt: number }>;
  /** A new session on a recording transport. */
  connect(id?: string): { session: Session; t: RecordingTransport };
}

/**
 * Ports over in-memory fakes; tokens are "<user>" (any other shape, e.g. "bad", is refused). The
 * sessions' clock is `timers`, a manual one unless given: time moves only when a test moves it.
 */
export function sessionRig(shards: ShardState[], env: Record<string, string> = {}, timers: TimerPort = new ManualTimers()): SessionRig {
  const clock = timers;
  const registry = new FakeRegistry(shards);
  const mailbox = new FakeMailbox(registry);
  const routes = new FakeRoutes();
  const source = new MemoryPushSource();
  const acks: SessionRig["acks"] = [];
  const sent: SessionRig["sent"] = [];
  const config: Config = loadConfig({ JETGATE_ENV: "development", JETGATE_AUTH_TIMEOUT_MS: "2000", ...env });
  // tokens the fake verifier accepts carry this iat (a test moves it to issue "newer" tokens)
  const issued: { at: number | undefined } = { at: Math.floor(Date.now() / 1000) };
  const revocations = new Revocations();
  revocations.loaded = true;
  const tokenPlan: SessionRig["tokenPlan"] = new Map();
  const metrics = new GatewayMetrics();
  const hub = new SessionRegistry<Session>(source, routes, registry, metrics, config.JETGATE_RATE_USER_FRAMES_PER_S, { warn: () => undefined });
  const ports: SessionPorts = {
    config,
    log: pino({ level: "silent" }),
    metrics,
    tokens: {
      verify: async (token) => {
        const planned = tokenPlan.get(token);
        if (planned !== undefined) {
          await planned.until;
          return { user: planned.user, device: undefined, expiresAt: planned.expiresAt, issuedAt: issued.at };
        }
        if (!/^[a-z0-9]+$/.test(token)) throw new Error("token refused");
        return { user: token, device: undefined, expiresAt: clock.now() + 3_600_000, issuedAt: issued.at };
      },
    },
    revocations: { ready: () => revocations.loaded, revoked: (u, d, iat, now) => revocations.revoked(u, d, iat, now) },
    cursors: cursorSigner([CURSOR_KEY]),
    registry,
    mailbox,
    hub,
    routes,
    presence: { claim: async () => "claimed", release: async () => undefined },
    acks: { store: async (user, device, seq) => (acks.push({ user, device, seq }), 0) },
    ingress: {
      publish: async (user, _device, cmid) => {
        const dup = sent.some((x) => x.user === user && x.cmid === cmid);
        sent.push({ user, cmid });
        return { duplicate: dup };
      },
    },
    timers: clock,
  };
  let n = 0;
  return {
    registry, mailbox, hub, routes, ports, acks, sent, revocations, issued, tokenPlan,
    push: (...pushes) => source.deliver(pushes),
    connect(id = `s${++n}`) {
      const t = new RecordingTransport();
      const session = new Session(id, t, ports);
      hub.open(session);
      return { session, t };
    },
  };
}
