"""Tests against a Redis Cluster (tests/cluster.py: redis-server nodes joined with
redis-cli) and against Sentinel (redis-server --sentinel), both started here.

redis-server and redis-cli are looked for when this folder is collected: a missing
binary stops the run here with the install hint, and never turns into skipped tests.

The cluster fixtures, started only for the tests that ask for them: ``cluster``, one
per module, which its tests share (own key prefixes); ``own_cluster``, one per test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cluster import RedisCluster, redis_cli_binary
from redis_servers import redis_server_binary, running

redis_server_binary()
redis_cli_binary()


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[RedisCluster]:
    """The module's shared cluster: 3 primaries with a replica each, or with the number
    of replicas the module sets in ``CLUSTER_REPLICAS``. Its tests use their own keys."""
    yield from running(RedisCluster(replicas=getattr(request.module, "CLUSTER_REPLICAS", 1)))


@pytest.fixture
def own_cluster() -> Iterator[RedisCluster]:
    """A cluster for one test, free to be resharded or lose a primary."""
    yield from running(RedisCluster())
