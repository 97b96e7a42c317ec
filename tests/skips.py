"""Skips the suite needs around the launchers of redis_servers.py (which runs without pytest)."""

from __future__ import annotations

from typing import Callable, TypeVar

import pytest

T = TypeVar("T")


def skip_without_tls(start: Callable[[], T]) -> T:
    """``start()``, or skip the test if this redis-server was built without TLS."""
    try:
        return start()
    except RuntimeError as error:
        if "tls" in str(error).lower():
            pytest.skip(f"this redis-server was built without TLS: {error}")
        raise
