#!/usr/bin/env bash
# Build moderato (with _accel) as a wheel-style install on every pyenv Python
# from 3.9 to 3.13 found here, and run the accelerator tests against it, and
# the TLS burst tests (asyncio's TLS reads differ between these versions).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
# Every build here is a development build: compiler warnings are errors.
export MODERATO_STRICT_BUILD=1
found=0
for minor in 9 10 11 12 13; do
  py=""
  if command -v pyenv >/dev/null 2>&1; then
    v=$(pyenv versions --bare 2>/dev/null | grep -E "^3\.${minor}(\.[0-9]+)?$" | sort -V | tail -1 || true)
    [ -n "$v" ] && py="$(pyenv root)/versions/$v/bin/python"
  fi
  [ -z "$py" ] && py=$(command -v "python3.${minor}" || true)
  [ -z "$py" ] && { echo "== Python 3.${minor}: not installed here, skipped"; continue; }
  found=$((found + 1))
  venv="$root/.venv-3.${minor}"
  echo "== Python 3.${minor} ($py)"
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip setuptools wheel
  "$venv/bin/python" -m pip install -q pytest pytest-asyncio hypothesis hiredis
  "$venv/bin/python" -m pip install -q --no-deps --force-reinstall --no-build-isolation "$root"
  # The pytest script (not `python -m pytest`) keeps the source tree off
  # sys.path, so the installed build is the one under test.
  (cd "$root" && "$venv/bin/pytest" -q -p no:cacheprovider tests/unit/test_accel.py tests/redis/test_accel_on_redis.py \
    tests/redis/test_tls.py)
done
if [ "$found" -eq 0 ]; then echo "no Python 3.9-3.13 found" >&2; exit 1; fi
