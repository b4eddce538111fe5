/**
 * Which gateways are there to ask, and the asking. A users-API call (disconnect, revoke, presence)
 * asks every gateway over NATS and must know when it has heard them all. Redis's beat set alone
 * cannot say: a gateway that lost Redis but not NATS stops beating there while it still holds its
 * devices and answers on NATS, and a gather that stopped after "live by Redis" answers left its
 * sessions out of an answer it called complete.
 *
 * So every gateway also beats on NATS (CONTROL_SUBJECTS.beat, each GATEWAY_LIVENESS.beatEveryMs),
 * and each one keeps the roster of the gateways it heard, by its own monotonic clock (no two
 * machines' clocks are compared). A call waits for every gateway heard on NATS or beating in Redis,
 * and says `partial` unless all of them answered and both sources were known.
 */
import { createInbox, type NatsConnection, type Subscription } from "@nats-io/transport-node";
import { z } from "zod";
import { CONTROL_SUBJECTS, GATEWAY_LIVENESS } from "../../protocol/index.js";
import { ControlReplySchema, parseJson, type ControlReply } from "./control.js";

const GatewayId = z.string().min(1).max(128);
export const BeatSchema = z.object({ gateway: GatewayId });

/** The gateways this one heard on NATS. Pure: the caller says what time it is (monotonic ms). */
export class GatewayRoster {
  private readonly heard = new Map<string, number>();

  constructor(
    readonly self: string,
    /** When this roster began to listen: until it has listened for two beats, it may not have heard everyone. */
    private readonly since: number,
    private readonly liveWithinMs = GATEWAY_LIVENESS.liveWithinS * 1000,
  ) {}

  heardFrom(gateway: string, now: number): void {
    this.heard.set(gateway, now);
  }

  /** Gateways heard within the liveness window, this one always among them. */
  live(now: number): Set<string> {
    const out = new Set([this.self]);
    for (const [g, at] of this.heard) {
      if (now - at <= this.liveWithinMs) out.add(g);
      else this.heard.delete(g);
    }
    return out;
  }

  /** Whether the roster has listened long enough to have heard every gateway that beats. */
  warm(now: number): boolean {
    return now - this.since >= 2 * GATEWAY_LIVENESS.beatEveryMs;
  }
}

/** Beats on NATS and keeps the roster; `stop` ends both. */
export class NatsRoster {
  readonly roster: GatewayRoster;
  private sub: Subscription | undefined;
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly nc: NatsConnection,
    gatewayId: string,
    private readonly clock: () => number = () => performance.now(),
  ) {
    this.roster = new GatewayRoster(gatewayId, clock());
  }

  start(): void {
    this.sub = this.nc.subscribe(CONTROL_SUBJECTS.beat, {
      callback: (err, m) => {
        if (err !== null) return;
        const beat = parseJson(m, BeatSchema, 1024);
        if (beat !== undefined) this.roster.heardFrom(beat.gateway, this.clock());
      },
    });
    const body = JSON.stringify({ gateway: this.roster.self });
    const beat = () => this.nc.publish(CONTROL_SUBJECTS.beat, body);
    beat();
    this.timer = setInterval(beat, GATEWAY_LIVENESS.beatEveryMs);
    this.timer.unref();
  }

  live(): Set<string> {
    return this.roster.live(this.clock());
  }

  warm(): boolean {
    return this.roster.warm(this.clock());
  }

  stop(): void {
    clearInterval(this.timer);
    this.sub?.unsubscribe();
  }
}

/** Largest answer read from one gateway (a presence answer for 100 busy users). */
const MAX_REPLY_BYTES = 1024 * 1024;

export interface Gathered {
  /** One answer per gateway that answered. */
  replies: ControlReply[];
  /** Every gateway the call waited for: heard on NATS, or beating in Redis when Redis said. */
  expected: Set<string>;
  /** Whether Redis's beat set was read in time (a gateway that lost NATS is known only there). */
  redisKnown: boolean;
}

/**
 * Asks every gateway and collects one answer from each: until every expected gateway has answered
 * (those heard on NATS at once, those beating in Redis once `redisLive` says), or `maxWaitMs`.
 * Answers that do not parse are not counted.
 */
export function askGateways(
  nc: NatsConnection,
  subject: string,
  body: unknown,
  opts: { expected: ReadonlySet<string>; redisLive: Promise<readonly string[] | null>; maxWaitMs: number },
): Promise<Gathered> {
  const expected = new Set(opts.expected);
  const answered = new Map<string, ControlReply>();
  let redisKnown = false;
  let redisRead = false;
  return new Promise<Gathered>((resolve) => {
    let sub: Subscription | undefined;
    let finished = false;
    const finish = () => {
      if (finished) return;
      finished = true;
      clearTimeout(timer);
      sub?.unsubscribe();
      resolve({ replies: [...answered.values()], expected, redisKnown });
    };
    const check = () => {
      if (redisRead && [...expected].every((g) => answered.has(g))) finish();
    };
    const timer = setTimeout(finish, opts.maxWaitMs);
    void opts.redisLive.then((ids) => {
      redisRead = true;
      if (ids !== null) {
        redisKnown = true;
        for (const g of ids) expected.add(g);
      }
      check();
    });
    try {
      const inbox = createInbox();
      sub = nc.subscribe(inbox, {
        callback: (err, m) => {
          if (err !== null) return;
          const r = parseJson(m, ControlReplySchema, MAX_REPLY_BYTES);
          if (r === undefined || answered.has(r.gateway)) return;
          answered.set(r.gateway, r);
          check();
        },
      });
      nc.publish(subject, JSON.stringify(body), { reply: inbox });
    } catch {
      finish(); // NATS closed: nobody was asked
    }
  });
}

/** How a call's answer says who answered: `partial` unless every gateway there is to ask did. */
export function answeredOf(g: Gathered, warm: boolean): { answered: number; live: number; partial: boolean } {
  const answered = new Set(g.replies.map((r) => r.gateway));
  const missing = [...g.expected].some((id) => !answered.has(id));
  return { answered: g.replies.length, live: g.expected.size, partial: missing || !g.redisKnown || !warm };
}
