/**
 * The OpenAPI 3.1 document of the gateway's HTTP API, built from the zod schemas the server
 * validates its requests with and builds its answers by (`z.toJSONSchema`), so the two cannot
 * drift apart. Served at `GET /v1/openapi.json`; `npm run openapi` writes docs/openapi.json, and
 * test/unit/openapi.test.ts fails when that copy is stale.
 */
import { z } from "zod";
import { MAX_RECIPIENTS, SCOPE_ROUTES, SERVICE_SCOPES } from "../../protocol/index.js";
import { ReadyzSchema } from "../../protocol/io/index.js";
import { ADMIN_OPENAPI } from "./admin-openapi.js";
import { forbidden, inlineSchema, jsonContent, ref, RIGHT_TOKEN_SERVED, UNAUTHORIZED, type ComponentSchema, type Json, type OpenApiExtension, type PathItem } from "./openapi-parts.js";
import { USERS_OPENAPI } from "./users-openapi.js";
import {
  DispatchAnswerSchema,
  DispatchBatchAnswerSchema,
  DispatchBatchSchema,
  DispatchBodySchema,
  DispatchErrorSchema,
  DispatchUnavailableSchema,
  MAX_BATCH_DISPATCHES,
  maxDispatchBodyBytes,
} from "./dispatch-body.js";

/** Extensions every served and written document includes (the admin API's goes here). */
export const OPENAPI_EXTENSIONS: readonly OpenApiExtension[] = [USERS_OPENAPI, ADMIN_OPENAPI];

const SCHEMAS: Record<string, ComponentSchema> = {
  DispatchRequest: { schema: DispatchBodySchema, io: "input" },
  DispatchBatchRequest: { schema: DispatchBatchSchema, io: "input" },
  DispatchAnswer: { schema: DispatchAnswerSchema, io: "output" },
  DispatchBatchAnswer: { schema: DispatchBatchAnswerSchema, io: "output" },
  DispatchError: { schema: DispatchErrorSchema, io: "output" },
  DispatchUnavailable: { schema: DispatchUnavailableSchema, io: "output" },
  Readiness: { schema: ReadyzSchema, io: "output" },
};

/** Named schemas, one zod registry per direction, so they refer to each other by `$ref`. */
function componentSchemas(named: Record<string, ComponentSchema>): Record<string, Json> {
  const out: Record<string, Json> = {};
  for (const io of ["input", "output"] as const) {
    const registry = z.registry<{ id: string }>();
    for (const [id, c] of Object.entries(named)) if (c.io === io) registry.add(c.schema, { id });
    const { schemas } = z.toJSONSchema(registry, { io, uri: (id) => ref(id).$ref });
    // zod's `$id` is the ref with a fragment, which 2020-12 forbids; the component's key names it
    for (const [id, s] of Object.entries(schemas)) {
      const { $schema: _dialect, $id: _id, ...rest } = s;
      out[id] = rest;
    }
  }
  return out;
}

const text = inlineSchema(z.string());

/** One per 400 body naming the field; the server answers a JSON body for every status. */
const error = (description: string) => ({ description, ...jsonContent(ref("DispatchError")) });

const EXAMPLE = { dispatch_id: "d-0001", message_id: "m-0001", lane: "default", recipients: ["alice", "bob"], body: "hello" };
const BATCH_EXAMPLE = { dispatches: [EXAMPLE, { dispatch_id: "d-0002", message_id: "m-0002", lane: "default", recipients: ["alice"], body_b64: "aGk=" }] };

