"""The Django application: with ``"moderato.django"`` in INSTALLED_APPS, MODERATO is checked
at start-up."""

from __future__ import annotations

from django.apps import AppConfig


class ModeratoConfig(AppConfig):  # type: ignore[misc]
    name = "moderato.django"
    label = "moderato"
    verbose_name = "moderato rate limits"

    def ready(self) -> None:
        # Every process checks MODERATO once its settings are loaded, before
        # serving: a bad key stops runserver, manage.py check and each gunicorn or
        # uvicorn worker with ImproperlyConfigured naming it, not the first request.
        from .limiters import get_settings

        get_settings()
