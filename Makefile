# Every target creates what it needs; `make test` works on a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# Development builds treat compiler warnings as errors (setup.py reads this);
# a user's `pip install` does not. MODERATO_STRICT_BUILD=0 make ... turns it off.
export MODERATO_STRICT_BUILD ?= 1

.PHONY: test test-py39 test-fast lint format build redis chromium accel-matrix sanitize install-check bench bench-quick bench-deps demo quickstart algorithms-demo clean

$(VENV)/.installed: pyproject.toml setup.py moderato/_version.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -e '.[dev,demo]'
	touch $@

build: $(VENV)/.installed
	$(PY) setup.py -q build_ext --inplace

redis:
	bash tools/ensure-redis.sh

chromium:
	bash tools/ensure-chromium.sh

test: build redis chromium
	$(PY) -m pytest -q

test-fast: build redis chromium
	$(PY) -m pytest -q -m "not slow"

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check moderato tests benchmarks examples
	$(VENV)/bin/mypy --strict moderato

format: $(VENV)/.installed
	$(VENV)/bin/ruff format moderato tests benchmarks examples

# The whole suite on the oldest supported Python (3.9), in its own venv.
test-py39: redis chromium
	bash tools/suite_on_python.sh 9

accel-matrix: redis
	bash tools/accel_matrix.sh

sanitize: build redis
	bash tools/sanitize.sh $(PY)

# Install as a user does (sdist -> wheel -> fresh venv) on the oldest and newest
# supported Pythons, and check the install from outside the tree, Redis included.
install-check: $(VENV)/.installed redis
	bash tools/install_check.sh 9 13

# Benchmarks: the peers (limits, slowapi, fastapi-limiter), uvicorn[standard],
# matplotlib and py-spy come from the `bench` extra, wrk from Debian. Each run
# writes benchmarks/results/run-*.json; the charts are redrawn from the newest.
$(VENV)/.bench-installed: $(VENV)/.installed pyproject.toml
	$(PY) -m pip install -q -e '.[bench]'
	touch $@

bench-deps: build redis $(VENV)/.bench-installed
	bash tools/ensure-wrk.sh

bench: bench-deps
	$(PY) benchmarks/performance.py
	$(PY) benchmarks/plot.py

# A smoke run of every section (about a fifth of `make bench`); it leaves the
# published charts alone.
bench-quick: bench-deps
	$(PY) benchmarks/performance.py --quick

# The demo app and its live page on http://127.0.0.1:8000/ (memory:// unless
# MODERATO_REDIS_URL is set).
demo: build
	$(PY) -m uvicorn examples.fastapi_app:app --host 127.0.0.1 --port 8000

quickstart: build
	$(PY) examples/quickstart.py

algorithms-demo: build
	$(PY) examples/algorithms_demo.py --chart docs/algorithms.png

clean:
	rm -rf build dist *.egg-info moderato/*.so .pytest_cache .mypy_cache .ruff_cache test-artifacts
