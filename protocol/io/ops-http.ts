/**
 * The operations listener of the gateway and the worker: /healthz (process up), /readyz
 * (dependencies), /metrics (Prometheus). It is its own port, bound to JETGATE_METRICS_HOST
 * (loopback by default), so nothing a device can reach tells it connection counts or outcomes.
 */
import { createServer, type Server } from "node:http";
import type { Registry } from "prom-client";
import { z } from "zod";

export interface Readiness {
  /** Names of what is not ready; empty when ready. */
  problems(): string[];
  /** What is wrong with a problem, in words, where there is more to say than its name. */
  detail?(): Record<string, string>;
}

/** The /readyz answer (documented in docs/openapi.json from this schema). */
export const ReadyzSchema = z.object({
  ready: z.boolean(),
  problems: z.array(z.string()).meta({ description: "What is not ready: nats, redis, registry, revocations, starting, draining, capacity (a gateway taking no more devices: JETGATE_MAX_CONNECTIONS reached, or out of files; empty when ready)." }),
  detail: z
    .record(z.string(), z.string())
    .optional()
    .meta({ description: "Why, for a dependency in `problems`: e.g. `redis`: `refuses writes (oom): OOM command not allowed ...`, or `no answer for 2300 ms`; `capacity`: `2000 of 2000 connections (JETGATE_MAX_CONNECTIONS; open files limit 4096)`." }),
});

export function startOpsHttp(port: number, host: string, metrics: Registry, readiness: Readiness): Promise<Server> {
  const server = createServer((req, res) => {
    const path = (req.url ?? "/").split("?")[0];
    if (req.method !== "GET") {
      res.writeHead(405, { "content-type": "text/plain" }).end("method not allowed\n");
      return;
    }
    if (path === "/healthz") {
      res.writeHead(200, { "content-type": "text/plain" }).end("ok\n");
    } else if (path === "/readyz") {
      const problems = readiness.problems();
      const detail = problems.length === 0 ? {} : (readiness.detail?.() ?? {});
      const body: z.input<typeof ReadyzSchema> = { ready: problems.length === 0, problems, ...(Object.keys(detail).length > 0 ? { detail } : {}) };
      res
        .writeHead(problems.length === 0 ? 200 : 503, { "content-type": "application/json" })
        .end(JSON.stringify(body) + "\n");
    } else if (path === "/metrics") {
      metrics.metrics().then(
        (text) => res.writeHead(200, { "content-type": metrics.contentType }).end(text),
        (err: unknown) => res.writeHead(500, { "content-type": "text/plain" }).end(`${String(err)}\n`),
      );
    } else {
      res.writeHead(404, { "content-type": "text/plain" }).end("not found\n");
    }
  });
  return new Promise((resolve, reject) => {
    server.once("error", (err) => reject(new Error(`cannot listen on ${host}:${port} for health and metrics: ${err.message}`)));
    server.listen(port, host, () => resolve(server));
  });
}
