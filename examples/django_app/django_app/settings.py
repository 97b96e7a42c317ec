"""Settings of the example project: the MODERATO dict and DRF's throttle settings."""

from __future__ import annotations

import os
import sys
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent.parent
# The examples share their backend choice (examples/backend_choice.py), imported
# from the repository's root as the other examples import it.
REPOSITORY = PROJECT_DIR.parent.parent
if str(REPOSITORY) not in sys.path:
    sys.path.append(str(REPOSITORY))

from examples.backend_choice import backend_url  # noqa: E402

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-a-secret")
DEBUG = os.environ.get("DJANGO_DEBUG") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]
ROOT_URLCONF = "django_app.urls"
WSGI_APPLICATION = "django_app.wsgi.application"
USE_TZ = True
DATABASES: dict[str, dict[str, str]] = {}  # the example stores nothing

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",  # AnonymousUser; no database is used
    "rest_framework",
    "moderato.django",  # checks MODERATO when each process starts
    "shop",
]

MIDDLEWARE = [
    "shop.middleware.ServedBy",
    "django.middleware.common.CommonMiddleware",
    "shop.middleware.DemoUser",  # stands in for your authentication
    "moderato.django.RateLimitMiddleware",
]

REDIS_URL = backend_url("django_app")

MODERATO = {
    "URL": REDIS_URL,
    "KEY_PREFIX": "django-example",
    "DEFAULT_ALGORITHM": "sliding_window",
    "FAIL_OPEN": False,  # Redis down: 503, nothing let through
    # Under ASGI a reply waits for the event loop to get to it: a burst of requests
    # on a small machine can hold it past the default 0.5 s (then 503, fail closed).
    "COMMAND_TIMEOUT_S": 2.0,
    "TRUSTED_PROXIES": [],  # e.g. ["10.0.0.0/8"] behind a load balancer
    "RATE": "10000/hour",  # every path but the exempt ones, per client address
    "EXEMPT_PATHS": ["/healthz"],
    "DENIAL_VIEW": None,  # or "shop.views.ratelimited" to render denials yourself
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["shop.auth.DemoUserAuthentication"],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    "DEFAULT_THROTTLE_CLASSES": [
        "moderato.django.throttling.AnonRateThrottle",
        "moderato.django.throttling.UserRateThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": {"anon": "10/minute", "user": "20/minute", "uploads": "3/minute"},
}

# Django's cache, for DRF's own AnonRateThrottle (the /api/drf-anon/ comparison):
# the same Redis when there is one, so that DRF's own throttle shares its counts
# across workers as well as a cache can.
if REDIS_URL.startswith("redis://"):
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "django-example-cache",
        }
    }

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"moderato": {"handlers": ["console"], "level": "WARNING"}},
}
