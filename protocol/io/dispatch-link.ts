/**
 * What the Dispatcher needs of NATS (DispatchLink), and the link over a NATS connection: core
 * publishes with the JetStream headers (Nats-Msg-Id for dedup, Nats-Batch-* for atomic batches),
 * answers on one shared ack inbox matched by a token in the reply subject (about 5x the throughput
 * of `js.publish()`), and the connection's status.
 */
import { createInbox, headers, type Msg, type NatsConnection, type Subscription } from "@nats-io/transport-node";
import { jetstreamManager, type JetStreamManager } from "@nats-io/jetstream";
import type { AckAnswer } from "../dispatch-ack.js";
import { shardStream } from "../subjects.js";

/** One entry of an atomic batch: its place (from 1), and on the last one the commit's answer token. */
export interface BatchPlace {
  id: string;
  index: number;
  commit?: string;
}

export interface DispatchLink {
  /** A name unique to this link (batch ids are `<name>.<n>`: nats-server takes up to 64 characters). */
  readonly name: string;
  /** Hands every answer to `onAnswer` with the token its publish named. */
  listen(onAnswer: (token: string, answer: AckAnswer) => void): void;
  /** Appends one entry, deduplicated by `msgId`; answered under `token`. Throws when the client refuses it. */
  publish(subject: string, data: Uint8Array, msgId: string, token: string): void;
  /** Stages one entry of an atomic batch; the commit (the last) is answered for all. Throws when the client refuses it. */
  publishInBatch(subject: string, data: Uint8Array, msgId: string, batch: BatchPlace): void;
  /**
   * Resolves once nats-server has read everything published before the call (a PING answered: it
   * reads a connection in order); rejects when the connection is lost first (what was published on
   * it is gone then).
   */
  flush(): Promise<void>;
  /** The bytes of the entry at `offset` of the shard's stream, from the stream's leader; undefined when there is none. */
  stored(shard: number, offset: number, timeoutMs: number): Promise<Uint8Array | undefined>;
  /** Why NATS cannot be reached now (lost and reconnecting, or closed); undefined while connected. */
  unavailable(): string | undefined;
  /** Stops listening for answers. */
  close(): void;
}

export class NatsDispatchLink implements DispatchLink {
  private readonly prefix = createInbox("_INBOX_JG");
  readonly name = this.prefix.slice(this.prefix.lastIndexOf(".") + 1);
  private sub: Subscription | undefined;
  private jsm: JetStreamManager | undefined;
  /** Why NATS cannot be reached now (from the connection's status events); undefined while connected. */
  private down: string | undefined;

  constructor(private readonly nc: NatsConnection) {
    void this.watchConnection();
  }

  /** Follows the connection's status: a call made while it is down is refused, not queued for an ack that cannot come. */
  private async watchConnection(): Promise<void> {
    for await (const s of this.nc.status()) {
      if (s.type === "disconnect") this.down = `NATS connection to ${s.server} lost; reconnecting`;
      else if (s.type === "reconnecting") this.down ??= "NATS unreachable; reconnecting";
      else if (s.type === "reconnect") this.down = undefined;
      else if (s.type === "close") this.down = "NATS connection closed";
    }
    this.down = "NATS connection closed";
  }

  unavailable(): string | undefined {
    return this.nc.isClosed() ? "NATS connection closed" : this.down;
  }

  listen(onAnswer: (token: string, answer: AckAnswer) => void): void {
    const from = this.prefix.length + 1;
    const answer = (msg: Msg): AckAnswer => (msg.headers?.hasError ? { status: { code: msg.headers.code, description: msg.headers.description }, data: msg.data } : { data: msg.data });
    this.sub = this.nc.subscribe(`${this.prefix}.*`, { callback: (err, msg) => (err ? undefined : onAnswer(msg.subject.slice(from), answer(msg))) });
  }

  publish(subject: string, data: Uint8Array, msgId: string, token: string): void {
    const h = headers();
    h.set("Nats-Msg-Id", msgId);
    this.nc.publish(subject, data, { reply: `${this.prefix}.${token}`, headers: h });
  }

  publishInBatch(subject: string, data: Uint8Array, msgId: string, batch: BatchPlace): void {
    const h = headers();
    h.set("Nats-Msg-Id", msgId);
    h.set("Nats-Batch-Id", batch.id);
    h.set("Nats-Batch-Sequence", String(batch.index));
    if (batch.commit !== undefined) {
      h.set("Nats-Batch-Commit", "1");
      this.nc.publish(subject, data, { reply: `${this.prefix}.${batch.commit}`, headers: h });
    } else this.nc.publish(subject, data, { headers: h });
  }

  flush(): Promise<void> {
    return this.nc.flush();
  }

  /**
   * STREAM.MSG.GET, answered by the stream's leader: a direct get may be answered by a replica
   * still catching up, which has no entry the leader acknowledged (gateway/mailbox/nats.ts).
   */
  async stored(shard: number, offset: number, timeoutMs: number): Promise<Uint8Array | undefined> {
    this.jsm ??= await jetstreamManager(this.nc, { checkAPI: false, timeout: timeoutMs });
    const m = await this.jsm.streams.getMessage(shardStream(shard), { seq: offset });
    return m?.data;
  }

  close(): void {
    this.sub?.unsubscribe();
  }
}
