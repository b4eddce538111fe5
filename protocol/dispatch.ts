/**
 * Dispatch: append one entry per recipient to the recipient's shard stream.
 *
 * Publishes are core NATS publishes with a reply subject on one shared ack inbox, acks matched by a
 * token in the reply subject (DESIGN section 9: about 5x the throughput of `js.publish()`).
 *
 * Ordering guarantee: entries one Dispatcher sends to one user land in that user's mailbox in the
 * order `dispatch` was called, even when a publish times out and is retried. Each user has a chain:
 * the next entry for a user is published only after the previous one is acknowledged (or has
 * failed for good). Different users are pipelined, up to `maxInFlight` publishes at once. A retry
 * reuses the Nats-Msg-Id, so JetStream drops the copy inside its duplicate window and the worker's
 * dedup catches one outside it.
 */
import { z } from "zod";
import { createInbox, headers, type Msg, type NatsConnection, type Subscription } from "@nats-io/transport-node";
import { JetgateError } from "./errors.js";
import { MAX_BODY_BYTES } from "./frames.js";
import { idSchema } from "./ids.js";
import { encodeStoredEntry } from "./entry.js";
import { entryMsgId, entrySubject } from "./subjects.js";
import type { ShardMap } from "./registry-model.js";

export const MAX_RECIPIENTS = 10_000;

export const DispatchRequestSchema = z.strictObject({
  dispatch_id: idSchema("dispatch"),
  message_id: idSchema("message"),
  lane: idSchema("lane"),
  recipients: z
    .array(idSchema("user"))
    .min(1, "must name at least one recipient")
    .max(MAX_RECIPIENTS, `must name at most ${MAX_RECIPIENTS} recipients`)
    .refine((r) => new Set(r).size === r.length, "recipients must be unique"),
  body: z.instanceof(Uint8Array, { message: "must be bytes" }),
});
export type DispatchRequest = z.input<typeof DispatchRequestSchema>;

/** Bad input: nothing of this dispatch was published. `field` names what was wrong. */
export class DispatchValidationError extends JetgateError {
  readonly field: string;
  constructor(field: string, message: string) {
    super("DISPATCH_INVALID", `${field}: ${message}`);
    this.field = field;
  }
}

export type DispatchResult =
  | { user: string; shard: number; seq: number; duplicate: boolean }
  | { user: string; shard: number; error: { code: "DISPATCH_TIMEOUT" | "DISPATCH_REJECTED"; message: string } };

export interface DispatcherOptions {
  /** Lanes a dispatch may name. */
  lanes: readonly string[];
  maxBodyBytes?: number;
  /** How long to wait for one publish's ack before retrying it. */
  ackTimeoutMs?: number;
  /** Publish attempts per entry before its result is an error. */
  attempts?: number;
  /** Publishes awaiting an ack at once, over all users. */
  maxInFlight?: number;
}

interface Pending {
  resolve: (ack: { seq: number; duplicate: boolean }) => void;
  reject: (err: Error) => void;
}

class AckError extends Error {
  override readonly name = "AckError";
  constructor(
    message: string,
    readonly retryable: boolean,
  ) {
    super(message);
  }
}

/** Counters of a Dispatcher's life, for metrics. */
export interface DispatchStats {
  /** Entries appended (acknowledged, duplicates included). */
  appended: number;
  /** Publish attempts after the first, over all entries. */
  retries: number;
  /** Entries whose result was an error. */
  failed: number;
}

export class Dispatcher {
  readonly stats: DispatchStats = { appended: 0, retries: 0, failed: 0 };
  private readonly prefix = createInbox("_INBOX_JG");
  private readonly sub: Subscription;
  private readonly pending = new Map<string, Pending>();
  private readonly chains = new Map<string, Promise<unknown>>();
  private readonly lanes: Set<string>;
  private readonly maxBody: number;
  private readonly ackTimeoutMs: number;
  private readonly attempts: number;
  private readonly maxInFlight: number;
  private inFlight = 0;
  private readonly slotWaiters: (() => void)[] = [];
  private nextToken = 0;

  constructor(
    private readonly nc: NatsConnection,
    private readonly shards: () => ShardMap,
    opts: DispatcherOptions,
  ) {
    this.lanes = new Set(opts.lanes);
    this.maxBody = Math.min(opts.maxBodyBytes ?? MAX_BODY_BYTES, MAX_BODY_BYTES);
    this.ackTimeoutMs = opts.ackTimeoutMs ?? 2000;
    this.attempts = opts.attempts ?? 5;
    this.maxInFlight = opts.maxInFlight ?? 10_000;
    this.sub = nc.subscribe(`${this.prefix}.*`, { callback: (err, msg) => (err ? undefined : this.onAck(msg)) });
  }

