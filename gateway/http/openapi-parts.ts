/**
 * The parts every piece of the OpenAPI document is built with: the document (openapi.ts) and its
 * extensions (users-openapi.ts, admin-openapi.ts) import them from here, so none of them imports
 * another's module for its helpers.
 */
import { z } from "zod";
import type { ServiceScope } from "../../protocol/index.js";

export type Json = Record<string, unknown>;
/** An OpenAPI Path Item Object (`{get: {...}, post: {...}}`), as plain JSON. */
export type PathItem = Json;
/** A schema for components.schemas: `io: "input"` documents what a request may hold (before transforms). */
export interface ComponentSchema {
  schema: z.ZodType;
  io: "input" | "output";
}

/**
 * The hook for other parts of the HTTP API: the admin API (`/admin/...`) documents itself with one
 * of these (its path items, using `ref(name)` / `jsonContent` for its named schemas) and adds it to
 * OPENAPI_EXTENSIONS in openapi.ts; the server, `npm run openapi` and the tests then all include it.
 */
export interface OpenApiExtension {
  paths: Record<string, PathItem>;
  schemas?: Record<string, ComponentSchema>;
}

export function ref(name: string): { $ref: string } {
  return { $ref: `#/components/schemas/${name}` };
}

/** A zod schema inline, as a 2020-12 schema without its `$schema` (OpenAPI 3.1 implies the dialect). */
export function inlineSchema(schema: z.ZodType, io: "input" | "output" = "output"): Json {
  const { $schema: _dialect, ...rest } = z.toJSONSchema(schema, { io });
  return rest;
}

/** A response or request body of one media type. */
export function jsonContent(schema: Json, example?: unknown, type = "application/json"): Json {
  return { content: { [type]: { schema, ...(example !== undefined ? { example } : {}) } } };
}

/** What the service token answers say, the same on every route of the HTTP API. */
export const UNAUTHORIZED =
  "Missing or wrong bearer token; a token of the tokens file past its `not_after` (the message names it); with JETGATE_ENV=production, a tokens-file token under 96 bits (estimated), named.";
export const RIGHT_TOKEN_SERVED = "A right token is served whatever else its address sent: only wrong ones are held off.";
export function forbidden(scope: ServiceScope): string {
  return `A right service token without the scope \`${scope}\`: \`error\` names the token, its scopes and what \`${scope}\` opens; \`scope\` is \`${scope}\`. Nothing was done.`;
}
