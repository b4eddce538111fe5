/**
 * What a session needs from the rest of the gateway, as narrow interfaces (ports). The gateway
 * wires them to NATS, Redis and uWS (main.ts); the session tests wire them to in-memory fakes
 * (test/harness/session-fakes.ts), so every AUTH case runs without a server.
 */
import type { Logger } from "pino";
import type { Clock, Config, Disconnect, Entry, MailboxSeq, Push, RegistryState } from "../protocol/index.js";
import type { CursorSigner } from "../protocol/io/index.js";
import type { ShardBounds } from "./mailbox/auth-decision.js";
import type { DeviceClaims } from "./jwt.js";
import type { GatewayMetrics } from "./metrics.js";

/** A write-only socket (centrifuge's Transport): the session never reads from it. */
export interface Transport {
  /** Queues bytes; false when the socket's buffer is building up. */
  send(bytes: Uint8Array): boolean;
  /** Bytes queued and not yet written to the socket. */
  buffered(): number;
  /** Closes with the Disconnect's code and reason (an ERROR frame, if any, was sent before). */
  close(d: Disconnect): void;
}

/**
 * The clock a session runs on (protocol/clock.ts's Clock): the time, and one timer for its deadlines
 * (gateway/session/clock.ts) that may fire up to a second early for a far delay (the gateway's
 * wheel: session/coarse-timers.ts), so callers check the time. Tests step a manual one.
 */
export type TimerPort = Clock;

export type Source = "cache" | "stream";

export interface Watermarks {
  /** Highest seq per lane; a lane Redis lost is missing (unknown), `head` is right regardless. */
  lanes: Map<string, MailboxSeq>;
  /** Highest seq over all lanes (0 when none). */
  head: MailboxSeq;
  /** Where the figures came from. */
  from: "redis" | "stream";
}

export interface ReadOptions {
  /** Only entries with seq at or below this. */
  until?: MailboxSeq;
  /** The user's watermarks, when the caller has them: the read reaches at least their head. */
  wm?: Watermarks;
  limit?: number;
}

/** The user's mailbox, wherever it is kept (MailboxReader: Redis first, then the shard stream). */
export interface MailboxSource {
  watermarks(shard: number, user: string): Promise<Watermarks>;
  /** Trim watermark and last offset of a shard's stream; `fresh` skips any cache. Throws ShardNotReadyError. */
  bounds(shard: number, opts?: { fresh?: boolean }): Promise<ShardBounds>;
  /** The user's entries of `shard` with seq above `after` (whole seqs), oldest first, in pages. */
  read(shard: number, user: string, after: MailboxSeq, opts?: ReadOptions): AsyncIterable<{ entries: Entry[]; source: Source }>;
  /** A few entries with seq in (after, before), for a live gap; "too_many" when a read is cheaper. */
  fill(shard: number, user: string, after: MailboxSeq, before: MailboxSeq): Promise<Entry[] | "too_many">;
}

/** The registry as this gateway follows it. */
export interface RegistryView {
  readonly state: RegistryState;
  readonly shards: { shardOf(user: string): number | undefined };
  /** Reads up to the registry's head; rejects when it cannot. */
  sync(): Promise<unknown>;
}

export interface PresencePort {
  claim(user: string, device: string, session: string, at: number): Promise<"claimed" | "superseded">;
  release(user: string, device: string, session: string, at: number): Promise<void>;
}

export interface IngressPort {
  /** Appends an upstream message once per (user, device, cmid). */
  publish(user: string, device: string, cmid: string, body: Uint8Array): Promise<{ duplicate: boolean }>;
}

export interface AckPort {
  /** Resolves to how many other devices' ACK state the per-user device bound evicted. */
  store(user: string, device: string, seq: MailboxSeq): Promise<number>;
}

export interface TokenPort {
  verify(token: string): Promise<DeviceClaims>;
}

/** Token revocations, as this gateway knows them (gateway/hub/revocations.ts). */
export interface RevocationPort {
  /** False until the list was read from Redis once: every AUTH is refused until then (fail closed). */
  ready(): boolean;
  /** Whether a token of `user` used by `device`, issued at `iat` (s; undefined: none), is revoked. */
  revoked(user: string, device: string, iat: number | undefined, now: number): boolean;
}

