"""Who is asking, in a Django request: django-ratelimit's key names, dotted paths, callables.

``key=`` of ``limit()`` (and ``MODERATO['KEY']``, the default) takes:

- ``"ip"``: the client address: ``REMOTE_ADDR``, or, only when that peer is
  one of ``MODERATO['TRUSTED_PROXIES']``, the right-most untrusted hop of
  ``MODERATO['PROXY_HEADER']`` (web/addresses.py: the ASGI integration's rules);
- ``"user"``: the authenticated user's primary key (``user:<pk>``); every
  anonymous request shares the one identity ``user:anonymous``;
- ``"user_or_ip"``: the user's primary key when authenticated, else the address;
- ``"header:<name>"``, ``"get:<name>"``, ``"post:<name>"``: that request
  header's, query parameter's or form field's value (``header:x-api-key:<value>``;
  requests without it share one identity, as in django-ratelimit);
- a dotted path to a callable of the request (``"myapp.limits.api_key"``), or
  the callable itself; it returns a str or bytes (in an async view it may be
  a coroutine function).

Identities of different kinds never meet: a user is ``user:<pk>``, a header
value ``header:<name>:<value>``, so a client cannot send a value spelling
another client's address and drain that quota.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

from asgiref.sync import sync_to_async
from django.http import HttpRequest

from ..errors import RateLimitConfigError
from ..options import request_callback_option
from ..web.addresses import ProxyRules
from .callbacks import RequestFunction, call_async, call_sync, imported, unusable

Identity = Union[str, bytes]

ANONYMOUS = "user:anonymous"
"""The one identity of every anonymous request under ``key="user"``."""

NAMES = ("ip", "user", "user_or_ip", "header:<name>", "get:<name>", "post:<name>")


def client_address(request: HttpRequest, rules: ProxyRules) -> str:
    """The client's address: ``REMOTE_ADDR``, or a forwarded hop only a trusted proxy
    vouches for (``rules``: ``MODERATO['TRUSTED_PROXIES']`` and ``['PROXY_HEADER']``)."""
    return rules.client_address(request.META.get("REMOTE_ADDR"), _meta_values, request)


def _meta_values(request: HttpRequest, name: str) -> list[str]:
    # WSGI and ASGI servers join repeated header lines with ",", so one value
    # holds them all; X-Real-IP's last line is its last element.
    value = request.META.get("HTTP_" + name.upper().replace("-", "_"))
    if value is None:
        return []
    return value.rsplit(",", 1) if name == "x-real-ip" else [value]


def user_identity(user: Any) -> Optional[str]:
    """``user:<pk>`` for an authenticated user, None otherwise."""
    if user is not None and getattr(user, "is_authenticated", False):
        return f"user:{user.pk}"
    return None


async def async_user(request: HttpRequest) -> Any:
    """``request.user`` from async code: ``auser()`` (Django 5), else in a thread (4.2)."""
    auser = getattr(request, "auser", None)
    if auser is not None:
        return await auser()
    return await sync_to_async(lambda: getattr(request, "user", None))()


class KeySource:
    """One ``key=``: gives a request's identity, in a thread or on the event loop.

    ``function`` is a callable of the request (a user's, or one of the
    ``header:``/``get:``/``post:`` readers); None for ``"ip"``, ``"user"`` and
    ``"user_or_ip"``, which need the proxy rules of the settings in force.
    """

    def __init__(self, spec: object, function: Optional[RequestFunction] = None) -> None:
        self.spec = spec
        self.function = function

    def __repr__(self) -> str:
        return f"KeySource({self.spec!r})"

    def identify(self, request: HttpRequest, rules: ProxyRules) -> Identity:
        """The identity for a view running in a thread (sync views, WSGI)."""
        if self.function is not None:
            return _identity(call_sync("key", self.function, request))
        if self.spec == "ip":
            return client_address(request, rules)
        return self._of_user(request, getattr(request, "user", None), rules)

    async def aidentify(self, request: HttpRequest, rules: ProxyRules) -> Identity:
        """The identity for a view running on the event loop (async views under ASGI)."""
        if self.function is not None:
            return _identity(await call_async("key", self.function, request))
        if self.spec == "ip":
            return client_address(request, rules)
        return self._of_user(request, await async_user(request), rules)

    def _of_user(self, request: HttpRequest, user: Any, rules: ProxyRules) -> str:
        identity = user_identity(user)
        if identity is not None:
            return identity
        return ANONYMOUS if self.spec == "user" else client_address(request, rules)


def key_source(spec: object) -> KeySource:
    """The KeySource ``spec`` names; RateLimitConfigError for a spec no request could use."""
    if isinstance(spec, KeySource):
        return spec
    if callable(spec):
        request_callback_option("key", spec, "str or bytes")
        return KeySource(spec, spec)
    if not isinstance(spec, str) or not spec:
        raise RateLimitConfigError(
            f"key must be one of {', '.join(NAMES)}, a dotted path to a callable of the "
            f"request, or such a callable; got {spec!r:.80}"
        )
    if spec in ("ip", "user", "user_or_ip"):
        return KeySource(spec)
    kind, colon, name = spec.partition(":")
    if colon and kind in ("header", "get", "post"):
        if not name or any(character.isspace() for character in name):
            raise RateLimitConfigError(f"key {spec!r} needs a name after '{kind}:'")
        return KeySource(spec, _parameter(kind, name))
    if "." not in spec:
        raise RateLimitConfigError(
            f"key {spec!r} is not one of {', '.join(NAMES)} nor a dotted path to a callable"
        )
    function = imported("key", spec)
    request_callback_option("key", function, "str or bytes")
    return KeySource(spec, function)


def _parameter(kind: str, name: str) -> Callable[[HttpRequest], str]:
    prefix = f"{kind}:{name.lower() if kind == 'header' else name}:"
    if kind == "header":
        meta = "HTTP_" + name.upper().replace("-", "_")
        if name.lower() in ("content-type", "content-length"):
            meta = meta[5:]  # the two headers WSGI keeps without the HTTP_ prefix

        def header(request: HttpRequest) -> str:
            return prefix + str(request.META.get(meta, ""))

        return header
    if kind == "get":
        return lambda request: prefix + str(request.GET.get(name, ""))
    return lambda request: prefix + str(request.POST.get(name, ""))


def _identity(value: object) -> Identity:
    if not isinstance(value, (str, bytes)):
        raise unusable("key", f"returned {type(value).__name__}, not str or bytes")
    return value
