/**
 * The OpenAPI document against a running gateway: GET /v1/openapi.json serves docs/openapi.json,
 * its schema parts are valid 2020-12 JSON Schema, and for every route a good and a bad request get
 * an answer whose status the document lists for that path and method, with a body (and headers)
 * matching what it documents, checked by ajv. Request bodies are checked against the documented
 * request schema too, so the document and the server agree on what is valid.
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Ajv2020, type ValidateFunction } from "ajv/dist/2020.js";
import { startStack, spawnGateway } from "../harness/stack.js";
import { waitFor } from "../harness/wait.js";
import { OPENAPI_FILE } from "../../scripts/openapi.js";
import { serviceTokenHash } from "../../protocol/index.js";

const TOKEN = "openapi-secret";
/** A token of the tokens file that may only read mailboxes: every other route answers it 403. */
const READER = "openapi-reader-Wx9Lm3Rv8Bz1Hc6Jd0Fs5Yg";
const tokensDir = mkdtempSync(join(tmpdir(), "jetgate-openapi-"));
writeFileSync(join(tokensDir, "tokens.yaml"), `tokens:\n  - name: reader\n    sha256: "${serviceTokenHash(READER)}"\n    scopes: [read]\n`);
const stack = await startStack({ env: { JETGATE_SERVICE_TOKEN: TOKEN }, worker: false, gateway: { JETGATE_SERVICE_TOKENS_FILE: join(tokensDir, "tokens.yaml") } });
after(async () => {
  await stack.dispose();
  rmSync(tokensDir, { recursive: true, force: true });
});
const gateway = stack.gateway!;

type Json = Record<string, unknown>;
interface Media {
  schema: Json;
  example?: unknown;
}
interface Operation {
  requestBody?: { content: Record<string, Media> };
  responses: Record<string, { content?: Record<string, Media>; headers?: Record<string, { schema: Json }> }>;
}
const text = readFileSync(OPENAPI_FILE, "utf8");
const doc = JSON.parse(text) as { openapi: string; paths: Record<string, Record<string, Operation>>; components: { schemas: Record<string, Json> } };

// strict, except strictRequired: `oneOf: [{required: ["body"]}, ...]` names properties defined beside it
const ajv = new Ajv2020({ strictTypes: true, strictTuples: true, allErrors: true });
// the document's top-level keywords are OpenAPI's; its schema parts are reached by JSON pointer
ajv.addVocabulary(["openapi", "info", "servers", "paths", "components"]);
ajv.addSchema(doc, "openapi.json");
const compiled = new Map<string, ValidateFunction>();
const pointer = (...parts: string[]) => `openapi.json#/${parts.map((p) => p.replaceAll("~", "~0").replaceAll("/", "~1")).join("/")}`;
function validator(ptr: string): ValidateFunction {
  let v = compiled.get(ptr);
  if (v === undefined) compiled.set(ptr, (v = ajv.compile({ $ref: ptr })));
  return v;
}
function assertValid(ptr: string, value: unknown, what: string): void {
  const v = validator(ptr);
  assert.ok(v(value), `${what}: ${ajv.errorsText(v.errors)}\n${JSON.stringify(value).slice(0, 500)}`);
}

/** Every schema object of the document, as a JSON pointer. */
function schemaPointers(): string[] {
  const out = Object.keys(doc.components.schemas).map((n) => pointer("components", "schemas", n));
  for (const [path, item] of Object.entries(doc.paths)) {
    for (const [method, op] of Object.entries(item)) {
      if (method === "servers") continue;
      for (const type of Object.keys(op.requestBody?.content ?? {})) out.push(pointer("paths", path, method, "requestBody", "content", type, "schema"));
      for (const [status, r] of Object.entries(op.responses)) {
        for (const type of Object.keys(r.content ?? {})) out.push(pointer("paths", path, method, "responses", status, "content", type, "schema"));
        for (const h of Object.keys(r.headers ?? {})) out.push(pointer("paths", path, method, "responses", status, "headers", h, "schema"));
      }
    }
  }
  return out;
}