/** Who a session is, from its token: known once AUTH's token is verified. */
export interface Who {
  readonly user: string;
  readonly device: string;
  /** When the AUTH frame arrived (ms): of two sessions of one device, the later AUTH wins. */
  readonly authAt: number;
  /** `iat` of the session's token (the last REFRESH's, which sets it), whole seconds; undefined when it has none. */
  issuedAt: number | undefined;
}

/** What the hub (the gateway's set of sessions) knows of a session. */
export interface HubMember {
  readonly id: string;
  /** Undefined until AUTH's token was verified: such a session is only counted as a connection. */
  readonly who: Who | undefined;
  /** The shard its entries are numbered in, once a decision placed it; undefined before. */
  readonly shard: number | undefined;
  close(d: Disconnect): void;
  /** Live pushes of this user, in order (those of one batch together); `shared`: the same array goes to the user's other sessions here. */
  onPushes(pushes: readonly Push[], shared?: boolean): void;
  onShardChange(): void;
  /** What the session accounted for, while it is live and idle (the tail check); else undefined. */
  tailPosition(): MailboxSeq | undefined;
  /** The user's head is past `tailPosition` (undefined: Redis does not know it): read the rest and send it. */
  fillTail(head: MailboxSeq | undefined): void;
  /** The user's route was registered again with this head: read and send what the session lacks below it, whatever it is doing. */
  catchUpTo(head: MailboxSeq | undefined): void;
}

/** The registry as the hub follows it (NATS: protocol's RegistryClient). */
export interface RegistryFeed {
  readonly state: RegistryState;
  /** Calls `l` with each new state; returns the unsubscribe. */
  onChange(l: (s: RegistryState) => void): () => void;
}

/** Live pushes for this gateway, a batch at a time (NATS: gateway/hub/push-source.ts). */
export interface PushSource {
  /** `broadcast`: pushes every gateway got, because Redis had no routes for their users. */
  start(onPushes: (pushes: readonly Push[], broadcast: boolean) => void): void;
  stop(): void;
}

/** Where the workers send a user's pushes (gateway/hub/routes.ts). */
export interface RoutePort {
  /** A session of the user is about to read its mailbox: resolves once this gateway is in the user's routes (or that failed, and is retried). */
  acquire(user: string): Promise<void>;
  /** That session ended; the user's last one here takes the route out. */
  release(user: string): void;
  /** A push of the user reached every gateway (Redis had no routes for it): registers again if a session of it is here. */
  reassert(user: string): void;
  /** The tail check read the user's routes from Redis: registers again if a session of it is here and this gateway is not among them. */
  verify(user: string, routes: readonly string[]): void;
  /** A push of the user was routed here, and none of its sessions is. */
  stray(user: string): void;
}

/** The gateway's sessions: fan-out membership, replacement of a device's older session, per-user limits. */
export interface SessionHub {
  open(s: HubMember): void;
  countForUser(user: string): number;
  /** Joins the user's fan-out; closes an older session of the same device (or this one, if it is older). */
  add(s: HubMember): void;
  /** Tracks the session under its (possibly new) shard for registry changes. */
  watch(s: HubMember): void;
  remove(s: HubMember): void;
  /** One frame of this user's budget over all of the user's sessions here. */
  takeUserToken(user: string, now: number): boolean;
}

/** Everything a session talks to. */
export interface SessionPorts {
  config: Config;
  log: Logger;
  metrics: GatewayMetrics;
  tokens: TokenPort;
  revocations: RevocationPort;
  cursors: CursorSigner;
  registry: RegistryView;
  mailbox: MailboxSource;
  hub: SessionHub;
  routes: RoutePort;
  presence: PresencePort;
  acks: AckPort;
  ingress: IngressPort;
  /** Absent: the system's clock, Node timers for near deadlines and one wheel for far ones (session/coarse-timers.ts). */
  timers?: TimerPort;
}
