"""``settings.MODERATO``: one dict, checked whole, each bad entry an error naming its key.

::

    MODERATO = {
        "URL": "redis://localhost:6379",     # or "memory://", "redis+cluster://...", ...
        "KEY_PREFIX": "myproject",
        "DEFAULT_ALGORITHM": "sliding_window",
        "FAIL_OPEN": False,
        "TRUSTED_PROXIES": ["10.0.0.0/8"],
        "RATE": "1000/hour",                 # RateLimitMiddleware's app-wide limit
        "EXEMPT_PATHS": ["/healthz"],
    }

Every key is optional; ``SETTINGS`` below lists them with their defaults and
which ``RateLimiter`` option each one sets. A key not in that list, or a value
of the wrong type or range, raises ``ImproperlyConfigured`` (as a
``ModeratoImproperlyConfigured``) naming ``MODERATO['<KEY>']``.

When: at start-up, in ``AppConfig.ready()``, when ``"moderato.django"`` is in
``INSTALLED_APPS`` (so ``manage.py check``, ``runserver``, and every gunicorn
or uvicorn worker refuse to start on a bad setting, before the first request);
otherwise when first used: when RateLimitMiddleware is loaded (Django loads
middleware as it builds its handler, before serving), or on the first
decorated request. The check builds no connection: Redis may be down at
start-up, and requests then get the failure policy's answer.
"""

from __future__ import annotations

import difflib
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from ..algorithms import DEFAULT_ALGORITHM, get_algorithm
from ..errors import RateLimitConfigError
from ..failure_log import DEFAULT_INTERVAL_S
from ..keys import KeySpace
from ..options import count_option, seconds_option
from ..redis.blocking import DEFAULT_MAX_CONNECTIONS
from ..web.addresses import ProxyRules, check_proxy_header, parse_networks
from ..web.headers import HeaderStyle, validate_style
from ..web.paths import ExemptPaths
from .errors import ModeratoImproperlyConfigured

SETTING = "MODERATO"


@dataclass(frozen=True)
class Entry:
    """One key of ``MODERATO``: its default and the check that turns a value into what is used."""

    default: Any
    check: Callable[[Any], Any]
    option: Optional[str] = None
    """The RateLimiter keyword it sets (None: the integration's own)."""


def _boolean(value: object) -> bool:
    if not isinstance(value, bool):
        raise RateLimitConfigError(
            f"must be True or False, got {type(value).__name__} {value!r:.40}"
        )
    return value


