/**
 * The uWS adapter: WebSocket sessions on `/v1/ws`, HTTP on the same port (`/healthz`, `/readyz`,
 * `/metrics`, `POST /v1/dispatch`). The only file that touches uWS objects.
 *
 * uWS rules kept here: an incoming ArrayBuffer is copied before anything else (uWS neuters it
 * when the handler returns); a socket is never touched after its close event; an HTTP response
 * that is answered asynchronously registers onAborted first; limits are set explicitly.
 */
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { SignJWT } from "jose";
import type * as Uws from "uWebSockets.js";
import { z } from "zod";
import { DispatchValidationError, type Config, type Dispatcher } from "../protocol/index.js";
import type { SessionPorts, Transport } from "./ports.js";
import { Session } from "./session.js";

interface SocketData {
  session?: Session;
  closed: boolean;
  /** Client address, counted against JETGATE_MAX_CONNS_PER_IP. */
  ip: string;
}

export interface Readiness {
  problems(): string[];
}

export interface GatewayServer {
  port: number;
  /** Stops accepting connections and HTTP requests. */
  stopListening(): void;
  /** Refuse new WebSocket upgrades (draining). */
  refuseUpgrades(): void;
}

const MAX_DISPATCH_BODY = 4 * 1024 * 1024;

const DispatchBodySchema = z
  .strictObject({
    dispatch_id: z.string(),
    message_id: z.string(),
    lane: z.string(),
    recipients: z.array(z.string()),
    /** The entry body as UTF-8 text ... */
    body: z.string().optional(),
    /** ... or as base64 bytes. */
    body_b64: z.string().regex(/^[A-Za-z0-9+/]*={0,2}$/, "must be base64").optional(),
  })
  .refine((b) => (b.body === undefined) !== (b.body_b64 === undefined), { message: "give exactly one of body and body_b64" });

