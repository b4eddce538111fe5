/**
 * Live pushes, routed: each entry goes only to the gateways that hold its user's sessions (the
 * routes the batch script read from the user's hash), gathered into one NATS message per gateway
 * per flush, for every shard of this worker. A user with no sessions anywhere costs no message at
 * all; a user whose routes Redis did not have goes to every gateway (BROADCAST_PUSH_SUBJECT), and
 * the gateways holding its sessions register again (docs/registry-and-worker.md, "Routing").
 *
 * Routes to a gateway that stopped beating (GatewayBeats) are skipped and dropped from the user's
 * hash. Pure but for `publish` and `dropRoutes`: tested without a server.
 */
import { BROADCAST_PUSH_SUBJECT, encodePush, encodePushBatch, routedPushSubject, type Push } from "../protocol/index.js";
import type { PushSink } from "./shard-ports.js";

/** A batch message stays under this many bytes (nats-server's max_payload is 1 MiB by default). */
const MAX_MESSAGE_BYTES = 512 * 1024;

export interface RouterSink {
  publish(subject: string, data: Uint8Array): void;
  /** Drops gateways that stopped beating from a user's routes (best effort: a later entry retries). */
  dropRoutes(user: string, gateways: string[]): void;
  /** A push sent to no gateway (no route), to every gateway (routes unknown), or not to a silent one: for the metrics. */
  note(what: "unrouted" | "broadcast" | "silent"): void;
}

/** Which gateways are known to have stopped (the worker's view of their beats). */
export interface GatewayLiveness {
  isSilent(gateway: string): boolean;
}

interface Outbox {
  encoded: Uint8Array[];
  bytes: number;
}

export class PushRouter implements PushSink {
  private readonly outboxes = new Map<string, Outbox>();
  /** (user, gateway) pairs dropped since the liveness view last changed: each is dropped once. */
  private readonly dropped = new Set<string>();

  constructor(
    private readonly sink: RouterSink,
    private readonly liveness: GatewayLiveness,
  ) {}

  /** Queues a push for the gateways of its user's sessions (undefined: unknown, so every gateway); sent by `flush`. */
  route(push: Push, routes: readonly string[] | undefined): void {
    if (routes === undefined) {
      this.sink.note("broadcast");
      return this.add(BROADCAST_PUSH_SUBJECT, encodePush(push));
    }
    if (routes.length === 0) return this.sink.note("unrouted");
    let encoded: Uint8Array | undefined;
    let silent: string[] | undefined;
    for (const gw of routes) {
      if (this.liveness.isSilent(gw)) {
        this.sink.note("silent");
        if (!this.dropped.has(`${push.user}/${gw}`)) (silent ??= []).push(gw);
        continue;
      }
      this.add(routedPushSubject(gw), (encoded ??= encodePush(push)));
    }
    if (silent !== undefined) {
      for (const gw of silent) this.dropped.add(`${push.user}/${gw}`);
      this.sink.dropRoutes(push.user, silent);
    }
  }

  /** The liveness view changed: a pair dropped before may be dropped again (a gateway came back and left). */
  forgetDrops(): void {
    this.dropped.clear();
  }

  private add(subject: string, encoded: Uint8Array): void {
    let box = this.outboxes.get(subject);
    if (box === undefined) this.outboxes.set(subject, (box = { encoded: [], bytes: 0 }));
    if (box.bytes > 0 && box.bytes + encoded.byteLength > MAX_MESSAGE_BYTES) this.send(subject, box);
    box.encoded.push(encoded);
    box.bytes += encoded.byteLength;
  }

  /** Publishes every queued push: one message per gateway (more only past MAX_MESSAGE_BYTES). */
  flush(): void {
    for (const [subject, box] of this.outboxes) if (box.encoded.length > 0) this.send(subject, box);
    this.outboxes.clear();
  }

  private send(subject: string, box: Outbox): void {
    this.sink.publish(subject, encodePushBatch(box.encoded));
    box.encoded = [];
    box.bytes = 0;
  }
}
