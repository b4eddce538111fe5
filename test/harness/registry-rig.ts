/**
 * A test file's own servers with the registry initialised, a NATS connection and a registry
 * client on them, closed after the file's tests: the opening most integration files share.
 */
import { after } from "node:test";
import { connect, type ConnectionOptions, type NatsConnection } from "@nats-io/transport-node";
import { RegistryClient } from "../../protocol/io/index.js";
import { initStack, startInfra, type Infra } from "./stack.js";

export async function registryRig(env: Record<string, string> = {}, nats: Partial<ConnectionOptions> = {}): Promise<{ infra: Infra; nc: NatsConnection; registry: RegistryClient }> {
  const infra = await startInfra(env);
  await initStack(infra.env);
  const nc = await connect({ servers: infra.nats.url, ...nats });
  const registry = await RegistryClient.open(nc);
  after(async () => {
    await registry.close();
    await nc.close();
    await infra.dispose();
  });
  return { infra, nc, registry };
}