function dispatchOperation(batch: boolean): Json {
  const fieldPath = batch ? "`dispatches.<i>.<field>`" : "the field (`lane`, `recipients.3`)";
  return {
    operationId: batch ? "dispatchBatch" : "dispatch",
    summary: batch ? "Append many dispatches in one request" : "Append one entry to each recipient's mailbox",
    description: batch
      ? `At most ${MAX_BATCH_DISPATCHES} dispatches and ${MAX_RECIPIENTS} recipients over all of them. Every dispatch is validated before any is appended: one bad dispatch refuses the whole batch. A user's entries are appended in array order.`
      : "The body is read as JSON whatever its Content-Type.",
    security: [{ serviceToken: ["dispatch"] }],
    "x-jetgate-scope": "dispatch",
    requestBody: { required: true, ...jsonContent(ref(batch ? "DispatchBatchRequest" : "DispatchRequest"), batch ? BATCH_EXAMPLE : EXAMPLE) },
    responses: {
      "200": { description: "Every recipient's entry was appended.", ...jsonContent(ref(batch ? "DispatchBatchAnswer" : "DispatchAnswer")) },
      "400": error(
        `Bad input, nothing published: \`error\` is \`<field>: <reason>\` and \`field\` names ${fieldPath}. Also as soon as the bytes show a shape no request has (nested too deep, more than 8 fields, more than ${MAX_RECIPIENTS} recipients), and for a body that is not JSON (no \`field\`).`,
      ),
      "401": error(UNAUTHORIZED),
      "403": error(forbidden("dispatch")),
      "429": {
        ...error(`A wrong bearer token from a client address that sent too many (10, then one every 6 s, counted with the users API's): try again after Retry-After seconds. Nothing was read or appended. ${RIGHT_TOKEN_SERVED}`),
        headers: { "Retry-After": { description: "Seconds to wait.", schema: { type: "integer", minimum: 1 } } },
      },
      "413": error(
        `Nothing appended. Over the largest valid request: ${maxDispatchBodyBytes(0)} + 6 x JETGATE_MAX_BODY_BYTES bytes, by Content-Length before reading or counted as the body arrives; or appending more than JETGATE_DISPATCH_MAX_BYTES (16 MiB by default): recipients x body bytes${batch ? ", summed over the dispatches" : ""}. Split the request.`,
      ),
      "500": error("Unexpected failure: whether anything was appended is unknown; retrying with the same dispatch_id is safe."),
      "502": {
        description:
          "Some recipients have `error` in their result; every other recipient's entry was appended. `DISPATCH_REJECTED`: JetStream refused the entry, it was not appended. `DISPATCH_TIMEOUT`: no acknowledgement after every attempt, so it is unknown whether the entry was appended; send the same dispatch again (same dispatch_id): a recipient already appended then answers `duplicate: true` with its seq, and nothing is appended twice.",
        ...jsonContent(ref(batch ? "DispatchBatchAnswer" : "DispatchAnswer")),
      },
      "503": {
        description:
          "NATS is down (lost and reconnecting, or closed), or the gateway's dispatch queue has no room for the whole request (JETGATE_DISPATCH_QUEUE_BYTES: NATS slow or stalled, or many large requests at once): nothing was published, `code` is DISPATCH_UNAVAILABLE, `error` says which; retry after Retry-After seconds with the same dispatch_id. Bad input is still 400 first. Also, without `code` or Retry-After, when neither JETGATE_SERVICE_TOKEN nor JETGATE_SERVICE_TOKENS_FILE is set (the API is off).",
        headers: { "Retry-After": { description: "Seconds to wait (2); only with DISPATCH_UNAVAILABLE.", schema: { type: "integer", minimum: 0 } } },
        ...jsonContent(ref("DispatchUnavailable")),
      },
    },
  };
}

/** The operations listener (health and metrics), a port of its own. */
const OPS_SERVERS = [
  {
    url: "http://{host}:{port}",
    description: "The operations port, JETGATE_METRICS_HOST:JETGATE_GATEWAY_METRICS_PORT (loopback by default).",
    variables: { host: { default: "127.0.0.1" }, port: { default: "9090" } },
  },
];

