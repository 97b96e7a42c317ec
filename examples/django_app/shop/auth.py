"""The example's stand-in for authentication (``X-Demo-User: <id>``); never do this for real."""

from __future__ import annotations

from typing import Any, Optional


class DemoUser:
    """An authenticated user known only by its primary key."""

    is_authenticated = True
    is_anonymous = False

    def __init__(self, pk: str) -> None:
        self.pk = int(pk)

    def __str__(self) -> str:
        return f"user {self.pk}"


class DemoUserAuthentication:
    """REST framework authentication from the ``X-Demo-User`` header."""

    def authenticate(self, request: Any) -> Optional[tuple[DemoUser, None]]:
        user_id = request.headers.get("X-Demo-User", "")
        return (DemoUser(user_id), None) if user_id.isdigit() else None
