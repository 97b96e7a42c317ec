# syntax=docker/dockerfile:1
#
# Four targets, one file (docker-compose.yml picks them):
#   builder    compiles the C accelerator and builds the moderato wheel
#   runtime    the demo apps: the wheel with its fastapi and metrics extras plus
#              uvicorn, as a non-root user; no compiler, no source tree, no test tools
#   test       the source tree with compilers, redis-server and chromium: `make test`
#   benchmark  the wheel with the benchmark peers, and redis-server: the quick benchmark

ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE ./
COPY csrc ./csrc
COPY moderato ./moderato
COPY lua ./lua
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

FROM ${PYTHON_IMAGE} AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# The wheel is mounted for the install only: it does not stay in a layer.
RUN --mount=type=bind,from=builder,source=/dist,target=/tmp/dist \
    python -m pip install --no-cache-dir "$(ls /tmp/dist/moderato-*.whl)[all]" "uvicorn>=0.23"
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin app
WORKDIR /app
COPY examples ./examples
USER app
EXPOSE 8000 8001
CMD ["uvicorn", "examples.fastapi_app:app", "--host", "0.0.0.0", "--port", "8000"]

FROM ${PYTHON_IMAGE} AS test
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        build-essential make redis-server redis-tools chromium fonts-liberation \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --uid 10002 --create-home tester
WORKDIR /src
COPY --chown=tester . .
USER tester
# The suite starts its own throwaway redis-server processes on loopback ports.
RUN make build
CMD ["make", "test"]

FROM ${PYTHON_IMAGE} AS benchmark
RUN apt-get update \
    && apt-get install -y --no-install-recommends redis-server redis-tools wrk \
    && rm -rf /var/lib/apt/lists/*
RUN --mount=type=bind,from=builder,source=/dist,target=/tmp/dist \
    python -m pip install --no-cache-dir "$(ls /tmp/dist/moderato-*.whl)[bench]"
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin app
WORKDIR /app
# Only the harness (with its apps and wrk script) and the Redis and cluster
# launchers it shares with the tests: moderato itself is the installed wheel,
# never a source tree on the path.
COPY benchmarks/*.py benchmarks/wrk_report.lua ./benchmarks/
COPY benchmarks/apps ./benchmarks/apps
COPY tests/redis_servers.py tests/cluster.py ./tests/
RUN mkdir -p benchmarks/results && chown app benchmarks/results
USER app
CMD ["python", "benchmarks/performance.py", "--quick"]
