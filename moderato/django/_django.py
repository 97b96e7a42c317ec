"""The Django integration needs Django: say which extra installs it, not just what is missing."""

from __future__ import annotations

from ..extras import require

MISSING_DJANGO = (
    "moderato.django (the limit() decorator, RateLimitMiddleware and the REST framework "
    "throttles) needs Django, which is not installed: pip install 'moderato[django]' "
    "(Django 4.2 or later, on Python 3.10 or later)"
)

# Imported first by the package: the modules after it import Django at once.
require("django", MISSING_DJANGO)