/** Asserts the answer is documented for this path and method, and returns its body. */
async function conforms(method: "get" | "post", path: string, res: Response): Promise<unknown> {
  const op = doc.paths[path]?.[method];
  assert.ok(op, `${method.toUpperCase()} ${path} is documented`);
  const documented = op.responses[String(res.status)];
  assert.ok(documented, `${method.toUpperCase()} ${path}: status ${res.status} is documented`);
  const type = (res.headers.get("content-type") ?? "").split(";")[0]!.trim();
  assert.ok(documented.content?.[type], `${method.toUpperCase()} ${path} ${res.status}: content type ${type} is documented`);
  const raw = await res.text();
  const body: unknown = type === "application/json" ? JSON.parse(raw) : raw;
  assertValid(pointer("paths", path, method, "responses", String(res.status), "content", type, "schema"), body, `${method.toUpperCase()} ${path} ${res.status}`);
  for (const [name, h] of Object.entries(documented.headers ?? {})) {
    const value = res.headers.get(name);
    if (value === null) continue;
    const typed = (h.schema.type === "integer" ? Number(value) : value) as unknown;
    assertValid(pointer("paths", path, method, "responses", String(res.status), "headers", name, "schema"), typed, `${path} ${res.status} header ${name}`);
  }
  return body;
}

const device = (path: string) => `http://127.0.0.1:${gateway.httpPort}${path}`;
const ops = (path: string) => `http://127.0.0.1:${gateway.opsPort}${path}`;
function post(path: string, body: string, headers: Record<string, string> = {}, port = gateway.httpPort): Promise<Response> {
  return fetch(`http://127.0.0.1:${port}${path}`, {
    method: "POST",
    headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json", ...headers },
    body,
  });
}
const requestSchema = (path: string) => pointer("paths", path, "post", "requestBody", "content", "application/json", "schema");
const example = (path: string) => doc.paths[path]!.post!.requestBody!.content["application/json"]!.example as Json;

test("openapi - GET /v1/openapi.json is OpenAPI 3.1, equals docs/openapi.json, and its schema parts are valid JSON Schema", async () => {
  const res = await fetch(device("/v1/openapi.json"));
  assert.equal(res.status, 200);
  const served = await conforms("get", "/v1/openapi.json", res.clone());
  assert.equal(await res.text(), text, "the served document is docs/openapi.json byte for byte");
  assert.match((served as { openapi: string }).openapi, /^3\.1\.\d+$/);
  const pointers = schemaPointers();
  assert.ok(pointers.length > 30, `${pointers.length} schemas`);
  for (const ptr of pointers) {
    const schema = ptr.slice("openapi.json#/".length).split("/").reduce<unknown>((o, k) => (o as Json)[k.replaceAll("~1", "/").replaceAll("~0", "~")], doc);
    assert.ok(ajv.validateSchema(schema as Json), `${ptr}: ${ajv.errorsText(ajv.errors)}`);
    validator(ptr); // compiles: every $ref resolves, strict keywords
  }
  // public, and nothing else is served there
  assert.equal((await fetch(device("/v1/openapi.json"), { headers: { authorization: "Bearer wrong" } })).status, 200);
  const other = await post("/v1/openapi.json", "{}");
  assert.equal(other.status, 404);
  assert.equal(doc.paths["/v1/openapi.json"]!.post, undefined);
});

