"""Other rate-limit libraries' keywords, and what moderato calls them.

Someone moving from slowapi, Flask-Limiter, fastapi-limiter or limits writes
their keywords from habit: ``key_func=``, ``per_method=``, ``storage_uri=``.
Python would answer with a TypeError naming whichever internal function
received the keyword; ``unknown_option`` names the call that was written and
the moderato way to say it instead (docs/migrating-from-slowapi.md and
docs/migrating-from-fastapi-limiter.md have the long form).
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable

from .errors import UnknownOptionError

_KEY = "moderato's is key=: a string, or a callable of the request (sync or async)"
_HANDLER = (
    "register an exception handler for moderato.RateLimitExceeded (docs/http.md) "
    "to shape the denial"
)
_ONE_RATE = (
    "is fastapi-limiter's; moderato takes the rate as one string, the first argument: "
    'times=2, seconds=5 is "2/5 seconds"'
)

HABITS: dict[str, str] = {
    # The rules: limit(), dependency(), RateLimitMiddleware, install(rate=...).
    "key_func": f"key_func= is slowapi's name (and Flask-Limiter's); {_KEY}",
    "identifier": f"identifier= is fastapi-limiter's name; {_KEY}",
    "limit_value": (
        "limit_value= is slowapi's name; moderato's is rate=, the first argument: \"5/minute\""
    ),
    "per_method": (
        "per_method= is slowapi's option; moderato always counts each method on its own "
        "(HEAD with GET): a rule's default scope is the method and the route template, "
        'and scope="name" shares one bucket across methods and routes'
    ),
    "methods": (
        "methods= is slowapi's option; to limit some methods only, skip the others: "
        'exempt_when=lambda request: request.method not in ("POST",)'
    ),
    "error_message": (
        "error_message= is slowapi's option; moderato answers a denial with its own "
        f"429 body: {_HANDLER}"
    ),
    "override_defaults": (
        "override_defaults= is slowapi's option; moderato enforces every limit that "
        "applies to a request: give routes that need other limits a router without the "
        "shared dependency"
    ),
    "deduct_when": (
        "deduct_when= is Flask-Limiter's option; moderato charges a request when it is "
        "admitted, before the endpoint runs, and never charges a denied one"
    ),
    "on_breach": f"on_breach= is Flask-Limiter's option; {_HANDLER}",
    "callback": f"callback= is fastapi-limiter's option; {_HANDLER}",
    "http_callback": f"http_callback= is fastapi-limiter's option; {_HANDLER}",
    "ws_callback": (
        "ws_callback= is fastapi-limiter's option; a refused websocket handshake is "
        "answered by moderato (docs/http.md, Websockets), and limiter.message_limit() "
        "returns a decision for each message instead of calling back"
    ),
    "skip": (
        "skip= is fastapi-limiter's name; moderato's is exempt_when=: a predicate of the "
        "request (sync or async) that returns True to skip the limit"
    ),
    "blocking": (
        "blocking= is fastapi-limiter's option; moderato never holds a request to wait "
        "for quota: a denial is answered at once, with Retry-After"
    ),
    "times": f"times= {_ONE_RATE}",
    "milliseconds": f"milliseconds= {_ONE_RATE}",
    "seconds": f"seconds= {_ONE_RATE}",
    "minutes": f"minutes= {_ONE_RATE}",
    "hours": f"hours= {_ONE_RATE}",
    "strategy": (
        "strategy= is slowapi's name (limits' strategies); moderato's is algorithm= on a "
        "rule and default_algorithm= on RateLimiter: fixed_window (limits' fixed-window), "
        "sliding_log (moving-window), sliding_window (sliding-window-counter), "
        "token_bucket, gcra or leaky_bucket"
    ),
    # The limiter: RateLimiter(...), FastAPILimiter.init(...).
    "storage_uri": (
        "storage_uri= is slowapi's name; moderato's is redis_url, the first argument: "
        'RateLimiter("redis://host:6379"), or "memory://" for one process'
    ),
    "storage_options": (
        "storage_options= is slowapi's option; moderato takes connection settings as "
        "options of RateLimiter (connect_timeout_s=, command_timeout_s=, ssl_context=, "
        "client_name=) or in the URL, or your own redis.asyncio client in place of the URL"
    ),
    "redis": (
        "redis= is fastapi-limiter's name; moderato takes the Redis URL, or your own "
        "redis.asyncio client, as RateLimiter's first argument"
    ),
    "prefix": "prefix= is fastapi-limiter's name; moderato's is key_prefix= on RateLimiter",
    "default_limits": (
        "default_limits= is slowapi's option; moderato's is a dependency on the app or a "
        'router: FastAPI(dependencies=[Depends(limiter.dependency("100/minute"))])'
    ),
    "application_limits": (
        "application_limits= is slowapi's option; moderato's is one app-wide limit: "
        'install(app, limiter, rate="1000/minute")'
    ),
    "headers_enabled": (
        "headers_enabled= is slowapi's option; moderato sends the rate-limit headers by "
        'default: install(app, limiter, headers="legacy", "ietf", "both" or None)'
    ),
    "swallow_errors": "swallow_errors= is slowapi's name; moderato's is fail_open=True",
    "in_memory_fallback": (
        "in_memory_fallback= is slowapi's option; moderato has no per-process fallback "
        "(it would give every worker a fresh quota during an outage): it fails closed, "
        "or open with fail_open=True"
    ),
    "in_memory_fallback_enabled": (
        "in_memory_fallback_enabled= is slowapi's option; moderato has no per-process "
        "fallback (it would give every worker a fresh quota during an outage): it fails "
        "closed, or open with fail_open=True"
    ),
    "retry_after": (
        "retry_after= is slowapi's option; moderato always sends Retry-After in whole "
        "seconds on a 429"
    ),
    "enabled": (
        "enabled= is slowapi's option; moderato's shadow=True decides and counts but "
        "never denies (docs/testing.md shows how to lift limits in tests)"
    ),
    "auto_check": (
        "auto_check= is slowapi's option; moderato checks the routes you limit (a "
        'decorator, a dependency, or install(app, limiter, rate="...") for every route)'
    ),
    "key_style": (
        "key_style= is slowapi's option; moderato's buckets follow route templates "
        '("GET:/users/{user_id}"), and scope="name" on a rule names one'
    ),
    "config_filename": "config_filename= is slowapi's option; pass moderato's options in code",
}
"""Other libraries' keywords moderato does not take, with what to write instead."""


