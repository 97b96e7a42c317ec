#!/usr/bin/env bash
# Install moderato the way a user does, on each Python given, and check it from
# outside the source tree:
#   python -m build --sdist  ->  a wheel built from that sdist (pip, isolated
#   build env from PyPI)  ->  a fresh venv  ->  tools/installed_check.py run
#   from an empty folder (the extension, the scripts, version, license,
#   memory://, and a redis-server it starts on a free loopback port).
#
# usage: bash tools/install_check.sh MINOR...   e.g. `9 13` for Python 3.9 and 3.13
#        (pyenv's newest 3.MINOR, else python3.MINOR on PATH; a missing one fails)
# The sdist is built by .venv's python (its dev extra brings `build`).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
[ "$#" -gt 0 ] || { echo "usage: $0 MINOR... (e.g. 9 13)" >&2; exit 2; }
builder="$root/.venv/bin/python"
[ -x "$builder" ] || { echo "install-check: $builder is missing: run make build first" >&2; exit 1; }

find_python() {
  local minor=$1 v
  if command -v pyenv >/dev/null 2>&1; then
    v=$(pyenv versions --bare 2>/dev/null | grep -E "^3\.${minor}(\.[0-9]+)?$" | sort -V | tail -1 || true)
    [ -n "$v" ] && { echo "$(pyenv root)/versions/$v/bin/python"; return; }
  fi
  command -v "python3.${minor}" || true
}

# A user's build: warnings stay warnings (-Werror is for CI and development builds).
unset MODERATO_STRICT_BUILD
tmp=$(mktemp -d "${TMPDIR:-/tmp}/moderato-install-check.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

echo "== sdist: python -m build --sdist"
(cd "$tmp" && "$builder" -m build --sdist --outdir "$tmp/sdist" "$root") >"$tmp/sdist.log" 2>&1 \
  || { cat "$tmp/sdist.log" >&2; exit 1; }
sdist=$(ls "$tmp"/sdist/moderato-*.tar.gz)
# The license metadata is PEP 639's: setuptools must not warn about it.
if grep -i "licen" "$tmp/sdist.log" | grep -Ei "deprecat|warn"; then
  echo "install-check: the sdist build warned about the license metadata" >&2
  exit 1
fi
echo "   $(basename "$sdist")"

for minor in "$@"; do
  python=$(find_python "$minor")
  if [ -z "$python" ]; then
    echo "install-check: Python 3.${minor} is not installed here (pyenv install 3.${minor})" >&2
    exit 1
  fi
  echo "== Python 3.${minor} ($python): wheel from the sdist, fresh venv, check from outside"
  venv="$tmp/venv-3.${minor}"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip wheel -q --no-deps -w "$tmp/wheels-3.${minor}" "$sdist"
  "$venv/bin/python" -m pip install -q "$tmp"/wheels-3.${minor}/moderato-*.whl
  outside="$tmp/outside-3.${minor}"
  mkdir "$outside"
  cp "$root/tools/installed_check.py" "$outside/"
  (cd "$outside" && "$venv/bin/python" installed_check.py)
done

echo "== the starlette extra (Python 3.${minor}): Starlette, not FastAPI"
wheel=$(ls "$tmp"/wheels-3.${minor}/moderato-*.whl)
"$venv/bin/python" -m pip install -q "${wheel}[starlette]"
(cd "$outside" && "$venv/bin/python" installed_check.py --starlette-extra)