test("openapi - POST /v1/dispatch: the documented example and good requests are 200; bad ones 400/401/413 as documented", async () => {
  const good = example("/v1/dispatch");
  const cases: { name: string; body: string; headers?: Record<string, string>; status: number; schemaValid?: boolean; field?: string }[] = [
    { name: "the document's example", body: JSON.stringify(good), status: 200, schemaValid: true },
    { name: "body_b64", body: JSON.stringify({ dispatch_id: "oa-b64", message_id: "oa-b64", lane: "default", recipients: ["carol"], body_b64: "aGk=" }), status: 200, schemaValid: true },
    // the Content-Type is not checked: the body is read as JSON (documented in the operation)
    { name: "text/plain content type", body: JSON.stringify({ ...good, dispatch_id: "oa-text" }), headers: { "content-type": "text/plain" }, status: 200, schemaValid: true },
    { name: "missing lane", body: JSON.stringify({ ...good, lane: undefined }), status: 400, schemaValid: false, field: "lane" },
    { name: "bad recipient id", body: JSON.stringify({ ...good, recipients: ["ok", "no.dots"] }), status: 400, schemaValid: false, field: "recipients.1" },
    { name: "both bodies", body: JSON.stringify({ ...good, body_b64: "aGk=" }), status: 400, schemaValid: false },
    { name: "unknown field", body: JSON.stringify({ ...good, extra: 1 }), status: 400, schemaValid: false },
    // a rule of this deployment, not of the document: any well-formed lane passes the schema
    { name: "unknown lane", body: JSON.stringify({ ...good, lane: "nope" }), status: 400, schemaValid: true, field: "lane" },
    { name: "not JSON", body: "{nope", headers: { "content-type": "text/plain" }, status: 400 },
    { name: "nested too deep", body: "[[[1]]]", status: 400 },
    { name: "wrong token", body: JSON.stringify(good), headers: { authorization: "Bearer wrong" }, status: 401, schemaValid: true },
    { name: "no token", body: JSON.stringify(good), headers: { authorization: "" }, status: 401, schemaValid: true },
    { name: "a token without the scope dispatch", body: JSON.stringify(good), headers: { authorization: `Bearer ${READER}` }, status: 403, schemaValid: true },
    { name: "over the largest valid request", body: "x".repeat(1_300_000), status: 413 },
  ];
  for (const c of cases) {
    if (c.schemaValid !== undefined) {
      assert.equal(validator(requestSchema("/v1/dispatch"))(JSON.parse(c.body)), c.schemaValid, `${c.name}: the documented request schema says ${!c.schemaValid}`);
    }
    const res = await post("/v1/dispatch", c.body, c.headers);
    assert.equal(res.status, c.status, `${c.name}: ${res.status}`);
    const body = (await conforms("post", "/v1/dispatch", res)) as { field?: string; results?: unknown[] };
    if (c.field !== undefined) assert.equal(body.field, c.field, c.name);
    if (c.status === 200) assert.ok(body.results!.length > 0, c.name);
  }
});

test("openapi - POST /v1/dispatch/batch: the documented example is 200; a bad element, an empty batch, a wrong token as documented", async () => {
  const good = example("/v1/dispatch/batch") as { dispatches: Json[] };
  const bad = { dispatches: [good.dispatches[0], { ...good.dispatches[1], recipients: ["alice", "no.dots"] }] };
  const cases: { name: string; body: unknown; token?: string; status: number; schemaValid: boolean; field?: string }[] = [
    { name: "the document's example", body: good, status: 200, schemaValid: true },
    { name: "a bad element", body: bad, status: 400, schemaValid: false, field: "dispatches.1.recipients.1" },
    { name: "an element missing a field", body: { dispatches: [{ ...good.dispatches[0], message_id: undefined }] }, status: 400, schemaValid: false, field: "dispatches.0.message_id" },
    { name: "empty", body: { dispatches: [] }, status: 400, schemaValid: false, field: "dispatches" },
    { name: "wrong token", body: good, token: "wrong", status: 401, schemaValid: true },
    { name: "a token without the scope dispatch", body: good, token: READER, status: 403, schemaValid: true },
  ];
  for (const c of cases) {
    const json = JSON.stringify(c.body);
    assert.equal(validator(requestSchema("/v1/dispatch/batch"))(JSON.parse(json)), c.schemaValid, `${c.name}: the documented request schema says ${!c.schemaValid}`);
    const res = await post("/v1/dispatch/batch", json, { authorization: `Bearer ${c.token ?? TOKEN}` });
    assert.equal(res.status, c.status, c.name);
    const body = (await conforms("post", "/v1/dispatch/batch", res)) as { field?: string; dispatches?: unknown[] };
    if (c.field !== undefined) assert.equal(body.field, c.field, c.name);
    if (c.status === 200) assert.equal(body.dispatches!.length, good.dispatches.length);
  }
});

