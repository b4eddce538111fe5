/** The users API's routes (gateway/http/users-api.ts) in the OpenAPI document. */
import { MAX_PRESENCE_USERS } from "./control.js";
import type { ServiceScope } from "../../protocol/index.js";
import { forbidden, jsonContent, ref, RIGHT_TOKEN_SERVED, UNAUTHORIZED, type OpenApiExtension, type PathItem } from "./openapi-parts.js";
import {
  DisconnectBodySchema,
  EndedAnswerSchema,
  EntriesPageSchema,
  MailboxInfoSchema,
  MAX_USERS_API_BODY,
  PresenceAnswerSchema,
  PresenceBodySchema,
  RevokeBodySchema,
  RevokedAnswerSchema,
  UsersApiErrorSchema,
} from "./users-api.js";

const error = (description: string) => ({ description, ...jsonContent(ref("UsersApiError")) });
const retryAfter = { "Retry-After": { description: "Seconds to wait.", schema: { type: "integer", minimum: 1 } } };
const userParam = { name: "user", in: "path", required: true, description: "The user id (1-64 of A-Z a-z 0-9 _ -).", schema: { type: "string", pattern: "^[A-Za-z0-9_-]{1,64}$" } };

/** The answers every route of the API may give beside its own; `scope` is the one it needs. */
function common(scope: ServiceScope): Record<string, unknown> {
  return {
    "400": error("Bad input (a path or body field; `field` names it), or a body that is not JSON. Nothing was done."),
    "401": error(UNAUTHORIZED),
    "403": error(forbidden(scope)),
    "413": error(`A request body over ${MAX_USERS_API_BODY} bytes.`),
    "429": {
      ...error(`Over JETGATE_USERS_API_RATE_PER_S requests per second on this gateway, or a wrong bearer token from a client address that sent too many (10, then one every 6 s, counted with the dispatch API's); retry after Retry-After. ${RIGHT_TOKEN_SERVED}`),
      headers: retryAfter,
    },
    "503": { ...error("The API is off (neither JETGATE_SERVICE_TOKEN nor JETGATE_SERVICE_TOKENS_FILE is set), or a dependency did not answer within JETGATE_DEPENDENCY_TIMEOUT_MS (the message says which; retry after Retry-After)."), headers: retryAfter },
  };
}

/** The security requirement of a route that needs `scope`, and the same as an extension field. */
const needs = (scope: ServiceScope) => ({ security: [{ serviceToken: [scope] }], "x-jetgate-scope": scope });

function post(operationId: string, scope: ServiceScope, summary: string, description: string, body: string, answer: string, example: unknown): PathItem {
  return {
    post: {
      operationId,
      summary,
      description: `${description} Needs the scope \`${scope}\`; audited (docs/security.md).`,
      ...needs(scope),
      ...(operationId === "presence" ? {} : { parameters: [userParam] }),
      requestBody: { required: true, ...jsonContent(ref(body), example) },
      responses: { "200": { description: "Done: `gateways` says how many gateways answered of how many there were to ask; `partial: true`: some sessions may not have been reached, call again.", ...jsonContent(ref(answer)) }, ...common(scope) },
    },
  };
}

