#!/usr/bin/env bash
# What `npm test` needs of the system, installed when missing (npm runs this as `pretest`): apt-get
# as root, each package named with why; otherwise it stops at once, naming the one command to run.
# Then the pinned nats-server, Helm and Centrifugo (scripts/pinned.ts: built with go install into
# ~/.cache/jetgate once per machine; each build says what it does; Centrifugo for the --nodes bench
# test, test/alone/nodes-bench.test.ts, which runs it beside jetgate). Go comes from the machine
# (>= 1.21, which fetches the toolchain a module asks for), never Debian's golang-go.
set -euo pipefail
cd "$(dirname "$0")/.."
pinned() { node --import tsx scripts/pinned.ts install nats-server helm centrifugo >/dev/null; }
missing=()
why=()
need() { missing+=("$1"); why+=("  $1: $2"); }
# Debian's nats-server (2.9.10 on bookworm) only for the test that the processes refuse a server
# older than 2.12.1; every other test runs the pinned one
command -v nats-server >/dev/null 2>&1 || [ -x /usr/sbin/nats-server ] || need nats-server "an old server (2.9), for the test that jetgate refuses one older than 2.12.1"
command -v redis-server >/dev/null 2>&1 || need redis-server "every test starts its own Redis"
[ -x /usr/bin/chromium ] || need chromium "the browser demo and console tests drive it headless"
command -v openssl >/dev/null 2>&1 || need openssl "the TLS tests make a throwaway CA"
command -v ip >/dev/null 2>&1 || need iproute2 "the partition tests put processes in network namespaces"
command -v setpriv >/dev/null 2>&1 || need util-linux "the partition tests check they fail without CAP_NET_ADMIN"
if [ ${#missing[@]} -eq 0 ]; then pinned; exit 0; fi
if [ "$(id -u)" != 0 ]; then
  printf 'npm test needs these Debian packages:\n%s\n' "$(printf '%s\n' "${why[@]}")" >&2
  echo "install them with: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
printf 'npm test installs %d Debian packages with apt-get (once per machine):\n%s\n' "${#missing[@]}" "$(printf '%s\n' "${why[@]}")"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
pinned