test("openapi - the users API: each route's documented example or a good request is 200, bad ones 400/401/413 as documented", async () => {
  const get = (path: string, token = TOKEN) => fetch(device(path), { headers: { authorization: `Bearer ${token}` } });
  const cases: { method: "get" | "post"; path: string; url: string; body?: string; headers?: Record<string, string>; status: number; schemaValid?: boolean }[] = [
    { method: "post", path: "/v1/users/{user}/disconnect", url: "/v1/users/oa-user/disconnect", body: JSON.stringify(example("/v1/users/{user}/disconnect")), status: 200, schemaValid: true },
    { method: "post", path: "/v1/users/{user}/disconnect", url: "/v1/users/oa-user/disconnect", body: JSON.stringify({ mode: "later" }), status: 400, schemaValid: false },
    { method: "post", path: "/v1/users/{user}/disconnect", url: "/v1/users/no.dots/disconnect", body: JSON.stringify({ mode: "reconnect" }), status: 400, schemaValid: true },
    { method: "post", path: "/v1/users/{user}/revoke", url: "/v1/users/oa-user/revoke", body: JSON.stringify(example("/v1/users/{user}/revoke")), status: 200, schemaValid: true },
    { method: "post", path: "/v1/users/{user}/revoke", url: "/v1/users/oa-user/revoke", body: JSON.stringify({ issued_before: -1 }), status: 400, schemaValid: false },
    { method: "post", path: "/v1/users/{user}/revoke", url: "/v1/users/oa-user/revoke", body: "{}", headers: { authorization: "Bearer wrong" }, status: 401, schemaValid: true },
    { method: "post", path: "/v1/presence", url: "/v1/presence", body: JSON.stringify(example("/v1/presence")), status: 200, schemaValid: true },
    { method: "post", path: "/v1/presence", url: "/v1/presence", body: JSON.stringify({ users: [] }), status: 400, schemaValid: false },
    { method: "post", path: "/v1/presence", url: "/v1/presence", body: "x".repeat(20_000), status: 413 },
    { method: "get", path: "/v1/users/{user}/presence", url: "/v1/users/oa-user/presence", status: 200 },
    { method: "get", path: "/v1/users/{user}/mailbox", url: "/v1/users/oa-user/mailbox", status: 200 },
    { method: "get", path: "/v1/users/{user}/mailbox", url: "/v1/users/no.dots/mailbox", status: 400 },
    { method: "get", path: "/v1/users/{user}/entries", url: "/v1/users/oa-user/entries?limit=5", status: 200 },
    { method: "get", path: "/v1/users/{user}/entries", url: "/v1/users/oa-user/entries?limit=0", status: 400 },
    { method: "get", path: "/v1/users/{user}/entries", url: "/v1/users/oa-user/entries?next=garbage", status: 400 },
  ];
  for (const c of cases) {
    const what = `${c.method.toUpperCase()} ${c.url} ${c.body?.slice(0, 40) ?? ""}`;
    if (c.schemaValid !== undefined) assert.equal(validator(pointer("paths", c.path, "post", "requestBody", "content", "application/json", "schema"))(JSON.parse(c.body!)), c.schemaValid, `${what}: the documented request schema`);
    const res = c.method === "get" ? await get(c.url) : await post(c.url, c.body!, c.headers);
    assert.equal(res.status, c.status, what);
    await conforms(c.method, c.path, res);
  }
  const wrong = await get("/v1/users/oa-user/mailbox", "wrong");
  assert.equal(wrong.status, 401);
  await conforms("get", "/v1/users/{user}/mailbox", wrong);
  // a token without the route's scope: 403 on every route but the mailbox reads, as documented
  const reads = new Set(["/v1/users/{user}/mailbox", "/v1/users/{user}/entries"]);
  for (const c of cases.filter((x) => x.status === 200)) {
    const res = c.method === "get" ? await get(c.url, READER) : await post(c.url, c.body!, { authorization: `Bearer ${READER}` });
    assert.equal(res.status, reads.has(c.path) ? 200 : 403, `${c.method.toUpperCase()} ${c.url} with the reader`);
    const body = (await conforms(c.method, c.path, res)) as { scope?: string };
    const documented = doc.paths[c.path]![c.method] as unknown as { security: { serviceToken: string[] }[]; "x-jetgate-scope": string };
    assert.deepEqual(documented.security, [{ serviceToken: [documented["x-jetgate-scope"]] }], `${c.path}: the scope in its security requirement`);
    if (res.status === 403) assert.equal(body.scope, documented["x-jetgate-scope"], `${c.path}: the 403 names the documented scope`);
  }
});