const PATHS: Record<string, PathItem> = {
  "/v1/dispatch": { post: dispatchOperation(false) },
  "/v1/dispatch/batch": { post: dispatchOperation(true) },
  "/v1/openapi.json": {
    get: {
      operationId: "openapi",
      summary: "This document",
      security: [],
      responses: { "200": { description: "The OpenAPI document.", ...jsonContent(ref("OpenApiDocument")) } },
    },
  },
  "/healthz": {
    servers: OPS_SERVERS,
    get: { operationId: "healthz", summary: "The process runs", security: [], responses: { "200": { description: "`ok`", ...jsonContent(text, undefined, "text/plain") } } },
  },
  "/readyz": {
    servers: OPS_SERVERS,
    get: {
      operationId: "readyz",
      summary: "Ready for devices and dispatches",
      security: [],
      responses: {
        "200": { description: "Ready.", ...jsonContent(ref("Readiness")) },
        "503": { description: "Not ready: `problems` names what (a dependency that has not answered a probe within JETGATE_DEPENDENCY_TIMEOUT_MS, no registry, draining).", ...jsonContent(ref("Readiness")) },
      },
    },
  },
  "/metrics": {
    servers: OPS_SERVERS,
    get: {
      operationId: "metrics",
      summary: "Prometheus metrics",
      security: [],
      responses: {
        "200": { description: "Prometheus text exposition format.", ...jsonContent(text, undefined, "text/plain") },
        "500": { description: "Collecting failed.", ...jsonContent(text, undefined, "text/plain") },
      },
    },
  },
};

/** What `GET /v1/openapi.json` answers, as far as a client relies on it. */
export const OpenApiDocumentSchema = z.looseObject({
  openapi: z.string().regex(/^3\.1\.\d+$/),
  info: z.looseObject({ title: z.string(), version: z.string() }),
  paths: z.record(z.string(), z.looseObject({})),
});

export type OpenApiDocument = z.output<typeof OpenApiDocumentSchema>;

/** The document: jetgate's own paths and schemas, then each extension's (a name used twice throws). */
export function buildOpenApi(extensions: readonly OpenApiExtension[] = []): OpenApiDocument {
  const paths: Record<string, PathItem> = { ...PATHS };
  const schemas: Record<string, ComponentSchema> = { ...SCHEMAS, OpenApiDocument: { schema: OpenApiDocumentSchema, io: "output" } };
  for (const ext of extensions) {
    for (const [path, item] of Object.entries(ext.paths)) {
      if (path in paths) throw new Error(`OpenAPI: path ${path} is documented twice`);
      paths[path] = item;
    }
    for (const [name, s] of Object.entries(ext.schemas ?? {})) {
      if (name in schemas) throw new Error(`OpenAPI: schema ${name} is defined twice`);
      schemas[name] = s;
    }
  }
  return {
    openapi: "3.1.0",
    info: {
      title: "jetgate gateway HTTP API",
      version: "v1",
      description: "Backends append entries and ask about users (end sessions, revoke tokens, presence, mailbox position) over the device port; health and metrics answer on the operations port. Devices use the WebSocket protocol on GET /v1/ws (docs/protocol.md), not described here.",
    },
    servers: [
      {
        url: "http://{host}:{port}",
        description: "The device port, JETGATE_GATEWAY_HOST:JETGATE_GATEWAY_PORT.",
        variables: { host: { default: "127.0.0.1" }, port: { default: "8080" } },
      },
    ],
    paths,
    components: {
      schemas: componentSchemas(schemas),
      securitySchemes: {
        serviceToken: {
          type: "http",
          scheme: "bearer",
          description: `A service token: JETGATE_SERVICE_TOKEN (every scope) or one named in JETGATE_SERVICE_TOKENS_FILE with its scopes. Each operation lists the scope it needs in its security requirement and in \`x-jetgate-scope\`: ${SERVICE_SCOPES.map((s) => `\`${s}\` (${SCOPE_ROUTES[s]})`).join(", ")}. Without it: 403 naming the scope.`,
        },
        adminToken: { type: "http", scheme: "bearer", description: "JETGATE_ADMIN_TOKEN (the operator console)" },
      },
    },
  };
}

/** The document with OPENAPI_EXTENSIONS. */
export const openApiDocument = (): OpenApiDocument => buildOpenApi(OPENAPI_EXTENSIONS);

/** As served and as written to docs/openapi.json, byte for byte. */
export const openApiJson = (): string => JSON.stringify(openApiDocument(), null, 2) + "\n";
