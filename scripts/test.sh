#!/usr/bin/env bash
# npm test: every suite runs whatever an earlier one did, each timed; a summary at the end, and the
# exit status fails when any suite failed. (Chained with &&, a failed unit test used to skip the
# fault and alone suites without a word.)
set -u
cd "$(dirname "$0")/.."
# the node jetgate runs on here (scripts/runtime.ts): the host's when it loads uWebSockets.js's
# binary, else the provisioned Node 24; it says which in one line
node=${JETGATE_TEST_NODE:-$(node --import tsx scripts/runtime.ts)} || { echo "npm test: no node to run the tests on (scripts/runtime.ts said why above)" >&2; exit 1; }
export PATH="$(dirname "$node"):$PATH"
results=()
failed=0
suite() {
  local name=$1 t0 rc
  shift
  echo "=== ${name}: $*"
  t0=$(date +%s)
  "$@"
  rc=$?
  results+=("$(printf '%-18s %5s s  %s' "$name" "$(($(date +%s) - t0))" "$([ "$rc" = 0 ] && echo ok || echo "FAILED (exit $rc)")")")
  [ "$rc" = 0 ] || failed=1
}
suite typecheck npx tsc -p .
suite lint npm run --silent lint
# the gateway and worker processes the tests start run the compiled build, as the image does: a
# process starts in about half the time it takes through tsx, and the suites start hundreds
suite build npx tsc -p tsconfig.build.json
export HARNESS_DIST=1
suite unit+integration "$node" --import tsx --test --test-concurrency=2 --test-reporter=spec test/unit/*.test.ts test/integration/*.test.ts test/fuzz/*.test.ts
# the Go device SDK (sdk/go, its own module) with the race detector; the machine's Go, as for nats-server
suite go-sdk bash -c 'cd sdk/go && go vet ./... && go test -race -count=1 ./...'
suite faults "$node" --import tsx --test --test-concurrency=1 --test-reporter=spec test/faults/*.test.ts
suite alone "$node" --import tsx --test --test-concurrency=1 --test-reporter=spec test/alone/*.test.ts
echo
echo "npm test, suite by suite:"
printf '  %s\n' "${results[@]}"
exit "$failed"
