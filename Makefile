# Every target creates what it needs; `make test` works on a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python

.PHONY: test test-fast lint format build redis accel-matrix sanitize wheel-check bench bench-quick demo clean

$(VENV)/.installed: pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

build: $(VENV)/.installed
	$(PY) setup.py -q build_ext --inplace

redis:
	bash tools/ensure-redis.sh

test: build redis
	$(PY) -m pytest -q

test-fast: build redis
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

demo: build
	$(PY) examples/quickstart.py

clean:
	rm -rf build dist *.egg-info moderato/*.so .pytest_cache .mypy_cache .ruff_cache
