/**
 * The HTTP dispatch request, bounded before it is parsed. Pure: the server feeds it bytes.
 *
 * A dispatch body is at most `maxDispatchBodyBytes` bytes (the largest valid request), and while
 * it arrives a byte scanner refuses any shape the request cannot have: nesting deeper than the
 * request's two levels, more fields than it has, an array of more than MAX_RECIPIENTS items. So
 * JSON.parse and the per-element checks only ever see a bounded document; a probe's 4 MB array of
 * 2.09M numbers once held the device event loop for 4 s and grew the heap by 1 GB.
 */
import { z } from "zod";
import {
  ID_PATTERN,
  MAX_ID_LENGTH,
  MAX_LANE_LENGTH,
  idListSchema,
  idSchema,
  type IdKind,
  MAX_RECIPIENTS,
  SERVICE_SCOPES,
} from "../../protocol/index.js";

/** Field names, the three ids, punctuation and whitespace around them. */
const FIXED_BYTES = 1024;
/** One recipient: a 64-character id, its quotes and comma, and up to 13 bytes of whitespace. */
const PER_RECIPIENT_BYTES = MAX_ID_LENGTH + 16;
/** A text body's worst JSON escape: one control byte written as \u00XX (base64 is 4/3). */
const BODY_ESCAPE_FACTOR = 6;

/** The largest valid request in bytes, for a JETGATE_MAX_BODY_BYTES of `maxBodyBytes`. */
export function maxDispatchBodyBytes(maxBodyBytes: number): number {
  return FIXED_BYTES + MAX_RECIPIENTS * PER_RECIPIENT_BYTES + BODY_ESCAPE_FACTOR * maxBodyBytes;
}

/** A request has 5 fields; a few more get the schema's own "unrecognized key" message. */
const MAX_FIELDS = 8;
/** Dispatches in one `POST /v1/dispatch/batch`. */
export const MAX_BATCH_DISPATCHES = 1000;

/** Per nesting depth (1 = the top level): the most items a container there may hold, and why. */
interface Shape {
  levels: { max: number; message: string }[];
  /** Items of every container at this depth together (a batch's recipients over its dispatches). */
  total?: { depth: number; max: number; message: string };
}

const tooManyRecipients = `recipients: must name at most ${MAX_RECIPIENTS} recipients`;
export const SINGLE_SHAPE: Shape = {
  levels: [
    { max: MAX_FIELDS, message: `request: more than ${MAX_FIELDS} fields` },
    { max: MAX_RECIPIENTS, message: tooManyRecipients },
  ],
};
export const BATCH_SHAPE: Shape = {
  levels: [
    { max: MAX_FIELDS, message: `request: more than ${MAX_FIELDS} fields` },
    { max: MAX_BATCH_DISPATCHES, message: `dispatches: at most ${MAX_BATCH_DISPATCHES} dispatches in a batch` },
    { max: MAX_FIELDS, message: `dispatches: a dispatch with more than ${MAX_FIELDS} fields` },
    { max: MAX_RECIPIENTS, message: tooManyRecipients },
  ],
  total: { depth: 4, max: MAX_RECIPIENTS, message: `dispatches: at most ${MAX_RECIPIENTS} recipients in a batch, over all its dispatches` },
};

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const COMMA = 0x2c;
const OPEN_BRACE = 0x7b;
const OPEN_BRACKET = 0x5b;
const CLOSE_BRACE = 0x7d;
const CLOSE_BRACKET = 0x5d;

/**
 * Streams over the body's bytes and says, at the first byte that proves it, why the request
 * cannot be valid. Not a JSON validator (JSON.parse is, afterwards): it only bounds the shape.
 */
export class DispatchShapeGuard {
  private depth = 0;
  private inString = false;
  private escaped = false;
  /** Commas seen in each open container, by depth. */
  private readonly commas: number[];
  /** Items counted so far at the `total` depth: its containers' commas, plus one per container. */
  private total = 0;

  constructor(private readonly shape: Shape = SINGLE_SHAPE) {
    this.commas = new Array<number>(shape.levels.length + 1).fill(0);
  }

