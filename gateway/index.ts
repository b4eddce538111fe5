/** gateway/: device sessions over uWebSockets.js, AUTH and the rebase cases, catch-up, live fan-out, HTTP. */
export { runGateway } from "./main.js";
export { decideAuth, positionIn, type AuthDecision, type AuthInput, type AuthCase, type CursorIn } from "./mailbox/auth-decision.js";
export { Session, type Transport, type SessionState } from "./session/session.js";
export { MailboxReader } from "./mailbox/reader.js";
export { tokenVerifier, TokenError, type TokenVerifier, type DeviceClaims } from "./jwt.js";
export { loadUws, UwsLoadError } from "./uws.js";
