#!/usr/bin/env bash
# What `npm test` needs of the system, installed when missing (npm runs this as `pretest`): apt-get
# as root; otherwise it stops at once, naming the one command to run. Then the pinned nats-server
# and Helm (scripts/pinned.ts: built with go install into ~/.cache/jetgate once per machine; Helm
# because the chart test lints and renders the chart with it).
set -euo pipefail
cd "$(dirname "$0")/.."
pinned() { node --import tsx scripts/pinned.ts install nats-server helm >/dev/null; }
missing=()
# Debian's nats-server (2.9.10 on bookworm) only for the test that the processes refuse a server
# older than 2.12.1; every other test runs the pinned one
command -v nats-server >/dev/null 2>&1 || [ -x /usr/sbin/nats-server ] || missing+=(nats-server)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
[ -x /usr/bin/chromium ] || missing+=(chromium)   # the browser and console tests drive Debian's chromium
command -v openssl >/dev/null 2>&1 || missing+=(openssl)   # the TLS tests make a throwaway CA
command -v ip >/dev/null 2>&1 || missing+=(iproute2)        # the partition tests: network namespaces
command -v setpriv >/dev/null 2>&1 || missing+=(util-linux) # ... and their check without CAP_NET_ADMIN
if [ ${#missing[@]} -eq 0 ]; then pinned; exit 0; fi
if [ "$(id -u)" != 0 ]; then
  echo "npm test needs: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "installing ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
pinned
