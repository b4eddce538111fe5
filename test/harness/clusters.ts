/**
 * Clustered servers on one machine, as a fleet runs them: a NATS cluster (JetStream on every node,
 * so R3 streams have three peers) and a Redis Cluster of masters with the slots split evenly. The
 * fault suite kills and restarts their nodes; the benchmark's `--cluster` runs on them.
 */
import { NatsServer, RedisServer, freePort, startAll } from "./servers.js";
import { redisClient } from "./stack.js";
import { waitFor } from "./wait.js";

/** `n` nats-servers routed to each other (cluster `jg`, servers n0..n<n-1>). */
export async function natsCluster(n = 3): Promise<NatsServer[]> {
  const routes = await Promise.all(Array.from({ length: n }, () => freePort()));
  const ports = await Promise.all(Array.from({ length: n }, () => freePort()));
  const conf = (i: number) =>
    `server_name: n${i}\ncluster {\n  name: jg\n  listen: "127.0.0.1:${routes[i]}"\n  routes: [${routes.map((p) => `"nats-route://127.0.0.1:${p}"`).join(", ")}]\n}\n`;
  return startAll(Array.from({ length: n }, (_, i) => () => NatsServer.start({ config: conf(i), port: ports[i]! })));
}

/** `n` Redis masters (no replicas) sharing the 16,384 slots in even ranges; ready when every node says the cluster is ok. */
export async function redisCluster(n = 3): Promise<RedisServer[]> {
  const args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "no"];
  // the bus port on a free port of its own (by default it is port + 10000, which may be taken)
  const busPorts = await Promise.all(Array.from({ length: n }, () => freePort()));
  const nodes = await startAll(busPorts.map((bus) => () => RedisServer.start({ args: [...args, "--cluster-port", String(bus)] })));
  const clients = await Promise.all(nodes.map((node) => redisClient(node.url)));
  try {
    await Promise.all(clients.map((c, i) => c.call("CLUSTER", "ADDSLOTSRANGE", String(Math.floor((16384 * i) / n)), String(Math.floor((16384 * (i + 1)) / n) - 1))));
    for (let i = 1; i < nodes.length; i++) await clients[0]!.call("CLUSTER", "MEET", "127.0.0.1", String(nodes[i]!.port), String(busPorts[i]));
    await waitFor("the Redis cluster is ok", async () => {
      const infos = await Promise.all(clients.map((c) => c.call("CLUSTER", "INFO") as Promise<string>));
      return infos.every((info) => info.includes("cluster_state:ok") && info.includes(`cluster_known_nodes:${n}`));
    }, { timeoutMs: 20_000 });
  } catch (err) {
    await Promise.all(nodes.map((node) => node.dispose()));
    throw err;
  } finally {
    for (const c of clients) c.disconnect();
  }
  return nodes;
}