test("openapi - the operations port: /healthz, /readyz, /metrics as documented; other methods are not", async () => {
  for (const path of ["/healthz", "/readyz", "/metrics"]) {
    const res = await fetch(ops(path));
    assert.equal(res.status, 200, path);
    const body = await conforms("get", path, res);
    if (path === "/readyz") assert.deepEqual(body, { ready: true, problems: [] });
    // the bad request: a method the document does not list
    assert.equal(doc.paths[path]!.post, undefined);
    assert.equal((await fetch(ops(path), { method: "POST" })).status, 405, path);
    // and not on the device port
    assert.equal((await fetch(device(path))).status, 404, path);
  }
});

test("openapi - the console's routes: off (404), the page, the state with and without the admin token, as documented", async () => {
  const url = (port: number, path: string) => `http://127.0.0.1:${port}${path}`;
  for (const path of ["/admin/", "/admin/api/state"]) await conforms("get", path, await fetch(url(gateway.httpPort, path)));
  const admin = await spawnGateway(stack.infra.env, { JETGATE_ADMIN_TOKEN: "openapi-admin-token-0123" });
  try {
    const page = await fetch(url(admin.httpPort, "/admin/"));
    assert.equal(page.status, 200);
    await conforms("get", "/admin/", page);
    const wrong = await fetch(url(admin.httpPort, "/admin/api/state"), { headers: { authorization: "Bearer nope" } });
    assert.equal(wrong.status, 401);
    await conforms("get", "/admin/api/state", wrong);
    const good = await fetch(url(admin.httpPort, "/admin/api/state"), { headers: { authorization: "Bearer openapi-admin-token-0123" } });
    assert.equal(good.status, 200);
    const body = (await conforms("get", "/admin/api/state", good)) as { processes: unknown[] };
    assert.ok(body.processes.length >= 1, "at least this gateway answered");
  } finally {
    await admin.kill();
  }
});

test("openapi - 503 as documented: the API off without a service token; NATS down, with Retry-After", { timeout: 120_000 }, async () => {
  const { JETGATE_SERVICE_TOKEN: _token, ...noToken } = stack.infra.env;
  const off = await spawnGateway(noToken);
  try {
    const res = await post("/v1/dispatch", JSON.stringify(example("/v1/dispatch")), {}, off.httpPort);
    assert.equal(res.status, 503);
    assert.equal(res.headers.get("retry-after"), null);
    assert.equal(((await conforms("post", "/v1/dispatch", res)) as { code?: string }).code, undefined);
  } finally {
    await off.kill();
  }

  await stack.infra.nats.kill();
  try {
    const refused = await waitFor("503 while NATS is down", async () => {
      const r = await post("/v1/dispatch", JSON.stringify(example("/v1/dispatch")));
      return r.status === 503 ? r : undefined;
    }, { timeoutMs: 20_000, intervalMs: 100 });
    assert.equal(refused.headers.get("retry-after"), "2");
    assert.equal(((await conforms("post", "/v1/dispatch", refused)) as { code?: string }).code, "DISPATCH_UNAVAILABLE");
    const batch = await post("/v1/dispatch/batch", JSON.stringify(example("/v1/dispatch/batch")));
    assert.equal(batch.status, 503);
    assert.equal(batch.headers.get("retry-after"), "2");
    await conforms("post", "/v1/dispatch/batch", batch);
    const ready = await waitFor("/readyz says nats", async () => {
      const r = await fetch(ops("/readyz"));
      return r.status === 503 ? r : undefined;
    }, { timeoutMs: 20_000, intervalMs: 200 });
    assert.ok(((await conforms("get", "/readyz", ready)) as { problems: string[] }).problems.includes("nats"));
  } finally {
    await stack.infra.nats.start();
  }
});
