#!/usr/bin/env bash
# Make sure a headless-capable Chromium is installed: tests/browser/test_demo_browser.py
# drives the demo page in it (over the DevTools protocol, no driver needed).
set -euo pipefail
if [ -n "${MODERATO_CHROMIUM:-}" ] && [ -x "${MODERATO_CHROMIUM}" ]; then
  exit 0
fi
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
echo "chromium is missing: installing Debian's chromium package" >&2
if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "apt-get is not available: install Chromium with your package manager," \
       "or point MODERATO_CHROMIUM at a chromium/chrome binary" >&2
  exit 1
fi
$SUDO apt-get update -qq
# fonts-liberation: without a font the page (and its screenshot) renders as boxes.
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
  chromium fonts-liberation >/dev/null
command -v chromium >/dev/null
