/**
 * The Redis client of a bench process that is not jetgate's (Socket.IO's server and producer): one
 * server, or a Redis Cluster through ioredis's Cluster client (`--cluster`), from a comma-separated
 * list of node URLs.
 */
import { Cluster, Redis } from "ioredis";

export function redisOf(urls: string, cluster: boolean): Redis | Cluster {
  const list = urls.split(",");
  if (!cluster) return new Redis(list[0]!);
  return new Cluster(list.map((u) => {
    const url = new URL(u);
    return { host: url.hostname, port: Number(url.port) };
  }));
}