  /** Undefined while the bytes so far fit a request; the reason as soon as they cannot. */
  feed(chunk: Uint8Array): string | undefined {
    const levels = this.shape.levels;
    const total = this.shape.total;
    for (let i = 0; i < chunk.length; i++) {
      const b = chunk[i]!;
      if (this.inString) {
        if (this.escaped) this.escaped = false;
        else if (b === BACKSLASH) this.escaped = true;
        else if (b === QUOTE) this.inString = false;
        continue;
      }
      if (b === QUOTE) {
        this.inString = true;
      } else if (b === OPEN_BRACE || b === OPEN_BRACKET) {
        if (++this.depth > levels.length) return `request: nested deeper than ${levels.length} levels`;
        this.commas[this.depth] = 0;
        if (total?.depth === this.depth && ++this.total > total.max) return total.message;
      } else if (b === CLOSE_BRACE || b === CLOSE_BRACKET) {
        if (this.depth > 0) this.depth--;
      } else if (b === COMMA && this.depth > 0) {
        const level = levels[this.depth - 1]!;
        if (++this.commas[this.depth]! >= level.max) return level.message;
        if (total?.depth === this.depth && ++this.total > total.max) return total.message;
      }
    }
    return undefined;
  }
}

/**
 * The id rules as JSON Schema keywords: idProblem checks them in a refinement, which
 * z.toJSONSchema cannot see, so the OpenAPI document (gateway/http/openapi.ts) gets them from here.
 */
const idJson = (kind: IdKind) => ({ type: "string", pattern: ID_PATTERN.source, minLength: 1, maxLength: kind === "lane" ? MAX_LANE_LENGTH : MAX_ID_LENGTH });

/** Padded base64: Buffer.from(x, "base64") takes anything and drops what it cannot read ("Q" gave an empty body). */
const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;
/** A high surrogate not followed by a low one, or a low one not after a high one: TextEncoder would write U+FFFD for it. */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

export const DispatchBodySchema = z
  .strictObject({
    dispatch_id: idSchema("dispatch").meta({ ...idJson("dispatch"), description: "Unique per dispatch; retrying with the same id is safe (deduplicated)." }),
    message_id: idSchema("message").meta({ ...idJson("message"), description: "The entry's id; devices dedup by it." }),
    lane: idSchema("lane").meta({ ...idJson("lane"), description: "One of the gateway's JETGATE_LANES (400 naming `lane` otherwise)." }),
    recipients: idListSchema("user", { min: 1, max: MAX_RECIPIENTS, noun: "recipient" }).meta({ items: idJson("user"), uniqueItems: true, description: "Distinct user ids." }),
    /** The entry body as UTF-8 text ... */
    body: z
      .string()
      .refine((t) => !LONE_SURROGATE.test(t), "must be text: it holds a lone UTF-16 surrogate, which UTF-8 cannot carry (send such bytes as body_b64)")
      .meta({ description: "The entry body as UTF-8 text (at most JETGATE_MAX_BODY_BYTES bytes); a lone surrogate (\\ud800 without its pair) is a 400." })
      .optional(),
    /** ... or as base64 bytes. */
    body_b64: z
      .string()
      .regex(BASE64, "must be base64: groups of 4 of A-Z a-z 0-9 + /, the last padded with =")
      .meta({ description: "The entry body as base64 bytes (RFC 4648, padded), instead of `body`." })
      .optional(),
  })
  .refine((b) => (b.body === undefined) !== (b.body_b64 === undefined), { message: "give exactly one of body and body_b64" })
  .meta({ oneOf: [{ required: ["body"] }, { required: ["body_b64"] }] });

export interface ParsedDispatch {
  dispatch_id: string;
  message_id: string;
  lane: string;
  recipients: string[];
  body: Uint8Array<ArrayBuffer>;
}

export const DispatchBatchSchema = z
  .strictObject({ dispatches: z.array(DispatchBodySchema).min(1, "must hold at least one dispatch").max(MAX_BATCH_DISPATCHES, `must hold at most ${MAX_BATCH_DISPATCHES} dispatches`) })
  .refine((b) => b.dispatches.reduce((n, d) => n + d.recipients.length, 0) <= MAX_RECIPIENTS, {
    message: `at most ${MAX_RECIPIENTS} recipients in a batch, over all its dispatches`,
    path: ["dispatches"],
  })
  .meta({ description: `At most ${MAX_RECIPIENTS} recipients over all its dispatches; every dispatch is validated before any is appended.` });

/*
 * The answers, as the server sends them (server.ts builds its bodies with these types, and
 * gateway/http/openapi.ts documents them from these schemas).
 */
