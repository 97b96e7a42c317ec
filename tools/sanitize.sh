#!/usr/bin/env bash
# Build moderato._accel with AddressSanitizer and UndefinedBehaviorSanitizer
# and run tests/unit/test_accel.py and the memory:// tests against that build; any
# memory error or undefined behaviour aborts the run.
#
# usage: bash tools/sanitize.sh [python]     (default: .venv/bin/python)
#
# The build happens in a scratch copy of the tree, so the in-place .so that
# everything else imports is left alone. The interpreter itself is not
# instrumented: libasan is preloaded into it, and PYTHONMALLOC=malloc routes
# Python's allocations through ASan so that overruns of Python objects show.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${1:-$root/.venv/bin/python}"
case "$python" in
  */*) python="$(cd "$(dirname "$python")" && pwd)/$(basename "$python")" ;;
  *) python="$(command -v "$python")" ;;
esac

libasan="$(gcc -print-file-name=libasan.so)"
if [ ! -e "$libasan" ]; then
  echo "sanitize: gcc has no libasan.so (install libasan or gcc's sanitizer runtime)" >&2
  exit 1
fi

scratch="$(mktemp -d "${TMPDIR:-/tmp}/moderato-sanitize.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
tree="$scratch/tree"
mkdir "$tree"
cp -R "$root/setup.py" "$root/pyproject.toml" "$root/csrc" "$root/moderato" "$root/lua" "$root/tests" \
  "$root/LICENSE" "$tree/"
[ -e "$root/README.md" ] && cp "$root/README.md" "$tree/"
find "$tree" \( -name '*.so' -o -name '__pycache__' \) -prune -exec rm -rf {} +

echo "== building moderato._accel with ASan and UBSan ($python)"
# -fno-wrapv undoes Python's -fwrapv, so a signed overflow is reported too.
(
  cd "$tree"
  CC=gcc MODERATO_STRICT_BUILD=1 \
    CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1 -g -fno-wrapv" \
    LDFLAGS="-fsanitize=address,undefined" \
    "$python" setup.py -q build_ext --inplace --build-temp "$scratch/build"
)

echo "== running tests/unit/test_accel.py under the sanitizers"
cd "$tree"
export ASAN_OPTIONS=detect_leaks=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export PYTHONMALLOC=malloc
# `python -m pytest` puts the scratch tree first on sys.path; make sure the
# sanitized build is the one imported before trusting a green run.
LD_PRELOAD="$libasan" "$python" -c '
import sys
import moderato._accel as accel
if not accel.__file__.startswith(sys.argv[1]):
    sys.exit(f"sanitize: imported {accel.__file__}, not the sanitized build")
' "$tree/"
# --capture=no: a sanitizer report goes to fd 2 just before the process dies,
# which pytest would otherwise have redirected into a file nobody reads.
LD_PRELOAD="$libasan" "$python" -m pytest -q -p no:cacheprovider --capture=no tests/unit/test_accel.py \
  tests/redis/test_accel_on_redis.py \
  tests/unit/test_accel_results.py
# memory:// (csrc/memory.c): every store method and every algorithm. The slow test
# (1,000,000 identities) asserts RSS bounds, which ASan's allocator does not keep.
# The differential test drives every algorithm through the store from any stored
# state, refusals included (it starts its own redis-server). test_memory_table.py
# grows and shrinks the table through its incremental resizes and identity index.
echo "== running tests/unit/test_memory_backend.py, test_differential.py, test_store_sweep.py, test_memory_table.py and test_fast_check.py under the sanitizers"
LD_PRELOAD="$libasan" "$python" -m pytest -q -p no:cacheprovider --capture=no \
  -m "not slow" tests/unit/test_memory_backend.py tests/test_differential.py \
  tests/unit/test_store_sweep.py tests/unit/test_memory_table.py tests/unit/test_fast_check.py
# The blocking limiter's one-call check over Redis (csrc/fast_redis.c), against its own
# redis-servers; its leak test asserts RSS bounds, which ASan's allocator does not keep.
echo "== running tests/redis/test_fast_redis.py under the sanitizers"
LD_PRELOAD="$libasan" "$python" -m pytest -q -p no:cacheprovider --capture=no \
  -k "not no_leaks" tests/redis/test_fast_redis.py
# The asyncio limiter's one-call check over Redis (csrc/fast_aredis.c) and the asyncio
# connection's per-command path (csrc/connection_core.c), which every client test
# drives (twice: the C steps and their Python reference).
echo "== running tests/redis/test_fast_aredis.py and test_redis_client.py under the sanitizers"
LD_PRELOAD="$libasan" "$python" -m pytest -q -p no:cacheprovider --capture=no \
  -k "not no_leaks" tests/redis/test_fast_aredis.py tests/redis/test_redis_client.py
# The headers middleware's send wrapper (csrc/fast_route.c) against its Python reference,
# and the HTTP tests that send through it.
echo "== running tests/unit/test_header_sender.py and test_route_facts.py under the sanitizers"
LD_PRELOAD="$libasan" "$python" -m pytest -q -p no:cacheprovider --capture=no \
  tests/unit/test_header_sender.py tests/http/test_route_facts.py
# A loop turn's checks joined in C (csrc/grouping.c) against grouping.py's steps: random
# turns, the replies handed out, a real client's turns joined both ways; and the client's
# batching tests, which join every turn both ways (the exact-N runs' worker processes
# are left out: ASan's preload in 4 more interpreters is minutes of a shared machine).
echo "== running tests/redis/test_grouping_in_c.py and test_grouping.py under the sanitizers"
LD_PRELOAD="$libasan" "$python" -m pytest -q -p no:cacheprovider --capture=no \
  -k "not no_leaks and not four_processes" tests/redis/test_grouping_in_c.py \
  tests/redis/test_grouping.py