export function startServer(
  uws: typeof Uws,
  config: Config,
  ctx: SessionPorts,
  dispatcher: Dispatcher,
  readiness: Readiness,
): Promise<GatewayServer> {
  const app = uws.App();
  let upgrades = true;
  const perIp = new Map<string, number>();
  const ipLimit = config.JETGATE_MAX_CONNS_PER_IP;
  app.ws<SocketData>("/v1/ws", {
    maxPayloadLength: config.JETGATE_MAX_PAYLOAD * 2, // hard stop; the session answers 4413 above the configured limit
    idleTimeout: config.JETGATE_IDLE_TIMEOUT_S,
    maxBackpressure: config.JETGATE_MAX_BACKPRESSURE * 2, // the session closes 4408 at the configured limit first
    closeOnBackpressureLimit: 1, // never silently drop a frame
    sendPingsAutomatically: true,
    upgrade: (res, req, context) => {
      if (!upgrades) {
        res.writeStatus("503 Service Unavailable").end("draining");
        return;
      }
      const forwarded = config.JETGATE_TRUST_FORWARDED_FOR ? req.getHeader("x-forwarded-for").split(",").pop()?.trim() : undefined;
      const ip = forwarded || Buffer.from(res.getRemoteAddressAsText()).toString();
      const open = perIp.get(ip) ?? 0;
      if (ipLimit > 0 && open >= ipLimit) {
        ctx.metrics.refusedUpgrades.inc({ reason: "per_ip" });
        res.writeStatus("429 Too Many Requests").end("too many connections from this address");
        return;
      }
      // counted from the upgrade, so a burst of handshakes cannot pass the limit before `open`
      perIp.set(ip, open + 1);
      res.upgrade<SocketData>(
        { closed: false, ip },
        req.getHeader("sec-websocket-key"),
        req.getHeader("sec-websocket-protocol"),
        req.getHeader("sec-websocket-extensions"),
        context,
      );
    },
    open: (ws) => {
      const data = ws.getUserData();
      const transport: Transport = {
        send: (bytes) => !data.closed && ws.send(bytes, true) === 1,
        buffered: () => (data.closed ? 0 : ws.getBufferedAmount()),
        close: (code, reason) => {
          if (data.closed) return;
          data.closed = true;
          ws.end(code, reason);
        },
      };
      const session = new Session(randomBytes(9).toString("base64url"), transport, ctx);
      data.session = session;
      ctx.hub.open(session);
    },
    message: (ws, message, isBinary) => {
      const copy = new Uint8Array(message.slice(0));
      ws.getUserData().session?.onFrame(copy, isBinary);
    },
    drain: (ws) => ws.getUserData().session?.onDrain(),
    close: (ws, code) => {
      const data = ws.getUserData();
      data.closed = true;
      const n = (perIp.get(data.ip) ?? 1) - 1;
      if (n <= 0) perIp.delete(data.ip);
      else perIp.set(data.ip, n);
      data.session?.onClosed(code);
    },
  });

  app.get("/healthz", (res) => void res.writeStatus("200 OK").end("ok\n"));
  app.get("/readyz", (res) => {
    const problems = readiness.problems();
    res
      .writeStatus(problems.length === 0 ? "200 OK" : "503 Service Unavailable")
      .writeHeader("content-type", "application/json")
      .end(JSON.stringify({ ready: problems.length === 0, problems }) + "\n");
  });
  app.get("/metrics", (res) => {
    let aborted = false;
    res.onAborted(() => (aborted = true));
    void ctx.metrics.registry.metrics().then((text) => {
      if (!aborted) res.cork(() => res.writeHeader("content-type", ctx.metrics.registry.contentType).end(text));
    });
  });
  app.post("/v1/dispatch", (res, req) => {
    const auth = req.getHeader("authorization");
    handleDispatch(res, auth, config, ctx, dispatcher);
  });
  if (config.JETGATE_DEMO_DIR !== undefined && config.JETGATE_ENV === "development") serveDemo(app, config, config.JETGATE_DEMO_DIR);
  app.any("/*", (res) => void res.writeStatus("404 Not Found").end("not found\n"));

  return new Promise((resolve, reject) => {
    app.listen(config.JETGATE_GATEWAY_HOST, config.JETGATE_GATEWAY_PORT, (listenSocket) => {
      if (listenSocket === false) {
        reject(new Error(`cannot listen on ${config.JETGATE_GATEWAY_HOST}:${config.JETGATE_GATEWAY_PORT}`));
        return;
      }
      resolve({
        port: uws.us_socket_local_port(listenSocket as unknown as Uws.us_socket),
        stopListening: () => uws.us_listen_socket_close(listenSocket),
        refuseUpgrades: () => (upgrades = false),
      });
    });
  });
}

/**
 * Local mode: the demo page and a token endpoint that signs development tokens with the HS256
 * secret (never in production: loadConfig refuses JETGATE_DEMO_DIR there).
 */
function serveDemo(app: Uws.TemplatedApp, config: Config, dir: string): void {
  const file = (name: string, type: string) => (res: Uws.HttpResponse) => {
    let body: Buffer;
    try {
      body = readFileSync(join(dir, name));
    } catch {
      res.writeStatus("404 Not Found").end(`${name} is missing: run npm run build:sdk\n`);
      return;
    }
    res.writeHeader("content-type", type).writeHeader("cache-control", "no-store").end(body);
  };
  app.get("/demo/", file("index.html", "text/html; charset=utf-8"));
  app.get("/demo/index.html", file("index.html", "text/html; charset=utf-8"));
  app.get("/demo/jetgate.js", file("jetgate.js", "text/javascript; charset=utf-8"));
  app.get("/demo/token", (res, req) => {
    const user = req.getQuery("user") ?? "";
    const device = req.getQuery("device") ?? "";
    if (!/^[A-Za-z0-9_-]{1,64}$/.test(user) || (device !== "" && !/^[A-Za-z0-9_-]{1,64}$/.test(device))) {
      res.writeStatus("400 Bad Request").end("user and device must be 1..64 of A-Z a-z 0-9 _ -\n");
      return;
    }
    let aborted = false;
    res.onAborted(() => (aborted = true));
    void new SignJWT(device ? { dev: device } : {})
      .setProtectedHeader({ alg: "HS256" })
      .setSubject(user)
      .setExpirationTime("1h")
      .sign(new TextEncoder().encode(config.JETGATE_JWT_SECRET ?? ""))
      .then((jwt) => {
        if (!aborted) res.cork(() => res.writeHeader("content-type", "text/plain").end(jwt));
      });
  });
}

