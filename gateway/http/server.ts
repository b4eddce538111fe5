/**
 * The uWS adapter: WebSocket sessions on `/v1/ws` and `POST /v1/dispatch` (and its batch form,
 * `/v1/dispatch/batch`) on the device port, the users API (`/v1/users/...`, `/v1/presence`:
 * gateway/http/users-api.ts), its OpenAPI document at `GET /v1/openapi.json`, and
 * nothing else but the development demo page (health and metrics have a listener of their own,
 * protocol/io/ops-http.ts). The only file that touches uWS objects.
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
import {
  type Config,
  type Disconnect,
  DispatchUnavailableError,
  DispatchValidationError,
  type DispatchResult,
} from "../../protocol/index.js";
import { type Dispatcher } from "../../protocol/io/index.js";
import { BATCH_SHAPE, DispatchShapeGuard, SINGLE_SHAPE, maxDispatchBodyBytes, parseDispatchBatch, parseDispatchBody, type DispatchAnswerJson, type DispatchErrorJson, type DispatchResultJson, type ParsedDispatch } from "./dispatch-body.js";
import { openApiJson } from "./openapi.js";
import type { ServiceAuth } from "./service-auth.js";
import { serveAdmin, type AdminSource } from "./admin.js";
import { serveUsersApi, type UsersApiDeps } from "./users-api.js";
import type { SessionPorts, Transport } from "../ports.js";
import { Session } from "../session/session.js";

interface SocketData {
  session?: Session;
  closed: boolean;
  /** Client address, counted against JETGATE_MAX_CONNS_PER_IP. */
  ip: string;
}

/**
 * A session's socket. One small object per connection, not three closures and their context: at
 * 100k idle connections per gateway every byte of per-connection state counts (the idle benchmark).
 */
class UwsTransport implements Transport {
  constructor(
    private readonly ws: Uws.WebSocket<SocketData>,
    private readonly data: SocketData,
  ) {}

  send(bytes: Uint8Array): boolean {
    return !this.data.closed && this.ws.send(bytes, true) === 1;
  }

  buffered(): number {
    return this.data.closed ? 0 : this.ws.getBufferedAmount();
  }

  close(d: Disconnect): void {
    if (this.data.closed) return;
    this.data.closed = true;
    this.ws.end(d.close, d.reason);
  }
}

export interface GatewayServer {
  port: number;
  /** Stops accepting connections and HTTP requests. */
  stopListening(): void;
  /** Refuse new WebSocket upgrades (draining). */
  refuseUpgrades(): void;
  /** Device connections open now (counted from their upgrade). */
  connections(): number;
  /** Closes the listener for want of files (gateway/http/accept-guard.ts): new connections are refused at once. */
  pauseAccepting(): void;
  /** Listens again on the same port. */
  resumeAccepting(): void;
}

/** What startServer serves beside devices and dispatch, and its limits. */
export interface ServerOptions {
  /** Dependencies not answering now: new devices are turned away (503) to try another gateway. */
  unavailable?: () => string[];
  /** The operator console's sources (gateway/http/admin.ts); its routes answer 404 without JETGATE_ADMIN_TOKEN. */
  admin?: AdminSource;
  /** The users API (gateway/http/users-api.ts): disconnect, revoke, presence, mailbox position. */
  usersApi?: UsersApiDeps;
  /** Devices taken at once (gateway/http/capacity.ts); past it, upgrades are answered 503. */
  maxConnections: number;
}

