"""The Django integration needs Django: say which extra installs it, not just what is missing."""

from __future__ import annotations

import importlib.util

MISSING_DJANGO = (
    "moderato.django (the limit() decorator, RateLimitMiddleware and the REST framework "
    "throttles) needs Django, which is not installed: pip install 'moderato[django]' "
    "(Django 4.2 or later, on Python 3.10 or later)"
)


def require_django() -> None:
    """Raise ImportError naming the extra to install if Django cannot be imported."""
    try:
        found = importlib.util.find_spec("django") is not None
    except (ImportError, ValueError):  # a broken or stubbed-out entry in sys.modules
        found = False
    if not found:
        raise ImportError(MISSING_DJANGO, name="django")


# Imported first by the package: the modules after it import Django at once.
require_django()
