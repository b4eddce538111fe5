/**
 * One live session per (user, device): the newest AUTH wins. Presence is a Redis key per device
 * holding `<gateway>/<session>/<auth ms>`; claiming it returns the previous holder, which is kicked
 * with 4409 (directly when it is on this gateway, over NATS `jetgate.kick.<gateway>` when elsewhere).
 * "Newest" is by the time the AUTH arrived, not by when the claim reached Redis: a claim delayed
 * behind a Redis outage must not kick the session that replaced it (the fault suite found this).
 * Such a late claim leaves the key alone and its own session is the one replaced.
 * Presence is soft state: after a Redis flush a replaced session on another gateway is not kicked
 * until it reconnects; sessions of one device on one gateway are always replaced.
 */
import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import { kickSubject, type RedisKeys } from "../../protocol/index.js";
import { scripted, type RedisClient, type ScriptedRedis } from "../../protocol/io/index.js";

export interface Kick {
  user: string;
  device: string;
  session: string;
}

export class Presence {
  private readonly redis: ScriptedRedis;
  private sub: Subscription | undefined;

  constructor(
    redis: RedisClient,
    private readonly keys: RedisKeys,
    private readonly nc: NatsConnection,
    readonly gatewayId: string,
    private readonly onKick: (k: Kick) => void,
    private readonly ttlS = 86_400,
  ) {
    this.redis = scripted(redis);
  }

  start(): void {
    this.sub = this.nc.subscribe(kickSubject(this.gatewayId), {
      callback: (_err, m) => {
        try {
          const k = m.json<Kick>();
          if (typeof k.user === "string" && typeof k.device === "string" && typeof k.session === "string") this.onKick(k);
        } catch {
          // not a kick: ignore
        }
      },
    });
  }

  /**
   * Records this session (AUTH at `at` ms) as the device's live one and kicks the previous holder.
   * "superseded" when a session of the device that authenticated later holds it already. Redis
   * being away is not an error: presence is soft state.
   */
  async claim(user: string, device: string, session: string, at: number): Promise<"claimed" | "superseded"> {
    const value = `${this.gatewayId}/${session}/${at}`;
    const got = await this.redis.jgPresenceClaim(this.keys.presence(user, device), value, this.ttlS, at).catch(() => null);
    if (got === null) return "claimed";
    const [won, prev] = got;
    if (won === 0) return "superseded";
    if (prev === "" || prev === value) return "claimed";
    const [gw, old] = prev.split("/") as [string, string | undefined];
    if (old === undefined || !/^[A-Za-z0-9_-]{1,64}$/.test(gw)) return "claimed";
    const kick: Kick = { user, device, session: old };
    if (gw === this.gatewayId) this.onKick(kick);
    else this.nc.publish(kickSubject(gw), JSON.stringify(kick));
    return "claimed";
  }

  async release(user: string, device: string, session: string, at: number): Promise<void> {
    await this.redis.jgPresenceRelease(this.keys.presence(user, device), `${this.gatewayId}/${session}/${at}`);
  }

  stop(): void {
    this.sub?.unsubscribe();
  }
}