const shard = z.number().int().nonnegative();
export const DispatchResultSchema = z.union([
  z.object({
    user: z.string(),
    shard,
    seq: z.string().regex(/^\d+$/).meta({ description: "The mailbox_seq the device will see, in decimal (it passes 2^53)." }),
    offset: z.number().int().nonnegative().meta({ description: "The entry's offset in its shard's stream." }),
    duplicate: z.boolean().meta({
      description:
        "The entry was already appended by an earlier request with this dispatch_id (a retried dispatch), not by this request. The gateway's own retries of this request never make it true: after an unanswered attempt of its own it compares the stored entry's bytes, which carry the request's time in milliseconds. Limits: the same dispatch twice in one batch with an unanswered attempt (same millisecond, same bytes) answers false; so does an entry whose stored bytes could not be read.",
    }),
  }),
  z.object({
    user: z.string(),
    shard,
    error: z.object({ code: z.enum(["DISPATCH_TIMEOUT", "DISPATCH_REJECTED"]), message: z.string() }),
  }),
]);
export const DispatchAnswerSchema = z.object({ results: z.array(DispatchResultSchema).meta({ description: "One per recipient, in request order." }) });
export const DispatchBatchAnswerSchema = z.object({ dispatches: z.array(DispatchAnswerSchema).meta({ description: "One per dispatch, in request order." }) });
/** 400, 401, 413, 500. */
export const DispatchErrorSchema = z.object({
  error: z.string().meta({ description: "`<field>: <reason>` for bad input" }),
  field: z.string().optional().meta({ description: "The bad field's path (`recipients.3`, `dispatches.1.lane`); absent when the body as a whole is bad (not JSON, nested too deep)." }),
  scope: z.enum(SERVICE_SCOPES).optional().meta({ description: "403 only: the scope the service token lacks." }),
});
/** 503: NATS is down (with `code` and Retry-After), or the API is off (no JETGATE_SERVICE_TOKEN). */
export const DispatchUnavailableSchema = z.object({ error: z.string(), code: z.literal("DISPATCH_UNAVAILABLE").optional() });

export type DispatchResultJson = z.input<typeof DispatchResultSchema>;
export type DispatchErrorJson = z.input<typeof DispatchErrorSchema>;
/** Every body `POST /v1/dispatch` and `/v1/dispatch/batch` answer with. */
export type DispatchAnswerJson =
  | z.input<typeof DispatchAnswerSchema>
  | z.input<typeof DispatchBatchAnswerSchema>
  | DispatchErrorJson
  | z.input<typeof DispatchUnavailableSchema>;

export type DispatchParse = { ok: true; request: ParsedDispatch } | { ok: false; error: string; field?: string };
export type DispatchBatchParse = { ok: true; requests: ParsedDispatch[] } | { ok: false; error: string; field?: string };

function parseJson(raw: Buffer): { ok: true; json: unknown } | { ok: false; error: string } {
  try {
    return { ok: true, json: JSON.parse(raw.toString("utf8")) };
  } catch {
    return { ok: false, error: "body is not JSON" };
  }
}

/** The field an issue is about: its path, and for an unknown key that key (`{"x": 1}` names `x`). */
export function issueField(issue: z.core.$ZodIssue): string {
  const path = issue.code === "unrecognized_keys" && issue.keys.length > 0 ? [...issue.path, issue.keys[0]!] : issue.path;
  return path.join(".");
}

function firstIssue(error: z.ZodError): { ok: false; error: string; field?: string } {
  const issue = error.issues[0]!;
  const field = issueField(issue);
  return { ok: false, error: `${field || "request"}: ${issue.message}`, ...(field ? { field } : {}) };
}

function toRequest(b: z.output<typeof DispatchBodySchema>): ParsedDispatch {
  const body = b.body !== undefined ? new TextEncoder().encode(b.body) : new Uint8Array(Buffer.from(b.body_b64!, "base64"));
  return { dispatch_id: b.dispatch_id, message_id: b.message_id, lane: b.lane, recipients: b.recipients, body };
}

/** JSON, the request's shape and its ids; the lane and the body's size are the Dispatcher's to check. */
export function parseDispatchBody(raw: Buffer): DispatchParse {
  const j = parseJson(raw);
  if (!j.ok) return j;
  const parsed = DispatchBodySchema.safeParse(j.json);
  return parsed.success ? { ok: true, request: toRequest(parsed.data) } : firstIssue(parsed.error);
}

/** A batch: `{"dispatches": [request, ...]}`, each checked as `parseDispatchBody` checks one. */
export function parseDispatchBatch(raw: Buffer): DispatchBatchParse {
  const j = parseJson(raw);
  if (!j.ok) return j;
  const parsed = DispatchBatchSchema.safeParse(j.json);
  return parsed.success ? { ok: true, requests: parsed.data.dispatches.map(toRequest) } : firstIssue(parsed.error);
}
