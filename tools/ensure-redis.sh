#!/usr/bin/env bash
# Make sure redis-server, redis-cli and redis-benchmark are on PATH; the test
# suite starts its own servers from these binaries.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
  exit 0
fi
echo "redis-server is missing: installing Debian's redis-server package" >&2
if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "apt-get is not available: install Redis 7 (redis-server, redis-cli) with your package manager" >&2
  exit 1
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server redis-tools >/dev/null
command -v redis-server >/dev/null
