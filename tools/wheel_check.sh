#!/usr/bin/env bash
# Build the wheel, install it into a fresh venv and use it from outside the
# source tree: the extension must import and the Lua scripts must load.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-.venv/bin/python}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" -m pip wheel -q --no-deps -w "$tmp/dist" .
"$python" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q "$tmp"/dist/moderato-*.whl
cd /tmp
"$tmp/venv/bin/python" - <<'PY'
import importlib.machinery
import moderato, moderato._accel
from moderato.scripts import load_script, SCRIPT_NAMES
assert moderato._accel.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)), moderato._accel.__file__
assert "site-packages" in moderato.__file__, moderato.__file__
for name in SCRIPT_NAMES:
    script = load_script(name)
    assert len(script.sha) == 40 and script.source.strip(), name
print(f"wheel ok: {moderato.__file__}; scripts: {', '.join(SCRIPT_NAMES)}")
PY