def _text(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise RateLimitConfigError(f"must be a non-empty string, got {value!r:.80}")
    return value


def _optional_text(value: object) -> Optional[str]:
    return None if value is None else _text(value)


def _url(value: object) -> str:
    from ..backends.schemes import make_blocking_backend

    url = _text(value)
    if url.partition(":")[0] != "memory":  # memory:// has nothing to check but its scheme
        # Builds the client from the URL (scheme, host, port, options), connecting to nothing.
        make_blocking_backend(url, connect_timeout_s=1.0, command_timeout_s=0.5)
    return url


def _key_prefix(value: object) -> str:
    prefix = _text(value)
    KeySpace(prefix, None, get_algorithm(DEFAULT_ALGORITHM).key_tag)
    return prefix


def _algorithm(value: object) -> str:
    return get_algorithm(_text(value)).name


def _secret(value: object) -> Optional[bytes]:
    if value is None:
        return None
    if isinstance(value, str):
        value = value.encode()
    if not isinstance(value, bytes):
        raise RateLimitConfigError(
            f"must be a string or bytes (a secret of your own), got {type(value).__name__}"
        )
    KeySpace("moderato", value, get_algorithm(DEFAULT_ALGORITHM).key_tag)
    return value


def _metrics_wanted(value: object) -> bool:
    wanted = _boolean(value)
    if wanted and importlib.util.find_spec("prometheus_client") is None:
        raise RateLimitConfigError(
            "needs prometheus_client, which is not installed: pip install 'moderato[metrics]'"
        )
    return wanted


def _client_name(value: object) -> Optional[str]:
    from ..redis.url import client_name_problem

    name = _optional_text(value)
    problem = None if name is None else client_name_problem(name)
    if problem:
        raise RateLimitConfigError(problem)
    return name


def _networks(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise RateLimitConfigError(
            f"must be a list of proxy addresses or CIDRs such as ['10.0.0.0/8'], got {value!r:.80}"
        )
    parse_networks(value)
    return tuple(value)


def _proxy_header(value: object) -> str:
    return check_proxy_header(value.lower() if isinstance(value, str) else value)


def _rate(value: object) -> Optional[str]:
    if value is None:
        return None
    from ..policy import policy_for

    policy_for(_text(value))  # the grammar and range; the algorithm's own range at first use
    return value  # type: ignore[return-value]


def _exempt_paths(value: object) -> ExemptPaths:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise RateLimitConfigError(
            f"must be a list of paths such as ['/healthz', '/static/*'], got {value!r:.80}"
        )
    return ExemptPaths(value)


def _headers(value: object) -> HeaderStyle:
    return validate_style(value)


def _view(value: object) -> Optional[Callable[..., Any]]:
    if value is None or callable(value):
        return value
    if not isinstance(value, str):
        raise RateLimitConfigError(
            "must be a view or its dotted path, such as 'myapp.views.ratelimited', "
            f"got {value!r:.80}"
        )
    view: Callable[..., Any] = _imported(value)
    return view


def _key(value: object) -> Any:
    from .keys import key_source

    return key_source(value)


def _imported(path: str) -> Any:
    try:
        return import_string(path)
    except ImportError as error:
        raise RateLimitConfigError(f"{path!r} cannot be imported: {error}") from None


SETTINGS: dict[str, Entry] = {
    # The limiter: what RateLimiter(...) takes.
    "URL": Entry("redis://localhost:6379", _url, "redis_url"),
    "KEY_PREFIX": Entry("moderato", _key_prefix, "key_prefix"),
    "DEFAULT_ALGORITHM": Entry(DEFAULT_ALGORITHM, _algorithm, "default_algorithm"),
    "FAIL_OPEN": Entry(False, _metrics_wanted, "fail_open"),
    "SHADOW": Entry(False, _boolean, "shadow"),
    "ENABLE_METRICS": Entry(False, _metrics_wanted, "enable_metrics"),
    "METRICS_NAMESPACE": Entry("moderato", _text, "metrics_namespace"),
    "IDENTITY_SECRET": Entry(None, _secret, "identity_secret"),
    "CONNECT_TIMEOUT_S": Entry(1.0, lambda v: seconds_option("value", v), "connect_timeout_s"),
    "COMMAND_TIMEOUT_S": Entry(0.5, lambda v: seconds_option("value", v), "command_timeout_s"),
    "CLIENT_NAME": Entry(None, _client_name, "client_name"),
    "BREAKER_FAILURES": Entry(5, lambda v: count_option("value", v), "breaker_failures"),
    "BREAKER_COOLDOWN_S": Entry(1.0, lambda v: seconds_option("value", v), "breaker_cooldown_s"),
    "FAILURE_LOG_INTERVAL_S": Entry(
        DEFAULT_INTERVAL_S, lambda v: seconds_option("value", v), "failure_log_interval_s"
    ),
    # The blocking limiter's pool (per Redis server), the asyncio one's connections per loop.
    "MAX_CONNECTIONS": Entry(
        DEFAULT_MAX_CONNECTIONS, lambda v: count_option("value", v), "max_connections"
    ),
    "CONNECTIONS_PER_LOOP": Entry(2, lambda v: count_option("value", v), "connections_per_loop"),
    # Who is asking.
    "TRUSTED_PROXIES": Entry((), _networks),
    "PROXY_HEADER": Entry("x-forwarded-for", _proxy_header),
    "KEY": Entry("ip", _key),
    # RateLimitMiddleware, responses.
    "RATE": Entry(None, _rate),
    "EXEMPT_PATHS": Entry((), _exempt_paths),
    "HEADERS": Entry("legacy", _headers),
    "DENIAL_VIEW": Entry(None, _view),
}

_SYNC_ONLY = frozenset({"max_connections"})
_ASYNC_ONLY = frozenset({"connections_per_loop"})


@dataclass(frozen=True)
class Settings:
    """``MODERATO``, checked: the limiters' options and the integration's own."""

    values: dict[str, Any]
    """Every key, checked (a default where unset)."""
    proxy_rules: ProxyRules

    @property
    def in_process(self) -> bool:
        """``memory://``: decisions in this process (each worker has its own counters)."""
        return str(self.values["URL"]).startswith("memory:")

    @property
    def key(self) -> Any:
        """The identity of a limit with no ``key=``, and of the app-wide RATE (a KeySource)."""
        return self.values["KEY"]

    @property
    def rate(self) -> Optional[str]:
        return self.values["RATE"]  # type: ignore[no-any-return]

    @property
    def exempt_paths(self) -> ExemptPaths:
        return self.values["EXEMPT_PATHS"]  # type: ignore[no-any-return]

    @property
    def headers(self) -> HeaderStyle:
        return self.values["HEADERS"]  # type: ignore[no-any-return]

    @property
    def denial_view(self) -> Optional[Callable[..., Any]]:
        return self.values["DENIAL_VIEW"]  # type: ignore[no-any-return]

    def limiter_options(self, *, blocking: bool) -> dict[str, Any]:
        """The keywords of the blocking (``moderato.sync``) or asyncio RateLimiter."""
        left_out = _ASYNC_ONLY if blocking else _SYNC_ONLY
        return {
            entry.option: self.values[name]
            for name, entry in SETTINGS.items()
            if entry.option is not None and entry.option not in left_out
        }


def improperly_configured(name: str, error: Exception) -> ImproperlyConfigured:
    return ModeratoImproperlyConfigured(f"{SETTING}[{name!r}]: {error}")


def read_settings() -> Settings:
    """``settings.MODERATO`` checked whole; ImproperlyConfigured naming the first bad key."""
    given = getattr(django_settings, SETTING, None)
    if given is None:
        given = {}
    if not isinstance(given, Mapping):
        raise ModeratoImproperlyConfigured(
            f"{SETTING} must be a dict such as {{'URL': 'redis://localhost:6379'}}, "
            f"got {type(given).__name__}"
        )
    unknown = [name for name in given if name not in SETTINGS]
    if unknown:
        raise ModeratoImproperlyConfigured(_unknown_message(unknown[0]))
    values: dict[str, Any] = {}
    for name, entry in SETTINGS.items():
        value = given.get(name, entry.default)
        try:
            values[name] = entry.check(value)
        except (RateLimitConfigError, TypeError, ValueError) as error:
            raise improperly_configured(name, error) from None
    proxy_rules = ProxyRules(values["TRUSTED_PROXIES"], values["PROXY_HEADER"])
    return Settings(values, proxy_rules)


def _unknown_message(name: object) -> str:
    known = ", ".join(SETTINGS)
    message = f"{SETTING}[{name!r}] is not a setting moderato knows"
    if isinstance(name, str):
        wanted = name.upper()
        # "REDIS_URL" -> "URL", "ALGORITHM" -> "DEFAULT_ALGORITHM", else the nearest spelling.
        close = [known for known in SETTINGS if wanted.endswith(known) or known.endswith(wanted)]
        close = close or difflib.get_close_matches(wanted, SETTINGS, n=1)
        if close:
            message += f" (did you mean {close[0]!r}?)"
    return f"{message}; the settings are: {known}"
