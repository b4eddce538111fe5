/** What a session needs from its gateway, in one object (so tests can build one too). */
import type { Logger } from "pino";
import type { JetStreamClient } from "@nats-io/jetstream";
import type { Config, CursorSigner, RegistryClient } from "../protocol/index.js";
import type { AckStore } from "./acks.js";
import type { TokenVerifier } from "./jwt.js";
import type { MailboxReader } from "./mailbox-reader.js";
import type { GatewayMetrics } from "./metrics.js";
import type { Presence } from "./presence.js";
import type { SessionRegistry } from "./sessions.js";

export interface GatewayContext {
  config: Config;
  log: Logger;
  metrics: GatewayMetrics;
  tokens: TokenVerifier;
  cursors: CursorSigner;
  registry: RegistryClient;
  reader: MailboxReader;
  sessions: SessionRegistry;
  presence: Presence;
  acks: AckStore;
  js: JetStreamClient;
}
