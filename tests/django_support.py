"""Django, configured once per test process, for the in-process tests of moderato.django.

The suite runs on Python 3.9 too, where the django extra installs nothing
(Django 5 needs 3.10; moderato.django is supported on 3.10 to 3.13): each
Django test module starts with ``skip_unsupported_python()``.
"""

from __future__ import annotations

import sys

import pytest

UNSUPPORTED_PYTHON = (
    "moderato.django is supported on Python 3.10 and later (Django 5 needs 3.10); "
    "the django extra installs nothing on Python 3.9"
)

BASE_SETTINGS = {
    "DEBUG": False,
    "SECRET_KEY": "tests-only",
    "ALLOWED_HOSTS": ["*"],
    "ROOT_URLCONF": "django_views",
    "USE_TZ": True,
    "DATABASES": {},
    "INSTALLED_APPS": [
        "django.contrib.contenttypes",
        "django.contrib.auth",
        "rest_framework",
        "moderato.django",
    ],
    "MIDDLEWARE": [],
    "MODERATO": {"URL": "memory://", "KEY_PREFIX": "dj"},
    "REST_FRAMEWORK": {
        "DEFAULT_AUTHENTICATION_CLASSES": [],
        "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
        # Read by DRF when a view class is defined (django_views.DefaultApi).
        "DEFAULT_THROTTLE_CLASSES": [
            "moderato.django.throttling.AnonRateThrottle",
            "moderato.django.throttling.UserRateThrottle",
        ],
        "DEFAULT_THROTTLE_RATES": {"anon": "3/minute", "user": "4/minute", "uploads": "2/minute"},
    },
}


def skip_unsupported_python() -> None:
    if sys.version_info < (3, 10):
        pytest.skip(UNSUPPORTED_PYTHON, allow_module_level=True)


def configure() -> None:
    """Configure Django for this process once (the in-process tests share it)."""
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(**BASE_SETTINGS)
        django.setup()
