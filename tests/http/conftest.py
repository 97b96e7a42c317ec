"""Tests through the web integrations: ASGI apps in process and under uvicorn, Django
in process and under gunicorn and uvicorn, the examples and the migration guides, on
memory:// and on redis-server processes they start themselves.

redis-server is looked for when this folder is collected: a missing binary stops the
run here with the install hint, and never turns into skipped tests.
"""

from __future__ import annotations

from redis_servers import redis_server_binary

redis_server_binary()
