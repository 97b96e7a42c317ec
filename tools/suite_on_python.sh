#!/usr/bin/env bash
# Run the test suite on another Python (default: the 3.9 floor), in its own venv,
# with whatever dependency releases pip picks for that Python. Arguments after
# the minor version go to pytest (make test-py39 passes -m "not slow").
set -euo pipefail
cd "$(dirname "$0")/.."
minor=${1:-9}
py=""
if command -v pyenv >/dev/null 2>&1; then
  v=$(pyenv versions --bare 2>/dev/null | grep -E "^3\.${minor}(\.[0-9]+)?$" | sort -V | tail -1 || true)
  [ -n "$v" ] && py="$(pyenv root)/versions/$v/bin/python"
fi
[ -z "$py" ] && py=$(command -v "python3.${minor}" || true)
if [ -z "$py" ]; then
  echo "Python 3.${minor} is not installed here: install it (e.g. pyenv install 3.${minor}) to run this check" >&2
  exit 1
fi
venv=".venv-suite-3.${minor}"
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip setuptools wheel
"$venv/bin/python" -m pip install -q -e '.[test]'
"$venv/bin/python" setup.py -q build_ext --inplace
"$venv/bin/python" -m pytest -q -p no:cacheprovider "${@:2}"
