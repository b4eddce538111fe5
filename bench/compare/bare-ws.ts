/**
 * The WebSocket side of the bare servers (uws-limit, jetstream-limit): devices speak jetgate's
 * frames, their AUTH's token names the user, one connection per user. No checks: a ceiling.
 */
import uws from "uWebSockets.js";
import { decodeClientFrame } from "../../protocol/index.js";

export type BareSocket = uws.WebSocket<{ user: string }>;

export interface BareHooks<C extends { ws: BareSocket }> {
  /** A device authenticated as `user`: its connection state (kept in `byUser`). */
  auth(ws: BareSocket, user: string): C;
  /** The socket took what was buffered: send more. */
  drain(c: C): void;
  /** The user's current connection closed (already removed from `byUser`). */
  closed?(user: string, c: C): void;
}

/** Listens on 127.0.0.1:`port`; throws when it cannot. */
export function listenBare<C extends { ws: BareSocket }>(port: number, byUser: Map<string, C>, hooks: BareHooks<C>): void {
  uws
    .App()
    .ws<{ user: string }>("/v1/ws", {
      maxPayloadLength: 64 * 1024,
      maxBackpressure: 64 * 1024 * 1024,
      idleTimeout: 0,
      message: (ws, message) => {
        const f = decodeClientFrame(new Uint8Array(message.slice(0)));
        if (f.t !== "AUTH") return;
        ws.getUserData().user = f.token;
        byUser.set(f.token, hooks.auth(ws, f.token));
      },
      drain: (ws) => {
        const c = byUser.get(ws.getUserData().user);
        if (c?.ws === ws) hooks.drain(c);
      },
      close: (ws) => {
        const user = ws.getUserData().user;
        const c = byUser.get(user);
        if (c?.ws !== ws) return;
        byUser.delete(user);
        hooks.closed?.(user, c!);
      },
    })
    .listen("127.0.0.1", port, (ok) => {
      if (!ok) throw new Error(`cannot listen on ${port}`);
    });
}
