# Every target creates what it needs; `make test` works on a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# Extra pytest arguments for test, test-fast and test-cov: make test-cov PYTEST_ARGS=tests/test_limiter.py
PYTEST_ARGS ?=
# Development builds treat compiler warnings as errors (setup.py reads this);
# a user's `pip install` does not. MODERATO_STRICT_BUILD=0 make ... turns it off.
export MODERATO_STRICT_BUILD ?= 1

.PHONY: test test-py39 test-fast test-cov lint format build redis chromium accel-matrix sanitize install-check bench bench-quick bench-deps demo demo-env quickstart algorithms-demo clean

$(VENV)/.installed: pyproject.toml setup.py moderato/_version.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

build: $(VENV)/.installed
	$(PY) setup.py -q build_ext --inplace

redis:
	bash tools/ensure-redis.sh

chromium:
	bash tools/ensure-chromium.sh

test: build redis chromium
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-fast: build redis chromium
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

# The suite under coverage of the Python package (moderato/; the C accelerator and
# the Lua scripts are not measured): the report is printed (lines missed per module)
# and written to coverage.xml (Cobertura XML, as CI services read it).
test-cov: build redis chromium
	$(PY) -m pytest -q --cov=moderato --cov-report=term-missing:skip-covered \
		--cov-report=xml:coverage.xml $(PYTEST_ARGS)

# Lint, types, and the formatting check: the committed tree is always `make format`ted.
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check moderato tests benchmarks examples
	$(VENV)/bin/ruff format --check moderato tests benchmarks examples
	$(VENV)/bin/mypy --strict moderato

format: $(VENV)/.installed
	$(VENV)/bin/ruff check --select I --fix moderato tests benchmarks examples
	$(VENV)/bin/ruff format moderato tests benchmarks examples

# The suite on the oldest supported Python (3.9), in its own venv: every test but
# the `slow` ones (load, fault and timing runs, which `make test` runs on the
# default Python), so CI stays near half an hour. Run them too with
# `make test-py39 PY39_MARKS=`.
PY39_MARKS ?= not slow
test-py39: redis chromium
	bash tools/suite_on_python.sh 9 $(if $(PY39_MARKS),-m "$(PY39_MARKS)")

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

# The demo's own small environment (.venv-demo, the `demo` extra): moderato with its
# C accelerator built in place, FastAPI, Prometheus metrics and uvicorn; none of the
# test, lint or benchmark tools, so a fresh clone serves the demo within seconds.
DEMO_VENV ?= .venv-demo
DEMO_PY   := $(DEMO_VENV)/bin/python
DEMO_PORT ?= 8000

# The venv gets no pip of its own when $(PYTHON)'s pip can install into it (pip >= 22.3:
# --python); installing pip into a venv costs more CPU than building the accelerator.
$(DEMO_VENV)/.installed: pyproject.toml setup.py moderato/_version.py $(wildcard csrc/*.c csrc/*.h)
	test -x $(DEMO_PY) || $(PYTHON) -m venv --without-pip $(DEMO_VENV)
	if $(PYTHON) -m pip --python $(DEMO_PY) --version >/dev/null 2>&1; then \
		$(PYTHON) -m pip --python $(DEMO_PY) install -q -e '.[demo]'; \
	else \
		$(DEMO_PY) -m ensurepip -q && $(DEMO_PY) -m pip install -q -e '.[demo]'; \
	fi
	touch $@

demo-env: $(DEMO_VENV)/.installed

# The algorithm comparison (examples/algorithms_demo.py, the table), then the demo
# app and its live page on http://127.0.0.1:8000/ (DEMO_PORT; the operator's dashboard at
# /ratelimits/, open to anyone on this loopback address). Backend: MODERATO_REDIS_URL,
# else the Redis on localhost:6379 if one answers, else memory://.
demo: demo-env
	$(DEMO_PY) examples/algorithms_demo.py --no-chart
	$(DEMO_PY) -m uvicorn examples.fastapi_app:app --host 127.0.0.1 --port $(DEMO_PORT)

quickstart: demo-env
	$(DEMO_PY) examples/quickstart.py

algorithms-demo: build
	$(PY) examples/algorithms_demo.py --chart docs/algorithms.png

clean:
	rm -rf build dist *.egg-info moderato/*.so .pytest_cache .mypy_cache .ruff_cache test-artifacts \
		.coverage coverage.xml
