import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { z } from "zod";
import { jsonContent, ref } from "../../gateway/http/openapi-parts.js";
import { buildOpenApi, openApiDocument, openApiJson } from "../../gateway/http/openapi.js";
import { parseDispatchBatch, parseDispatchBody } from "../../gateway/http/dispatch-body.js";
import { OPENAPI_FILE } from "../../scripts/openapi.js";

type Json = Record<string, unknown>;
type Doc = Json & { paths: Record<string, Record<string, Json>>; components: { schemas: Record<string, Json> } };
const doc = openApiDocument() as unknown as Doc;

test("openapi - docs/openapi.json is what the generator produces (npm run openapi)", () => {
  assert.equal(readFileSync(OPENAPI_FILE, "utf8"), openApiJson(), "docs/openapi.json is out of date: run npm run openapi");
});

test("openapi - every $ref names a component schema", () => {
  const refs = JSON.stringify(doc).match(/"\$ref":"[^"]*"/g) ?? [];
  assert.ok(refs.length > 10);
  for (const r of refs) {
    const name = /^"\$ref":"#\/components\/schemas\/([^"/]+)"$/.exec(r)?.[1];
    assert.ok(name !== undefined && name in doc.components.schemas, r);
  }
});

test("openapi - the request examples are requests the server's own parser accepts", () => {
  const example = (path: string) => {
    const media = (doc.paths[path]!.post!.requestBody as { content: Record<string, { example: unknown }> }).content["application/json"]!;
    return Buffer.from(JSON.stringify(media.example));
  };
  assert.equal(parseDispatchBody(example("/v1/dispatch")).ok, true);
  assert.equal(parseDispatchBatch(example("/v1/dispatch/batch")).ok, true);
});

test("openapi - the extension hook adds path items and schemas, and refuses a name used twice", () => {
  const Thing = z.object({ name: z.string() });
  const ext = { paths: { "/admin/things": { get: { responses: { "200": { description: "things", ...jsonContent(ref("AdminThing")) } } } } }, schemas: { AdminThing: { schema: Thing, io: "output" as const } } };
  const extended = buildOpenApi([ext]) as unknown as Doc;
  assert.ok(extended.paths["/admin/things"]);
  assert.deepEqual(extended.components.schemas.AdminThing, { type: "object", properties: { name: { type: "string" } }, required: ["name"], additionalProperties: false });
  assert.ok(extended.paths["/v1/dispatch"], "jetgate's own paths stay");
  assert.throws(() => buildOpenApi([{ paths: { "/v1/dispatch": {} } }]), /documented twice/);
  assert.throws(() => buildOpenApi([{ paths: {}, schemas: { DispatchError: { schema: Thing, io: "output" } } }]), /defined twice/);
  assert.equal(openApiDocument().paths["/admin/things"], undefined, "buildOpenApi is pure");
});