export function startServer(
  uws: typeof Uws,
  config: Config,
  ctx: SessionPorts,
  dispatcher: Dispatcher,
  /** The service tokens and their scopes, for the dispatch and users APIs (one count of wrong tokens per address for both). */
  serviceAuth: ServiceAuth,
  opts: ServerOptions,
): Promise<GatewayServer> {
  const { admin, usersApi, maxConnections } = opts;
  const unavailable = opts.unavailable ?? (() => []);
  const app = uws.App();
  let upgrades = true;
  const perIp = new Map<string, number>();
  /** Device connections, counted from the upgrade (a burst of handshakes cannot pass the cap). */
  let open = 0;
  /** The client's address: the last X-Forwarded-For hop behind a proxy that sets it (JETGATE_TRUST_FORWARDED_FOR), else the socket's. */
  const clientAddress = (res: Uws.HttpResponse, req: Uws.HttpRequest): string => {
    const forwarded = config.JETGATE_TRUST_FORWARDED_FOR ? req.getHeader("x-forwarded-for").split(",").pop()?.trim() : undefined;
    return forwarded || Buffer.from(res.getRemoteAddressAsText()).toString();
  };
  const ipLimit = config.JETGATE_MAX_CONNS_PER_IP;
  app.ws<SocketData>("/v1/ws", {
    maxPayloadLength: config.JETGATE_MAX_PAYLOAD * 2, // hard stop; the session answers 4413 above the configured limit
    idleTimeout: config.JETGATE_IDLE_TIMEOUT_S,
    maxBackpressure: config.JETGATE_MAX_BACKPRESSURE * 2, // the session closes 4408 at the configured limit first
    closeOnBackpressureLimit: true, // never silently drop a frame
    sendPingsAutomatically: true,
    upgrade: (res, req, context) => {
      if (!upgrades) {
        jsonAnswer(res, "503 Service Unavailable", { error: "draining: connect to another gateway" }, { "retry-after": "1" });
        return;
      }
      // a session's AUTH would wait on the silent dependency; connected devices keep their sessions
      const down = unavailable();
      if (down.length > 0) {
        ctx.metrics.refusedUpgrades.inc({ reason: "dependency" });
        jsonAnswer(res, "503 Service Unavailable", { error: `dependency not answering: ${down.join(", ")}` }, { "retry-after": "2" });
        return;
      }
      if (open >= maxConnections) {
        // every connection is a file: past the cap the rest are the reserve's (gateway/http/capacity.ts)
        ctx.metrics.refusedUpgrades.inc({ reason: "capacity" });
        jsonAnswer(res, "503 Service Unavailable", { error: `at capacity: ${maxConnections} connections (JETGATE_MAX_CONNECTIONS); connect to another gateway` }, { "retry-after": "5" }, true);
        return;
      }
      const ip = clientAddress(res, req);
      const fromIp = perIp.get(ip) ?? 0;
      if (ipLimit > 0 && fromIp >= ipLimit) {
        ctx.metrics.refusedUpgrades.inc({ reason: "per_ip" });
        jsonAnswer(res, "429 Too Many Requests", { error: "too many connections from this address (JETGATE_MAX_CONNS_PER_IP)" }, { "retry-after": "5" });
        return;
      }
      // counted from the upgrade, so a burst of handshakes cannot pass the limits before `open`
      perIp.set(ip, fromIp + 1);
      open++;
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
      const session = new Session(randomBytes(9).toString("base64url"), new UwsTransport(ws, data), ctx);
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
      open--;
      const n = (perIp.get(data.ip) ?? 1) - 1;
      if (n <= 0) perIp.delete(data.ip);
      else perIp.set(data.ip, n);
      data.session?.onClosed(code);
    },
  });

  const maxDispatchBody = maxDispatchBodyBytes(config.JETGATE_MAX_BODY_BYTES);
  for (const [path, batch] of [["/v1/dispatch", false], ["/v1/dispatch/batch", true]] as const) {
    app.post(path, (res, req) => {
      // headers are readable only inside this handler
      const auth = req.getHeader("authorization");
      const declared = req.getHeader("content-length");
      const client = clientAddress(res, req);
      handleDispatch(res, { auth, declared, maxBody: maxDispatchBody, batch, client, serviceAuth }, config, ctx, dispatcher);
    });
  }
  // public (no token): it says nothing about this deployment; serialized once, not per request
  const openapi = openApiJson();
  app.get("/v1/openapi.json", (res) => void res.writeHeader("content-type", "application/json").end(openapi));
  if (config.JETGATE_DEMO_DIR !== undefined && config.JETGATE_ENV === "development") serveDemo(app, config, config.JETGATE_DEMO_DIR);
  if (admin !== undefined) serveAdmin(app, config, admin, clientAddress);
  if (usersApi !== undefined) serveUsersApi(app, usersApi, clientAddress, serviceAuth);
  app.any("/*", (res, req) => {
    const what = `${req.getCaseSensitiveMethod()} ${req.getUrl()}`.slice(0, 200);
    jsonAnswer(res, "404 Not Found", { error: `no such route: ${what} (the API is described at GET /v1/openapi.json)` });
  });

  return new Promise((resolve, reject) => {
    app.listen(config.JETGATE_GATEWAY_HOST, config.JETGATE_GATEWAY_PORT, (first) => {
      if (first === false) {
        reject(new Error(`cannot listen on ${config.JETGATE_GATEWAY_HOST}:${config.JETGATE_GATEWAY_PORT}`));
        return;
      }
      const port = uws.us_socket_local_port(first as unknown as Uws.us_socket);
      let listenSocket: Uws.us_listen_socket | undefined = first;
      let stopped = false;
      const close = () => {
        if (listenSocket !== undefined) uws.us_listen_socket_close(listenSocket);
        listenSocket = undefined;
      };
      resolve({
        port,
        stopListening: () => {
          stopped = true;
          close();
        },
        refuseUpgrades: () => (upgrades = false),
        connections: () => open,
        pauseAccepting: close,
        resumeAccepting: () => {
          if (stopped || listenSocket !== undefined) return;
          // the same port: a load balancer's target does not move; a failure is tried again at the next look
          app.listen(config.JETGATE_GATEWAY_HOST, port, (s) => {
            if (s === false) return;
            if (stopped) uws.us_listen_socket_close(s);
            else listenSocket = s;
          });
        },
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

function reply(res: Uws.HttpResponse, aborted: () => boolean, status: string, body: DispatchAnswerJson, headers: Record<string, string> = {}): void {
  if (aborted()) return;
  res.cork(() => {
    res.writeStatus(status).writeHeader("content-type", "application/json");
    for (const [k, v] of Object.entries(headers)) res.writeHeader(k, v);
    res.end(JSON.stringify(body) + "\n");
  });
}

/** A JSON answer written at once (no await before it: the request is still in its handler); `close`: the connection with it, giving its file back. */
function jsonAnswer(res: Uws.HttpResponse, status: string, body: { error: string }, headers: Record<string, string> = {}, close = false): void {
  res.cork(() => {
    res.writeStatus(status).writeHeader("content-type", "application/json");
    for (const [k, v] of Object.entries(headers)) res.writeHeader(k, v);
    res.end(`${JSON.stringify(body)}\n`, close);
  });
}

/** A dispatch's HTTP answer; its body is one of the shapes docs/openapi.json documents. */
interface Answer {
  status: string;
  body: DispatchAnswerJson;
  headers?: Record<string, string>;
}

function handleDispatch(
  res: Uws.HttpResponse,
  req: { auth: string; declared: string; maxBody: number; batch: boolean; client: string; serviceAuth: ServiceAuth },
  config: Config,
  ctx: SessionPorts,
  dispatcher: Dispatcher,
): void {
  let aborted = false;
  res.onAborted(() => (aborted = true));
  const admission = req.serviceAuth.admit(req.auth, req.client, "dispatch", Date.now());
  const done = (status: string, body: DispatchAnswerJson, headers?: Record<string, string>) => {
    ctx.metrics.dispatchRequests.inc({ status: status.slice(0, 3), token: admission.token });
    reply(res, () => aborted, status, body, headers);
  };
  if (!admission.ok) {
    done(admission.status, { error: admission.error, ...(admission.scope !== undefined ? { scope: admission.scope } : {}) }, admission.retryAfterS !== undefined ? { "retry-after": String(admission.retryAfterS) } : undefined);
    return;
  }
  const tooLarge: DispatchErrorJson = { error: `request body over ${req.maxBody} bytes, the largest valid dispatch (docs/security.md)` };
  if (req.declared !== "" && Number(req.declared) > req.maxBody) {
    done("413 Payload Too Large", tooLarge);
    return;
  }
  // Every byte passes the shape guard as it arrives: a body that cannot be a request is refused at
  // the byte that shows it, and JSON.parse only ever sees a bounded document.
  const guard = new DispatchShapeGuard(req.batch ? BATCH_SHAPE : SINGLE_SHAPE);
  const chunks: Buffer[] = [];
  let size = 0;
  let answered = false;
  const refuse = (status: string, body: DispatchErrorJson) => {
    answered = true;
    chunks.length = 0;
    done(status, body);
  };
  res.onData((chunk, isLast) => {
    if (answered) return;
    size += chunk.byteLength;
    if (size > req.maxBody) return refuse("413 Payload Too Large", tooLarge);
    const bytes = new Uint8Array(chunk);
    const bad = guard.feed(bytes);
    if (bad !== undefined) return refuse("400 Bad Request", { error: bad, field: bad.startsWith("recipients") ? "recipients" : undefined });
    chunks.push(Buffer.from(bytes)); // copies: uWS reuses the chunk's memory after this call
    if (!isLast) return;
    answered = true;
    const raw = Buffer.concat(chunks);
    chunks.length = 0;
    parseTurns.run(() => {
      const parsed = req.batch ? parseDispatchBatch(raw) : parseDispatchBody(raw);
      if (!parsed.ok) return done("400 Bad Request", { error: parsed.error, field: parsed.field });
      const appends = appendedBytes("requests" in parsed ? parsed.requests : [parsed.request]);
      if (appends > config.JETGATE_DISPATCH_MAX_BYTES) {
        return done("413 Payload Too Large", {
          error: `recipients: the request appends ${appends} bytes (recipients x body bytes${req.batch ? ", over all its dispatches" : ""}), over JETGATE_DISPATCH_MAX_BYTES (${config.JETGATE_DISPATCH_MAX_BYTES}): split it; nothing was appended`,
          field: req.batch ? "dispatches" : "recipients",
        });
      }
      void ("requests" in parsed ? dispatchBatch(parsed.requests, dispatcher) : dispatchRequest(parsed.request, dispatcher)).then(
        (r) => done(r.status, r.body, r.headers),
        (err: unknown) => {
          ctx.log.error({ err }, "dispatch failed");
          done("500 Internal Server Error", { error: "internal error" });
        },
      );
    });
  });
}

/**
 * One parse per turn of the event loop: bodies that complete together (one poll can deliver
 * many) are parsed in turns with device I/O between them, so a device waits for at most one
 * request's parse (~10 ms at the byte limit), never for all of them.
 */
const parseTurns = {
  queue: [] as (() => void)[],
  running: false,
  run(job: () => void): void {
    this.queue.push(job);
    if (this.running) return;
    this.running = true;
    setImmediate(() => this.next());
  },
  next(): void {
    this.queue.shift()?.();
    if (this.queue.length > 0) setImmediate(() => this.next());
    else this.running = false;
  },
};

/** What dispatching `requests` appends: each body once per recipient. */
function appendedBytes(requests: readonly ParsedDispatch[]): number {
  return requests.reduce((n, r) => n + r.recipients.length * r.body.byteLength, 0);
}

/** `seq` is the mailbox_seq the device sees, as a decimal string (it passes 2^53 at epoch 32); `offset` the stream offset. */
function resultsJson(results: DispatchResult[]): DispatchResultJson[] {
  return results.map((r) => ("error" in r ? r : { user: r.user, shard: r.shard, seq: r.seq.toString(), offset: r.offset, duplicate: r.duplicate }));
}

/** 200 when every recipient's entry was appended; 502 with each recipient's result when some failed. */
function resultsAnswer(all: DispatchResult[][], body: Answer["body"]): Answer {
  return { status: all.some((results) => results.some((r) => "error" in r)) ? "502 Bad Gateway" : "200 OK", body };
}

/**
 * What the Dispatcher refused, with nothing published: bad input (400), or NATS away (503 with
 * Retry-After); anything else is a fault.
 */
function refused(err: unknown): Answer {
  if (err instanceof DispatchValidationError) return { status: "400 Bad Request", body: { error: err.message, field: err.field } };
  if (err instanceof DispatchUnavailableError) {
    return { status: "503 Service Unavailable", body: { error: err.message, code: "DISPATCH_UNAVAILABLE" }, headers: { "retry-after": String(Math.ceil(err.retryAfterMs / 1000)) } };
  }
  throw err;
}

async function dispatchRequest(request: ParsedDispatch, dispatcher: Dispatcher): Promise<Answer> {
  try {
    const results = await dispatcher.dispatch(request);
    return resultsAnswer([results], { results: resultsJson(results) });
  } catch (err) {
    return refused(err);
  }
}

/** A batch: the Dispatcher validates every dispatch before it appends any (`dispatchMany`). */
async function dispatchBatch(requests: ParsedDispatch[], dispatcher: Dispatcher): Promise<Answer> {
  try {
    const all = await dispatcher.dispatchMany(requests);
    return resultsAnswer(all, { dispatches: all.map((results) => ({ results: resultsJson(results) })) });
  } catch (err) {
    return refused(err);
  }
}

