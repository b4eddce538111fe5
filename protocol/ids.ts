/**
 * Identifiers that end up in NATS subjects, Redis keys and Nats-Msg-Id headers.
 * Only `[A-Za-z0-9_-]` of bounded length: a `.`, `*`, `>` or space would change a subject's meaning.
 */
import { z } from "zod";
import { JetgateError } from "./errors.js";

export const ID_PATTERN = /^[A-Za-z0-9_-]+$/;
export const MAX_ID_LENGTH = 64;
export const MAX_LANE_LENGTH = 32;

export type IdKind = "user" | "device" | "lane" | "message" | "dispatch" | "cmid" | "log" | "session" | "worker";

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
