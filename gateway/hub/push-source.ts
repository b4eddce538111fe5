/**
 * The NATS push source: the batches workers route to this gateway (`jetgate.push.gw.<gateway>`) and
 * those sent to every gateway (`jetgate.push.any`), decoded once per message and handed to the
 * sessions once per event-loop turn (gateway/hub/push-handover.ts).
 */
import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import { BROADCAST_PUSH_SUBJECT, decodePushBatch, routedPushSubject, type Push } from "../../protocol/index.js";
import type { PushSource } from "../ports.js";
import { PushHandover } from "./push-handover.js";

export class NatsPushSource implements PushSource {
  private subs: Subscription[] = [];
  private handover: PushHandover | undefined;

  constructor(
    private readonly nc: NatsConnection,
    private readonly gatewayId: string,
    private readonly log: { warn(o: object, msg: string): void },
    /** Pushes that did not read (a worker of another version, say): counted, the rest of their batch delivered. */
    private readonly unreadable: (n: number) => void,
  ) {}

  start(onPushes: (pushes: readonly Push[], broadcast: boolean) => void): void {
    const handover = (this.handover = new PushHandover(onPushes));
    const sub = (subject: string, broadcast: boolean) =>
      this.nc.subscribe(subject, {
        callback: (err, m) => {
          if (err !== null) return;
          let got;
          try {
            got = decodePushBatch(m.data);
          } catch (e) {
            this.unreadable(1);
            this.log.warn({ subject, err: (e as Error).message }, "unreadable push batch dropped");
            return;
          }
          if (got.unreadable > 0) {
            this.unreadable(got.unreadable);
            this.log.warn({ subject, unreadable: got.unreadable }, "unreadable pushes dropped from a batch");
          }
          handover.take(got.pushes, broadcast);
        },
      });
    this.subs = [sub(routedPushSubject(this.gatewayId), false), sub(BROADCAST_PUSH_SUBJECT, true)];
  }

  stop(): void {
    for (const s of this.subs) s.unsubscribe();
    this.subs = [];
    this.handover?.clear();
  }
}
