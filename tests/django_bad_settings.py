"""The example project's settings with one bad MODERATO key (tests/http/test_django_servers.py)."""

from __future__ import annotations

from django_app.settings import *  # noqa: F403
from django_app.settings import MODERATO

MODERATO = {**MODERATO, "FAIL_OPEN": "no"}
