/** worker/: shard ownership, consumption, seq derivation, dedup, watermarks, live push, operations. */
export { Worker, type WorkerOptions, type WorkerStatus } from "./worker.js";
export { ShardRunner, type RunnerState } from "./shard-runner.js";
export type { RunnerDeps } from "./shard-ports.js";
export { WorkerMetrics } from "./metrics.js";
export { initRegistry, type InitReport } from "./registry-init.js";
export { runWorker } from "./main.js";
export { cli } from "./cli.js";
export { takeoverShard, splitShardOp, rebuildShard, setupReplica, failover, OperationError, type OpsContext } from "./shard-ops.js";