function reply(res: Uws.HttpResponse, aborted: () => boolean, status: string, body: unknown): void {
  if (aborted()) return;
  res.cork(() => res.writeStatus(status).writeHeader("content-type", "application/json").end(JSON.stringify(body) + "\n"));
}

function handleDispatch(res: Uws.HttpResponse, auth: string, config: Config, ctx: SessionPorts, dispatcher: Dispatcher): void {
  let aborted = false;
  res.onAborted(() => (aborted = true));
  const done = (status: string, body: unknown) => {
    ctx.metrics.dispatchRequests.inc({ status: status.slice(0, 3) });
    reply(res, () => aborted, status, body);
  };
  const token = config.JETGATE_SERVICE_TOKEN;
  if (token === undefined) {
    done("503 Service Unavailable", { error: "the dispatch API is disabled: set JETGATE_SERVICE_TOKEN" });
    return;
  }
  if (!constantTimeEqual(auth, `Bearer ${token}`)) {
    done("401 Unauthorized", { error: "missing or wrong bearer token" });
    return;
  }
  const chunks: Buffer[] = [];
  let size = 0;
  res.onData((chunk, isLast) => {
    size += chunk.byteLength;
    if (size > MAX_DISPATCH_BODY) {
      if (!aborted) done("413 Payload Too Large", { error: `request body over ${MAX_DISPATCH_BODY} bytes` });
      aborted = true;
      return;
    }
    chunks.push(Buffer.from(chunk.slice(0)));
    if (!isLast || aborted) return;
    void dispatchBody(Buffer.concat(chunks), dispatcher).then(
      (r) => done(r.status, r.body),
      (err: unknown) => {
        ctx.log.error({ err }, "dispatch failed");
        done("500 Internal Server Error", { error: "internal error" });
      },
    );
  });
}

async function dispatchBody(raw: Buffer, dispatcher: Dispatcher): Promise<{ status: string; body: unknown }> {
  let json: unknown;
  try {
    json = JSON.parse(raw.toString("utf8"));
  } catch {
    return { status: "400 Bad Request", body: { error: "body is not JSON" } };
  }
  const parsed = DispatchBodySchema.safeParse(json);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    return { status: "400 Bad Request", body: { error: `${issue.path.join(".") || "request"}: ${issue.message}`, field: issue.path.join(".") || undefined } };
  }
  const b = parsed.data;
  const body = b.body !== undefined ? new TextEncoder().encode(b.body) : new Uint8Array(Buffer.from(b.body_b64!, "base64"));
  try {
    const results = await dispatcher.dispatch({ dispatch_id: b.dispatch_id, message_id: b.message_id, lane: b.lane, recipients: b.recipients, body });
    const failed = results.some((r) => "error" in r);
    // `seq` is the mailbox_seq the device sees, as a decimal string (it passes 2^53 at epoch 32);
    // `offset` is the stream offset.
    const out = results.map((r) =>
      "error" in r ? r : { user: r.user, shard: r.shard, seq: r.seq.toString(), offset: r.offset, duplicate: r.duplicate },
    );
    return { status: failed ? "502 Bad Gateway" : "200 OK", body: { results: out } };
  } catch (err) {
    if (err instanceof DispatchValidationError) return { status: "400 Bad Request", body: { error: err.message, field: err.field } };
    throw err;
  }
}

function constantTimeEqual(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  let diff = x.length ^ y.length;
  for (let i = 0; i < Math.max(x.length, y.length); i++) diff |= (x[i % Math.max(1, x.length)] ?? 0) ^ (y[i % Math.max(1, y.length)] ?? 0);
  return diff === 0;
}
