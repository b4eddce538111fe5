/**
 * The shard streams for the mailbox reader (MailboxStream), on NATS JetStream: stream info, leader
 * gets and ephemeral filtered consumers. Failures are turned into what a session should see
 * (`streamCallError`).
 */
import { randomBytes } from "node:crypto";
import { ClosedConnectionError, NoRespondersError, RequestError, TimeoutError, type NatsConnection } from "@nats-io/transport-node";
import { AckPolicy, DeliverPolicy, JetStreamApiError, JetStreamError, jetstream, jetstreamManager, type JetStreamManager, type MsgRequest, type StoredMsg } from "@nats-io/jetstream";
// the pull status error is exported on the package's internal path only
import { JetStreamStatusError } from "@nats-io/jetstream/internal";
import { entrySubject, readerConsumerName, shardStream, userSubjects } from "../../protocol/index.js";
import { isNotFound, logOfStream } from "../../protocol/io/index.js";
import { RETRY_LATER_MS, ShardNotReadyError, UnavailableError } from "./gather.js";
import type { MailboxStream, StreamCursor, StreamMsg, StreamState } from "./ports.js";

/** JetStream's "too many consumers" (10026): a reader's consumer refused for load, not for what it asked. */
const MAX_CONSUMERS = 10026;

/**
 * A JetStream answer that says the server cannot serve now, not that the request was wrong: an
 * API error with a 5xx status (10008 "JetStream system temporarily unavailable" while a clustered
 * meta or stream leader is busy or moving, 10118 "stream is offline", 10023 "insufficient
 * resources", ...) or the consumer limit; a pull's 408/409/503 status (a leadership change, the
 * consumer deleted under it, no responders). On an R3 cluster under load these come and go.
 */
function jetStreamBusy(err: unknown): boolean {
  if (err instanceof JetStreamApiError) return err.status >= 500 || err.code === MAX_CONSUMERS;
  if (err instanceof JetStreamStatusError) return err.code === 408 || err.code === 409 || err.code === 503;
  return false;
}

/**
 * What a failed stream call of `shard` means to a session: a stream the registry names but that is
 * not there is not ready; NATS request and connection failures and a JetStream that says it cannot
 * serve now (neither says anything of the data) are unavailable; anything else stays as it is.
 */
export function streamCallError(err: unknown, shard: number, inRegistry: boolean): unknown {
  if (isNotFound(err) && inRegistry) return new ShardNotReadyError(shard, { cause: err });
  // "heartbeats missed": a read's consumer went quiet for two heartbeats, as when this process's
  // event loop was too busy to see them (the hot benchmark); the device resumes by cursor
  const missed = err instanceof JetStreamError && err.message === "heartbeats missed";
  if (err instanceof TimeoutError || err instanceof RequestError || err instanceof NoRespondersError || err instanceof ClosedConnectionError || missed || jetStreamBusy(err)) {
    return new UnavailableError(`shard ${shard}'s stream did not answer (${(err as Error).message}); reconnect`, RETRY_LATER_MS, { cause: err });
  }
  return err;
}

const toMsg = (m: StoredMsg | null): StreamMsg | null => (m === null ? null : { offset: m.seq, subject: m.subject, data: m.data });

export class NatsMailboxStream implements MailboxStream {
  private jsm: JetStreamManager | undefined;
  private readonly js;

  /** `inRegistry`: whether the registry view names the shard (a missing stream is then "not ready"). */
  constructor(
    private readonly nc: NatsConnection,
    private readonly inRegistry: (shard: number) => boolean,
  ) {
    this.js = jetstream(nc);
  }

  private async manager(): Promise<JetStreamManager> {
    this.jsm ??= await jetstreamManager(this.nc);
    return this.jsm;
  }

  /**
   * A stream call for a shard the registry names: a stream that is not there (yet) is "not ready",
   * and a JetStream that does not answer (a burst of requests timed out, a leader moving, the
   * connection down) is "unavailable": neither is an internal error. A split records its child
   * before some process sees its stream; a storm of first entries once timed 217 gap fills out.
   */
  private async call<T>(shard: number, f: (jsm: JetStreamManager) => Promise<T>): Promise<T> {
    try {
      return await f(await this.manager());
    } catch (err) {
      throw streamCallError(err, shard, this.inRegistry(shard));
    }
  }

  /**
   * One message by sequence or subject from the stream's leader (JetStream's STREAM.MSG.GET; null
   * when there is none). Never a direct get: any replica answers those, and a replica that is
   * catching up (a restarted node of an R3 cluster) says "nothing there" for an entry the leader
   * acknowledged. A gap fill believed it and sent the next entry over the gap (found by the NATS R3
   * fault scenario).
   */
  private leaderGet(shard: number, query: { last_by_subj: string } | { seq: number; next_by_subj: string }): Promise<StreamMsg | null> {
    // nats.js types STREAM.MSG.GET without next_by_subj, which nats-server has served since 2.9
    return this.call(shard, async (jsm) => toMsg(await jsm.streams.getMessage(shardStream(shard), query as MsgRequest)));
  }

  state(shard: number): Promise<StreamState> {
    return this.call(shard, async (jsm) => {
      const info = await jsm.streams.info(shardStream(shard));
      return { firstOffset: info.state.first_seq, lastOffset: info.state.last_seq, log: logOfStream(info) };
    });
  }

  last(shard: number, user: string, lane: string): Promise<StreamMsg | null> {
    return this.leaderGet(shard, { last_by_subj: entrySubject(shard, user, lane) });
  }

  next(shard: number, user: string, offset: number): Promise<StreamMsg | null> {
    return this.leaderGet(shard, { seq: offset, next_by_subj: userSubjects(shard, user) });
  }

  async open(shard: number, user: string, offset: number): Promise<StreamCursor> {
    const stream = shardStream(shard);
    const name = readerConsumerName(randomBytes(6).toString("hex"));
    let created;
    try {
      created = await this.call(shard, (jsm) => jsm.consumers.add(stream, {
        name,
        filter_subject: userSubjects(shard, user),
        deliver_policy: DeliverPolicy.StartSequence,
        opt_start_seq: offset,
        ack_policy: AckPolicy.None,
        mem_storage: true,
        inactive_threshold: 30_000_000_000,
      }));
      const consumer = await this.call(shard, () => this.js.consumers.get(stream, name));
      const close = async () => void (await this.jsm?.consumers.delete(stream, name).catch(() => undefined));
      const fail = (err: unknown) => streamCallError(err, shard, this.inRegistry(shard));
      return {
        pending: created.num_pending,
        async *fetch(max: number) {
          try {
            const batch = await consumer.fetch({ max_messages: max, expires: 5000 });
            for await (const m of batch) yield { offset: m.seq, subject: m.subject, data: m.data, left: m.info.pending };
          } catch (err) {
            throw fail(err);
          }
        },
        close,
      };
    } catch (err) {
      if (created !== undefined) await this.jsm?.consumers.delete(stream, name).catch(() => undefined);
      throw err;
    }
  }
}