  /** Validates the whole request first; throws DispatchValidationError without publishing anything. */
  validate(req: DispatchRequest): z.output<typeof DispatchRequestSchema> & { shards: number[] } {
    const parsed = DispatchRequestSchema.safeParse(req);
    if (!parsed.success) {
      const issue = parsed.error.issues[0]!;
      throw new DispatchValidationError(issue.path.join(".") || "request", issue.message);
    }
    const r = parsed.data;
    if (!this.lanes.has(r.lane)) {
      throw new DispatchValidationError("lane", `unknown lane ${JSON.stringify(r.lane)}; configured lanes: ${[...this.lanes].join(", ")}`);
    }
    if (r.body.byteLength > this.maxBody) {
      throw new DispatchValidationError("body", `${r.body.byteLength} bytes exceeds the limit of ${this.maxBody}`);
    }
    const map = this.shards();
    const shards = r.recipients.map((u, i) => {
      const s = map.shardOf(u);
      if (s === undefined) throw new DispatchValidationError(`recipients.${i}`, "no shard owns this user: is the registry initialised?");
      return s;
    });
    return { ...r, shards };
  }

  /** Appends the entry for every recipient; one result per recipient, in request order. */
  async dispatch(req: DispatchRequest): Promise<DispatchResult[]> {
    const r = this.validate(req);
    const data = encodeStoredEntry({ id: r.message_id, d: r.dispatch_id, ts: Date.now(), b: r.body });
    return Promise.all(
      r.recipients.map((user, i) => this.enqueue(user, () => this.publishEntry(user, r.shards[i]!, r.lane, r.dispatch_id, data))),
    );
  }

  /** Runs `task` after every earlier task of this user has settled. */
  private enqueue<T>(user: string, task: () => Promise<T>): Promise<T> {
    const before = this.chains.get(user) ?? Promise.resolve();
    const run = before.then(task, task);
    const tail = run.then(
      () => undefined,
      () => undefined,
    );
    this.chains.set(user, tail);
    void tail.then(() => {
      if (this.chains.get(user) === tail) this.chains.delete(user);
    });
    return run;
  }

  private async publishEntry(user: string, shard: number, lane: string, dispatchId: string, data: Uint8Array): Promise<DispatchResult> {
    const subject = entrySubject(shard, user, lane);
    const h = headers();
    h.set("Nats-Msg-Id", entryMsgId(dispatchId, user));
    await this.acquireSlot();
    try {
      let last = "";
      for (let attempt = 1; attempt <= this.attempts; attempt++) {
        if (attempt > 1) this.stats.retries++;
        try {
          const ack = await this.publishOnce(subject, data, h);
          this.stats.appended++;
          return { user, shard, seq: ack.seq, duplicate: ack.duplicate };
        } catch (err) {
          if (err instanceof AckError && !err.retryable) {
            this.stats.failed++;
            return { user, shard, error: { code: "DISPATCH_REJECTED", message: err.message } };
          }
          last = err instanceof Error ? err.message : String(err);
          if (attempt < this.attempts) await new Promise((r) => setTimeout(r, Math.min(50 * 2 ** attempt, 1000)));
        }
      }
      this.stats.failed++;
      return { user, shard, error: { code: "DISPATCH_TIMEOUT", message: `no ack after ${this.attempts} attempts: ${last}` } };
    } finally {
      this.releaseSlot();
    }
  }

  private publishOnce(subject: string, data: Uint8Array, h: ReturnType<typeof headers>): Promise<{ seq: number; duplicate: boolean }> {
    const token = (this.nextToken++).toString(36);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(token);
        reject(new AckError(`ack timeout after ${this.ackTimeoutMs} ms`, true));
      }, this.ackTimeoutMs);
      this.pending.set(token, {
        resolve: (a) => {
          clearTimeout(timer);
          resolve(a);
        },
        reject: (e) => {
          clearTimeout(timer);
          reject(e);
        },
      });
      try {
        this.nc.publish(subject, data, { reply: `${this.prefix}.${token}`, headers: h });
      } catch (err) {
        this.pending.delete(token);
        clearTimeout(timer);
        reject(err instanceof Error ? err : new Error(String(err)));
      }
    });
  }

  private onAck(msg: Msg): void {
    const token = msg.subject.slice(this.prefix.length + 1);
    const p = this.pending.get(token);
    if (!p) return; // a late ack of an attempt that already timed out
    this.pending.delete(token);
    if (msg.headers?.hasError) {
      // 503: no stream is listening on the subject (yet): worth a retry.
      p.reject(new AckError(`${msg.headers.code} ${msg.headers.description}`, msg.headers.code === 503));
      return;
    }
    let body: { seq?: unknown; duplicate?: unknown; error?: { code?: number; description?: string } };
    try {
      body = msg.json();
    } catch {
      p.reject(new AckError("unreadable ack", true));
      return;
    }
    if (body.error) {
      const code = body.error.code ?? 0;
      p.reject(new AckError(`${code} ${body.error.description ?? ""}`.trim(), code === 503 || code >= 500));
      return;
    }
    if (typeof body.seq !== "number") {
      p.reject(new AckError("ack without seq", true));
      return;
    }
    p.resolve({ seq: body.seq, duplicate: body.duplicate === true });
  }

  private acquireSlot(): Promise<void> {
    if (this.inFlight < this.maxInFlight) {
      this.inFlight++;
      return Promise.resolve();
    }
    return new Promise((resolve) => this.slotWaiters.push(resolve));
  }

  private releaseSlot(): void {
    const next = this.slotWaiters.shift();
    if (next) next();
    else this.inFlight--;
  }

  /** Stops listening for acks; publishes still pending fail by timeout. */
  close(): void {
    this.sub.unsubscribe();
  }
}
