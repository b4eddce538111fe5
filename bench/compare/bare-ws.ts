/**
 * The WebSocket side of the bare servers (uws-limit, jetstream-limit): devices speak jetgate's
 * frames, their AUTH's token names the user; a user may have several connections (the `hot`
 * scenario's devices). No checks: a ceiling.
 */
import uws from "uWebSockets.js";
import { decodeClientFrame } from "../../protocol/index.js";

export type BareSocket = uws.WebSocket<{ user: string }>;

export interface BareHooks<C extends { ws: BareSocket }> {
  /** A device authenticated as `user`: its connection state (kept in `byUser`); `first` when no other connection of the user is open. */
  auth(ws: BareSocket, user: string, first: boolean): C;
  /** The socket took what was buffered: send more. */
  drain(c: C): void;
  /** A connection of the user closed (already removed from `byUser`); `last` when it was the user's last. */
  closed?(user: string, c: C, last: boolean): void;
}

/** Listens on 127.0.0.1:`port`; throws when it cannot. `byUser`: each user's open connections. */
export function listenBare<C extends { ws: BareSocket }>(port: number, byUser: Map<string, C[]>, hooks: BareHooks<C>): void {
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
        const conns = byUser.get(f.token);
        const c = hooks.auth(ws, f.token, conns === undefined);
        if (conns === undefined) byUser.set(f.token, [c]);
        else conns.push(c);
      },
      drain: (ws) => {
        const c = byUser.get(ws.getUserData().user)?.find((x) => x.ws === ws);
        if (c !== undefined) hooks.drain(c);
      },
      close: (ws) => {
        const user = ws.getUserData().user;
        const conns = byUser.get(user);
        const i = conns?.findIndex((x) => x.ws === ws) ?? -1;
        if (conns === undefined || i < 0) return;
        const [c] = conns.splice(i, 1);
        if (conns.length === 0) byUser.delete(user);
        hooks.closed?.(user, c!, conns.length === 0);
      },
    })
    .listen("127.0.0.1", port, (ok) => {
      if (!ok) throw new Error(`cannot listen on ${port}`);
    });
}
