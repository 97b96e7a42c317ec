#!/usr/bin/env bash
# Make sure `wrk` (the HTTP load generator the end-to-end benchmark drives) is on
# PATH; installs Debian's `wrk` package when it is missing.
set -euo pipefail
if command -v wrk >/dev/null 2>&1; then
  exit 0
fi
echo "wrk is missing: installing Debian's wrk package" >&2
if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "apt-get is not available: install wrk (https://github.com/wg/wrk) with your package manager" >&2
  exit 1
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq wrk >/dev/null
command -v wrk >/dev/null
