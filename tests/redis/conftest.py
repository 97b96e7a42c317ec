"""Tests against redis-server processes they start themselves (tests/redis_servers.py):
the limiters, the clients, the scripts, faults, TLS, ACLs, fork.

redis-server is looked for when this folder is collected: a missing binary stops the
run here with the install hint, and never turns into skipped tests.
"""

from __future__ import annotations

from redis_servers import redis_server_binary

redis_server_binary()
