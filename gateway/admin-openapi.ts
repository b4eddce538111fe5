/** The operator console's routes (gateway/admin.ts) in the OpenAPI document. */
import { z } from "zod";
import { AdminStateSchema } from "./admin.js";
import { jsonContent, inlineSchema, ref, type OpenApiExtension } from "./openapi.js";

const AdminErrorSchema = z.object({ error: z.string() });
const text = inlineSchema(z.string());
const off = { description: "The console is off: JETGATE_ADMIN_TOKEN is not set.", ...jsonContent(text, undefined, "text/plain") };

export const ADMIN_OPENAPI: OpenApiExtension = {
  schemas: {
    AdminState: { schema: AdminStateSchema, io: "output" },
    AdminError: { schema: AdminErrorSchema, io: "output" },
  },
  paths: {
    "/admin/": {
      get: {
        operationId: "adminPage",
        summary: "The operator console (a page that asks for the admin token)",
        security: [],
        responses: { "200": { description: "The page; it holds no data.", ...jsonContent(text, undefined, "text/html") }, "404": off },
      },
    },
    "/admin/api/state": {
      get: {
        operationId: "adminState",
        summary: "What the console shows: registry, stream heads, leases, every process's answer to jetgate.ops.stats",
        security: [{ adminToken: [] }],
        responses: {
          "200": { description: "The state now.", ...jsonContent(ref("AdminState")) },
          "401": { description: "Missing or wrong bearer token.", ...jsonContent(ref("AdminError")) },
          "404": off,
          "503": { description: "The state could not be read (NATS or Redis did not answer).", ...jsonContent(ref("AdminError")) },
        },
      },
    },
  },
};
