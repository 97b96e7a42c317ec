# Every target creates what it needs; `make test` works on a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python

.PHONY: test test-fast lint format build redis chromium accel-matrix sanitize wheel-check bench bench-quick demo quickstart algorithms-demo clean

$(VENV)/.installed: pyproject.toml setup.py
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

accel-matrix: redis
	bash tools/accel_matrix.sh

sanitize: build redis
	bash tools/sanitize.sh $(PY)

wheel-check: $(VENV)/.installed
	bash tools/wheel_check.sh $(PY)

bench: build redis
	$(PY) benchmarks/performance.py

bench-quick: build redis
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
