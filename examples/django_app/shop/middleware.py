"""Two small middlewares of the example (neither is part of moderato).

``ServedBy`` names the worker process that answered (``X-Served-By``), to
watch several workers share one quota. ``DemoUser`` stands in for real
authentication: ``X-Demo-User: 42`` makes the request user 42. Never trust
a header for identity in a real project.
"""

from __future__ import annotations

import os
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.contrib.auth.models import AnonymousUser
from django.http import HttpRequest

from . import auth


class _Middleware:
    """Serves sync and async stacks alike: ``before(request)``, then ``after(response)``."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self._async_call(request)
        self.before(request)
        return self.after(self.get_response(request))

    async def _async_call(self, request: HttpRequest) -> Any:
        self.before(request)
        return self.after(await self.get_response(request))

    def before(self, request: HttpRequest) -> None:
        pass

    def after(self, response: Any) -> Any:
        return response


class ServedBy(_Middleware):
    def after(self, response: Any) -> Any:
        response["X-Served-By"] = str(os.getpid())  # read per response: gunicorn forks
        return response


class DemoUser(_Middleware):
    def before(self, request: HttpRequest) -> None:
        user_id = request.headers.get("X-Demo-User", "")
        request.user = auth.DemoUser(user_id) if user_id.isdigit() else AnonymousUser()
