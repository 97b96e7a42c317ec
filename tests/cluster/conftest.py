"""Tests against a Redis Cluster (tests/cluster.py: redis-server nodes joined with
redis-cli) and against Sentinel (redis-server --sentinel), both started here.

redis-server and redis-cli are looked for when this folder is collected: a missing
binary stops the run here with the install hint, and never turns into skipped tests.
"""

from __future__ import annotations

from cluster import redis_cli_binary
from redis_servers import redis_server_binary

redis_server_binary()
redis_cli_binary()
