/**
 * What a backend's call (the users API, gateway/http/users-api.ts) asks of every gateway, over NATS:
 * end a user's sessions, apply a token revocation, say who is online. The gateway that took the
 * call asks them all with one request (protocol's CONTROL_SUBJECTS) and collects the answers
 * (gateway/http/roster.ts says whom it waits for); each gateway answers with what it did or holds. Requests are zod-validated on receipt:
 * only jetgate's own NATS user may publish there (docs/examples/nats-permissions.conf), but a
 * malformed one is dropped, never acted on.
 */
import type { Msg, NatsConnection, Subscription } from "@nats-io/transport-node";
import type { Logger } from "pino";
import { z } from "zod";
import { CONTROL_SUBJECTS, Disconnect, idSchema, withReason } from "../../protocol/index.js";
import { RevocationSchema, type Revocations } from "../hub/revocations.js";

/** Users one presence request may name. */
export const MAX_PRESENCE_USERS = 100;
/** Longest reason a backend may give for a disconnect (a WebSocket close reason holds 123 bytes). */
export const MAX_REASON_LENGTH = 100;

/** How a session ends: `signed_out` (4403: the SDK stops) or `reconnect` (4300: the SDK reconnects at once, with a fresh token). */
export const DisconnectMode = z.enum(["signed_out", "reconnect"]);
export type DisconnectMode = z.output<typeof DisconnectMode>;

/** How the sessions end: the backend's reason, or "signed out" / "reconnect now". */
export function disconnectFor(mode: DisconnectMode, reason: string | undefined): Disconnect {
  return mode === "signed_out" ? withReason(Disconnect.SIGNED_OUT, reason ?? "signed out") : withReason(Disconnect.RECONNECT_NOW, reason ?? "reconnect now");
}

/** A disconnect's close reason, as the backend gives it (HTTP) and as gateways take it (NATS). */
export const ReasonSchema = z.string().max(MAX_REASON_LENGTH).regex(/^[\x20-\x7e]*$/, "printable ASCII only").optional();
const reason = ReasonSchema;

export const DisconnectRequestSchema = z.object({ user: idSchema("user"), device: idSchema("device").optional(), mode: DisconnectMode, reason });
export type DisconnectRequest = z.output<typeof DisconnectRequestSchema>;

export const RevokeRequestSchema = RevocationSchema.extend({ mode: DisconnectMode, reason });
export type RevokeRequest = z.output<typeof RevokeRequestSchema>;

export const PresenceRequestSchema = z.object({ users: z.array(idSchema("user")).min(1).max(MAX_PRESENCE_USERS) });

export const PresentSessionSchema = z.object({ user: z.string(), device: z.string(), gateway: z.string(), since: z.number().int().min(0) });
export type PresentSession = z.output<typeof PresentSessionSchema>;

export const ControlReplySchema = z.object({
  gateway: z.string().max(128),
  /** Sessions this gateway ended (disconnect, revoke). */
  ended: z.number().int().min(0).optional(),
  /** Live sessions of the users asked about (presence). */
  sessions: z.array(PresentSessionSchema.omit({ gateway: true })).max(100_000).optional(),
});
export type ControlReply = z.output<typeof ControlReplySchema>;

/** What the control requests act on: the gateway's sessions and its revocations. */
export interface ControlTarget {
  end(user: string, d: Disconnect, opts?: { device?: string; issuedBefore?: number }): number;
  present(users: readonly string[]): { user: string; device: string; since: number }[];
}

/** Answers the control requests on this gateway. */
export class ControlHandler {
  private subs: Subscription[] = [];

  constructor(
    private readonly nc: NatsConnection,
    private readonly gatewayId: string,
    private readonly sessions: ControlTarget,
    private readonly revocations: Revocations,
    private readonly log: Pick<Logger, "warn" | "info">,
  ) {}

  start(): void {
    const on = <T>(subject: string, schema: z.ZodType<T>, act: (req: T) => Omit<ControlReply, "gateway">) =>
      this.nc.subscribe(subject, {
        callback: (err, m) => {
          if (err !== null) return;
          const req = parseJson(m, schema);
          if (req === undefined) return void this.log.warn({ subject }, "control request refused: not a valid request");
          const reply: ControlReply = { gateway: this.gatewayId, ...act(req) };
          if (m.reply) m.respond(JSON.stringify(reply));
        },
      });
    this.subs = [
      on(CONTROL_SUBJECTS.disconnect, DisconnectRequestSchema, (r) => {
        return { ended: this.sessions.end(r.user, disconnectFor(r.mode, r.reason), r.device !== undefined ? { device: r.device } : {}) };
      }),
      on(CONTROL_SUBJECTS.revoke, RevokeRequestSchema, (r) => {
        this.revocations.add(r);
        const d = disconnectFor(r.mode, r.reason ?? "token revoked");
        return { ended: this.sessions.end(r.user, d, { issuedBefore: r.before, ...(r.device !== undefined ? { device: r.device } : {}) }) };
      }),
      on(CONTROL_SUBJECTS.presence, PresenceRequestSchema, (r) => ({ sessions: this.sessions.present(r.users) })),
    ];
  }

  stop(): void {
    for (const s of this.subs) s.unsubscribe();
  }
}

/** A control message's JSON body, checked by `schema`; undefined when it is too large or does not parse. */
export function parseJson<T>(m: Msg, schema: z.ZodType<T>, maxBytes = 64 * 1024): T | undefined {
  if (m.data.byteLength > maxBytes) return undefined;
  try {
    const r = schema.safeParse(m.json());
    return r.success ? r.data : undefined;
  } catch {
    return undefined;
  }
}
