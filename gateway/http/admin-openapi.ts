/** The operator console's routes (gateway/http/admin.ts) in the OpenAPI document. */
import { z } from "zod";
import { AdminStateSchema } from "./admin.js";
import { UserLookupSchema } from "./users-api.js";
import { jsonContent, inlineSchema, ref, type OpenApiExtension } from "./openapi-parts.js";

const AdminErrorSchema = z.object({ error: z.string() });
const text = inlineSchema(z.string());
const off = { description: "The console is off: JETGATE_ADMIN_TOKEN is not set.", ...jsonContent(text, undefined, "text/plain") };

export const ADMIN_OPENAPI: OpenApiExtension = {
  schemas: {
    AdminState: { schema: AdminStateSchema, io: "output" },
    AdminError: { schema: AdminErrorSchema, io: "output" },
    UserLookup: { schema: UserLookupSchema, io: "output" },
  },
  paths: {
    "/admin/": {
      get: {
        operationId: "adminPage",
        summary: "The operator console (a page that asks for the admin token)",
        security: [],
        responses: { "200": { description: "The page; it holds no data. Its CSP allows only its own stylesheet and script (no inline script) and no framing.", ...jsonContent(text, undefined, "text/html") }, "404": off },
      },
    },
    "/admin/app.js": {
      get: {
        operationId: "adminScript",
        summary: "The console page's script",
        security: [],
        responses: { "200": { description: "The script.", ...jsonContent(text, undefined, "text/javascript") }, "404": off },
      },
    },
    "/admin/app.css": {
      get: {
        operationId: "adminStylesheet",
        summary: "The console page's stylesheet",
        security: [],
        responses: { "200": { description: "The stylesheet.", ...jsonContent(text, undefined, "text/css") }, "404": off },
      },
    },
    "/admin/api/user/{user}": {
      get: {
        operationId: "adminUserLookup",
        summary: "The console's user lookup: the mailbox's position, the live sessions (asked of every gateway), the newest 20 entries of the user's shard (bodies by size only)",
        security: [{ adminToken: [] }],
        parameters: [{ name: "user", in: "path", required: true, schema: { type: "string", pattern: "^[A-Za-z0-9_-]{1,64}$" } }],
        responses: {
          "200": { description: "The user now.", ...jsonContent(ref("UserLookup")) },
          "400": { description: "Not a user id.", ...jsonContent(ref("AdminError")) },
          "401": { description: "Missing or wrong bearer token.", ...jsonContent(ref("AdminError")) },
          "404": off,
          "429": {
            description: "Too many wrong tokens from this client address; try again after Retry-After seconds.",
            headers: { "Retry-After": { description: "Seconds to wait.", schema: { type: "integer", minimum: 1 } } },
            ...jsonContent(ref("AdminError")),
          },
          "503": { description: "The registry or the mailbox did not answer.", ...jsonContent(ref("AdminError")) },
        },
      },
    },
    "/admin/api/state": {
      get: {
        operationId: "adminState",
        summary: "What the console shows: registry, stream heads, leases, every process's answer to jetgate.ops.stats (read once per 1.5 s however many poll it)",
        security: [{ adminToken: [] }],
        responses: {
          "200": { description: "The state now.", ...jsonContent(ref("AdminState")) },
          "401": { description: "Missing or wrong bearer token.", ...jsonContent(ref("AdminError")) },
          "404": off,
          "429": {
            description: "Too many wrong tokens from this client address (10, then one every 6 s); try again after Retry-After seconds.",
            headers: { "Retry-After": { description: "Seconds to wait.", schema: { type: "integer", minimum: 1 } } },
            ...jsonContent(ref("AdminError")),
          },
          "503": { description: "The state could not be read at all; a dependency that did not answer in time is named in the 200's `down` instead.", ...jsonContent(ref("AdminError")) },
        },
      },
    },
  },
};
