"""Which backend the examples run on, and the start-up line that says so.

In this order:

1. ``MODERATO_REDIS_URL``, when it is set (``memory://`` included);
2. the Redis the README starts (``docker compose -f docker-compose.dev.yml up``),
   ``redis://localhost:6379``, when a Redis answers PING there;
3. ``memory://``, in process, so an example also runs on a machine without Redis.

Each example calls ``backend_url("<its name>")`` once at start-up; the line
it logs names the URL (without a password) and why it was chosen.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from typing import Optional
from urllib.parse import urlsplit

DEFAULT_REDIS_URL = "redis://localhost:6379"
MEMORY_URL = "memory://"
PROBE_TIMEOUT_S = 0.3

logger = logging.getLogger("moderato.demo")


def _ping(url: str, timeout_s: float) -> Optional[str]:
    """None when a Redis at ``url`` answers PING without a password, else what happened."""
    parts = urlsplit(url)
    host, port = parts.hostname or "localhost", parts.port or 6379
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as connection:
            connection.sendall(b"PING\r\n")
            reply = connection.recv(128)
    except OSError as error:
        return f"nothing answered at {host}:{port} ({error.strerror or error})"
    if reply.startswith(b"+PONG"):
        return None
    if reply.startswith(b"-NOAUTH"):
        return f"the Redis at {host}:{port} wants a password: put it in MODERATO_REDIS_URL"
    return f"{host}:{port} did not answer PING as Redis does ({reply[:40]!r})"


def choose_backend(
    environ: Mapping[str, str] = os.environ,
    default_url: str = DEFAULT_REDIS_URL,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> tuple[str, str]:
    """The backend URL an example uses, and why."""
    configured = environ.get("MODERATO_REDIS_URL")
    if configured:
        return configured, "MODERATO_REDIS_URL"
    trouble = _ping(default_url, timeout_s)
    if trouble is None:
        return default_url, "a Redis answers there; MODERATO_REDIS_URL chooses another backend"
    return MEMORY_URL, f"in process: {trouble}; start Redis or set MODERATO_REDIS_URL"


def shown(url: str) -> str:
    """``url`` with any password replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def _visible() -> None:
    # The line must reach the terminal under uvicorn, which configures only its
    # own loggers: a handler of our own unless the application set up logging.
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
        logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)


def backend_url(example: str, environ: Mapping[str, str] = os.environ) -> str:
    """The backend URL for ``example``, logged once as the example starts."""
    url, reason = choose_backend(environ)
    _visible()
    logger.info("%s: backend %s (%s)", example, shown(url), reason)
    return url
