/**
 * What the mailbox reader (gateway/mailbox/source.ts) needs of Redis and of the shard streams, as two
 * narrow interfaces. The gateway wires them to Redis (gateway/mailbox/redis.ts) and NATS JetStream
 * (gateway/mailbox/nats.ts); test/unit/mailbox-reader.test.ts wires them to in-memory fakes, so every
 * decision of a read runs without a server.
 */
import type { CacheRow, MailboxSeq } from "../../protocol/index.js";

/** The user's soft state in Redis (only the worker writes it): any key may be missing. */
export interface MailboxCache {
  /** The whole watermark hash of the user (empty when it is gone). */
  watermarkHash(user: string): Promise<Record<string, string>>;
  /**
   * The user's head (`_all`, raw; undefined when missing) and the hot cache's rows with seq in
   * (after, until] (`until` undefined: to the end), at most `count`, oldest first, in one round
   * trip with the head read before the rows. A row Redis holds but that does not parse is undefined.
   */
  headAndRows(user: string, after: MailboxSeq, until: MailboxSeq | undefined, count: number): Promise<{ head: unknown; rows: (CacheRow | undefined)[] }>;
  /** `_all` and the routes field of each user (raw; null for a user whose read failed). */
  headsAndRoutes(users: readonly string[]): Promise<([unknown, unknown] | null)[]>;
}

/** One message of a shard stream: its offset (stream sequence), subject and stored bytes. */
export interface StreamMsg {
  offset: number;
  subject: string;
  data: Uint8Array;
}

export interface StreamState {
  firstOffset: number;
  lastOffset: number;
  /** The log its description names; undefined when it names none. */
  log: string | undefined;
}

/** An open read of one user's subjects in a shard stream, from a start offset on. */
export interface StreamCursor {
  /** The user's messages ahead of the read when it was opened. */
  readonly pending: number;
  /** Up to `max` next messages, in order, each with how many remain after it (`left`). */
  fetch(max: number): AsyncIterable<StreamMsg & { left: number }>;
  /** Frees what the read holds in the server; never throws. */
  close(): Promise<void>;
}

/**
 * The shard streams. Every call answers from the stream's leader. Failures come as the session
 * should see them: ShardNotReadyError for a stream the registry names that is not there,
 * UnavailableError for a JetStream that did not answer.
 */
export interface MailboxStream {
  state(shard: number): Promise<StreamState>;
  /** The user's newest message in `lane`, or null. */
  last(shard: number, user: string, lane: string): Promise<StreamMsg | null>;
  /** The first message of the user at or after `offset`, or null. */
  next(shard: number, user: string, offset: number): Promise<StreamMsg | null>;
  /** Opens a read of the user's messages from `offset` on. */
  open(shard: number, user: string, offset: number): Promise<StreamCursor>;
}
