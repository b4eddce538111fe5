/**
 * Identifiers that end up in NATS subjects, Redis keys and Nats-Msg-Id headers.
 * Only `[A-Za-z0-9_-]` of bounded length: a `.`, `*`, `>` or space would change a subject's meaning.
 */
import { z } from "zod";
import { JetgateError } from "./errors.js";

export const ID_PATTERN = /^[A-Za-z0-9_-]+$/;
export const MAX_ID_LENGTH = 64;
export const MAX_LANE_LENGTH = 32;

export type IdKind = "user" | "device" | "lane" | "message" | "dispatch" | "cmid" | "log" | "session" | "worker" | "gateway";

export class InvalidIdError extends JetgateError {
  readonly kind: IdKind;
  constructor(kind: IdKind, message: string) {
    super("INVALID_ID", `${kind} id ${message}`);
    this.kind = kind;
  }
}

function maxFor(kind: IdKind): number {
  return kind === "lane" ? MAX_LANE_LENGTH : MAX_ID_LENGTH;
}

/** Why `value` is not a safe id of this kind, or undefined when it is one. */
export function idProblem(kind: IdKind, value: unknown): string | undefined {
  if (typeof value !== "string") return `must be a string, got ${typeof value}`;
  if (value.length === 0) return "must not be empty";
  const max = maxFor(kind);
  if (value.length > max) return `must be at most ${max} characters, got ${value.length}`;
  if (!ID_PATTERN.test(value)) return `may contain only A-Z a-z 0-9 _ -, got ${JSON.stringify(value)}`;
  return undefined;
}

/** Returns the id or throws InvalidIdError naming the kind and the reason. */
export function assertId(kind: IdKind, value: unknown): string {
  const problem = idProblem(kind, value);
  if (problem !== undefined) throw new InvalidIdError(kind, problem);
  return value as string;
}

/** zod schema for an id of this kind, with the same rules and messages. */
export function idSchema(kind: IdKind) {
  return z.string().superRefine((v, ctx) => {
    const problem = idProblem(kind, v);
    if (problem !== undefined) ctx.addIssue({ code: "custom", message: `${kind} id ${problem}` });
  });
}

/**
 * zod schema for a list of distinct ids of one kind, min..max long, that reports only the first bad
 * element: a list of 10,000 bad ids costs one issue, not 10,000 (a probe's 2.09M-element array
 * held an event loop for seconds building issues).
 */
export function idListSchema(kind: IdKind, opts: { min: number; max: number; noun: string }) {
  const plural = `${opts.noun}s`;
  return z
    .array(z.unknown())
    .min(opts.min, `must name at least ${opts.min === 1 ? "one" : opts.min} ${opts.min === 1 ? opts.noun : plural}`)
    .max(opts.max, `must name at most ${opts.max} ${plural}`)
    .superRefine((ids, ctx) => {
      for (let i = 0; i < ids.length; i++) {
        const problem = idProblem(kind, ids[i]);
        if (problem !== undefined) {
          ctx.addIssue({ code: "custom", path: [i], message: `${kind} id ${problem}` });
          return;
        }
      }
      if (new Set(ids).size !== ids.length) ctx.addIssue({ code: "custom", message: `${plural} must be unique` });
    })
    .transform((ids) => ids as string[]);
}