export const USERS_OPENAPI: OpenApiExtension = {
  schemas: {
    DisconnectRequest: { schema: DisconnectBodySchema, io: "input" },
    RevokeRequest: { schema: RevokeBodySchema, io: "input" },
    PresenceRequest: { schema: PresenceBodySchema, io: "input" },
    EndedAnswer: { schema: EndedAnswerSchema, io: "output" },
    RevokedAnswer: { schema: RevokedAnswerSchema, io: "output" },
    PresenceAnswer: { schema: PresenceAnswerSchema, io: "output" },
    MailboxInfo: { schema: MailboxInfoSchema, io: "output" },
    EntriesPage: { schema: EntriesPageSchema, io: "output" },
    UsersApiError: { schema: UsersApiErrorSchema, io: "output" },
  },
  paths: {
    "/v1/users/{user}/disconnect": post(
      "disconnect",
      "sessions",
      "End a user's sessions (or one device's) on every gateway",
      "`signed_out` closes with 4403: the SDK stops and reports `signed_out` (to keep the device out, revoke its tokens too). `reconnect` closes with 4300: the SDK reconnects at once, asking the app for a token again.",
      "DisconnectRequest", "EndedAnswer", { mode: "signed_out", reason: "signed out on another device" },
    ),
    "/v1/users/{user}/revoke": post(
      "revoke",
      "revoke",
      "Refuse a user's (or one device's) tokens issued before a time, on every gateway",
      "Tokens whose `iat` is below `issued_before` (default: the second after the call's, so a token minted in the call's second is covered; a token without `iat` too) are refused at AUTH and REFRESH from the answer on, and the live sessions holding one are ended as `mode` says. `issued_before` more than 60 s ahead is refused (400): a later call never lowers it. Kept until `expires_at`, when no token it covers can be accepted any more: issued_before + JETGATE_JWT_MAX_LIFETIME_S + 10 s (twice the clock tolerance), at least as long from the call. A device's revocation binds tokens that carry a `dev` claim; the holder of one without `dev` chooses its device id. 503 when Redis does not take it: nothing was revoked.",
      "RevokeRequest", "RevokedAnswer", { mode: "signed_out" },
    ),
    "/v1/users/{user}/presence": {
      get: {
        operationId: "userPresence",
        summary: "Which devices of a user have a live session, where and since when",
        description: "Asked of every gateway (the sessions themselves, not a record in Redis: a Redis flush changes nothing here). Needs the scope `presence`; audited.",
        ...needs("presence"),
        parameters: [userParam],
        responses: { "200": { description: "The user's live sessions (none: an empty list).", ...jsonContent(ref("PresenceAnswer")) }, ...common("presence") },
      },
    },
    "/v1/presence": post(
      "presence",
      "presence",
      `Which devices of up to ${MAX_PRESENCE_USERS} users have a live session`,
      "As GET /v1/users/{user}/presence, for many users in one round of asking.",
      "PresenceRequest", "PresenceAnswer", { users: ["alice", "bob"] },
    ),
    "/v1/users/{user}/entries": {
      get: {
        operationId: "entries",
        summary: "A user's entries, a page at a time, with the cursor cases a device gets",
        description: `Without \`next\`: from the mailbox's start. With the \`next\` of the previous page: what follows it, decided as a device's AUTH is: \`normal\`; \`rebased\` (an epoch change on the same log: same entries, today's seqs); \`rebased_new_log\` (a rebuild or failover: the new log from its start, entries already read come again with new seqs, same ids); \`split\` (the user moved: the old shard's rest first, then the new shard); \`expired\` (retention passed the position: \`trim\`, entries from the head on); \`invalid\` (not a position of this user: from the start). Entries carry their message \`id\`: dedup by it, as devices do. At most \`limit\` entries (1-${1000}) and about 4 MiB of bodies per page; \`more\` says whether to ask again at once. Needs the scope \`read\`; audited.`,
        ...needs("read"),
        parameters: [
          userParam,
          { name: "next", in: "query", required: false, description: "The previous page's `next`.", schema: { type: "string", maxLength: 1000 } },
          { name: "limit", in: "query", required: false, description: "Entries per page (default 100).", schema: { type: "integer", minimum: 1, maximum: 1000 } },
          { name: "lane", in: "query", required: false, description: "One lane's entries only.", schema: { type: "string", maxLength: 32 } },
        ],
        responses: { "200": { description: "A page. Seqs are decimal strings.", ...jsonContent(ref("EntriesPage")) }, ...common("read") },
      },
    },
    "/v1/users/{user}/mailbox": {
      get: {
        operationId: "mailboxInfo",
        summary: "Where a user's mailbox is: shard, epoch, log, head seq per lane, the shard's trim watermark",
        description: "Needs the scope `read`; audited.",
        ...needs("read"),
        parameters: [userParam],
        responses: { "200": { description: "Seqs are decimal strings (they pass 2^53).", ...jsonContent(ref("MailboxInfo")) }, ...common("read") },
      },
    },
  },
};
