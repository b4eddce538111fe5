#!/usr/bin/env bash
# A round of the side-by-side benchmarks: each scenario ROUNDS times (default 3), alternated, rows
# appended to bench/results/<scenario>.jsonl, then the chart redrawn from the round's medians.
# About 35 minutes a round on 2 cores (9 before centrifugo and the cluster runs; an estimate). `npm run bench:round`; ROUNDS=1 for a quick look.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-3}
log=${BENCH_ROUND_LOG:-bench/round.log}
run() {
  local scenario=$1; shift
  echo "$(date -u +%FT%TZ) $scenario $*" | tee -a "$log"
  npm run -s bench -- "$scenario" "$@" --json | tee -a "bench/results/$scenario.jsonl" >> "$log"
}
for _ in $(seq "$rounds"); do
  run fanout --systems jetgate,jetstream-limit,socketio,centrifugo
  run hot --systems jetgate,socketio,centrifugo
  # the fleet's shape: a 3-node NATS cluster with R3 shard streams, a 3-master Redis Cluster
  run fanout --cluster --systems jetgate,jetstream-limit,socketio,centrifugo
  run hot --cluster --systems jetgate,socketio,centrifugo
  run storm --systems jetgate,uws-limit,centrifugo
  # not centrifugo: a device 100,000 entries behind is past its channel history (100), by design
  run catchup --systems jetgate,jetstream-limit,uws-limit,socketio
  run idle --systems jetgate,centrifugo
done
run idle --systems uws-limit,jetstream-limit
npm run -s bench:chart