LIMITS_STRATEGIES: dict[str, str] = {
    "fixed-window": "fixed_window",
    "moving-window": "sliding_log",
    "sliding-window-counter": "sliding_window",
}
"""limits' (and so slowapi's) strategy names, and moderato's algorithm for each."""


def algorithm_hint(name: object, known: Collection[str]) -> str:
    """What an unknown algorithm name was probably meant to be: ``" (...)"``, or ""."""
    if not isinstance(name, str):
        return ""
    spelled = LIMITS_STRATEGIES.get(name.lower())
    if spelled is not None:
        return f" (limits' {name} is moderato's {spelled!r})"
    candidate = name.lower().replace("-", "_").replace(" ", "_")
    return f" (did you mean {candidate!r}?)" if candidate in known else ""


def refuse_unknown(where: str, given: Iterable[str], accepted: Collection[str]) -> None:
    """Raise UnknownOptionError for the first keyword in ``given`` not in ``accepted``."""
    for name in given:
        if name not in accepted:
            raise unknown_option(where, name, accepted)


def refuse_habits(where: str, given: Iterable[str], accepted: Collection[str]) -> None:
    """Raise UnknownOptionError for the first of ``given`` that is another library's keyword.

    For a call whose own TypeError already names it (``RateLimiter()``): only the
    keywords with advice to give are caught here.
    """
    for name in given:
        if name in HABITS and name not in accepted:
            raise unknown_option(where, name, accepted)


def unknown_option(where: str, name: str, accepted: Collection[str]) -> UnknownOptionError:
    """The error for keyword ``name`` given to ``where``, which takes ``accepted``."""
    habit = HABITS.get(name)
    if habit is not None:
        return UnknownOptionError(f"{where}: {habit}")
    close = difflib.get_close_matches(name, accepted, n=1)
    hint = f" (did you mean {close[0]}=?)" if close else ""
    return UnknownOptionError(
        f"{where} got an unexpected keyword argument {name}={hint}; "
        f"its options are {', '.join(sorted(accepted))}"
    )
