"""The configuration error of the Django integration: Django's and moderato's at once."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from ..errors import RateLimitConfigError


class ModeratoImproperlyConfigured(ImproperlyConfigured, RateLimitConfigError):  # type: ignore[misc]
    """A bad ``MODERATO`` setting or ``limit()`` argument.

    Django's ``ImproperlyConfigured`` (what a Django project expects from bad
    settings, and what ``manage.py check`` and the servers report at start-up)
    and moderato's ``RateLimitConfigError`` (what the rest of moderato raises),
    so either ``except`` catches it. The message names the setting or argument.
    """
