"""The connection options users already put in their Redis URLs, mapped onto moderato's.

redis-py and limits accept options such as ``?socket_timeout=0.2`` or
``?ssl_cert_reqs=none`` in a URL; users reuse those URLs. Each one either
means something here (a timeout, a TLS setting) or is refused with the reason,
never silently dropped:

=========================  ===============================================
``socket_timeout``         ``command_timeout_s`` (seconds)
``socket_connect_timeout`` ``connect_timeout_s`` (seconds)
``ssl_cert_reqs``          ``none``, ``optional`` or ``required`` (default)
``ssl_ca_certs``           a CA bundle (PEM) that verifies the server
``ssl_certfile``           a client certificate (PEM) for mutual TLS
``ssl_keyfile``            its private key (defaults to ``ssl_certfile``)
``ssl_check_hostname``     ``true`` (default) or ``false``
``protocol``               ``2`` only: moderato speaks RESP2
``batch_decisions``        ``true`` or ``false`` (default; also ``1``/``0``,
                           ``yes``/``no``): the asyncio clients join a loop
                           turn's checks into batched calls (grouping.py);
                           the blocking clients never batch and refuse ``true``
``health_check_interval``  refused (see _REFUSED)
=========================  ===============================================

Options in the URL win over the constructor's keyword arguments: the URL is
where a deployment's settings live. A URL with ``ssl_*`` options together with
an explicit ``ssl_context`` is refused, as nobody could tell which one rules.
"""

from __future__ import annotations

import math
import ssl
from dataclasses import dataclass, fields
from typing import Any, Callable, ClassVar, TypeVar

__all__ = [
    "CONNECT_OPTIONS",
    "ConnectOptions",
    "FromUrl",
    "apply_connect_options",
    "parse_connect_options",
]

Client = TypeVar("Client", bound="FromUrl")

CONNECT_OPTIONS = (
    "socket_timeout",
    "socket_connect_timeout",
    "ssl_cert_reqs",
    "ssl_ca_certs",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_check_hostname",
    "protocol",
    "batch_decisions",
)

# Options redis-py knows that have no meaning here, with the reason given to the user.
REFUSED_OPTIONS = {
    "health_check_interval": (
        "moderato does not ping idle connections: a command that gets no reply "
        "within command_timeout_s fails, and a connection silent for twice that "
        "is dropped and reopened; remove health_check_interval"
    ),
}

_CERT_REQS = {
    "none": ssl.CERT_NONE,
    "optional": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}
_TRUE = ("true", "yes", "1", "on")
_FALSE = ("false", "no", "0", "off")
# batch_decisions' spellings (no on/off: a switch named after what it does reads true/false).
_BATCH_SPELLINGS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


@dataclass(frozen=True)
class ConnectOptions:
    """Connection settings a URL carried (None: not given, the constructor decides)."""

    command_timeout_s: float | None = None
    connect_timeout_s: float | None = None
    ssl_cert_reqs: str | None = None
    ssl_ca_certs: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_check_hostname: bool | None = None
    batch_decisions: bool | None = None

    @property
    def has_tls_settings(self) -> bool:
        return any(
            getattr(self, item.name) is not None
            for item in fields(self)
            if item.name.startswith("ssl_")
        )

    def ssl_context(self) -> ssl.SSLContext:
        """A client SSLContext with these settings (the defaults verify everything)."""
        context = ssl.create_default_context(cafile=self.ssl_ca_certs)
        check_hostname = self.ssl_check_hostname
        verify_mode = _CERT_REQS[self.ssl_cert_reqs or "required"]
        # Python refuses a host name check without verification: switch it off first.
        context.check_hostname = False
        context.verify_mode = verify_mode
        if check_hostname is None:
            check_hostname = verify_mode != ssl.CERT_NONE
        context.check_hostname = check_hostname
        if self.ssl_certfile is not None:
            context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile)
        return context


def parse_connect_options(
    seen: dict[str, str], tls: bool, bad: Callable[[str], ValueError]
) -> ConnectOptions:
    """The ConnectOptions named in ``seen`` (query name -> value); ``bad`` builds the error."""
    values: dict[str, Any] = {}
    for name, key in (
        ("socket_timeout", "command_timeout_s"),
        ("socket_connect_timeout", "connect_timeout_s"),
    ):
        if name in seen:
            values[key] = _seconds(name, seen[name], bad)
    if "ssl_cert_reqs" in seen:
        text = seen["ssl_cert_reqs"].lower()
        if text not in _CERT_REQS:
            raise bad(
                f"ssl_cert_reqs must be one of {', '.join(_CERT_REQS)} "
                f"(got {seen['ssl_cert_reqs']!r})"
            )
        values["ssl_cert_reqs"] = text
    for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        if name in seen:
            if not seen[name]:
                raise bad(f"{name} must be a file path (got an empty value)")
            values[name] = seen[name]
    if "ssl_check_hostname" in seen:
        text = seen["ssl_check_hostname"].lower()
        if text not in _TRUE + _FALSE:
            raise bad(
                f"ssl_check_hostname must be true or false (got {seen['ssl_check_hostname']!r})"
            )
        values["ssl_check_hostname"] = text in _TRUE
    if "protocol" in seen and seen["protocol"] != "2":
        raise bad(
            f"protocol={seen['protocol']} is not supported: moderato speaks RESP2 "
            "(protocol=2), which every Redis serves"
        )
    if "batch_decisions" in seen:
        text = seen["batch_decisions"]
        if text.lower() not in _BATCH_SPELLINGS:
            raise bad(
                f"batch_decisions must be one of {', '.join(_BATCH_SPELLINGS)} "
                f"(any case; got {text!r})"
            )
        values["batch_decisions"] = _BATCH_SPELLINGS[text.lower()]
    options = ConnectOptions(**values)
    if not options.has_tls_settings:
        return options
    if not tls:
        raise bad("ssl_* options need a TLS scheme (rediss://, rediss+cluster://, ...)")
    if "ssl_keyfile" in values and "ssl_certfile" not in values:
        raise bad("ssl_keyfile needs ssl_certfile (the client certificate it belongs to)")
    if options.ssl_cert_reqs == "none" and options.ssl_check_hostname:
        raise bad("ssl_check_hostname=true cannot hold with ssl_cert_reqs=none")
    return options


class FromUrl:
    """Every client's ``from_url``, over its class's ``parse_url`` (url.py)."""

    parse_url: Callable[[str], Any]
    """The URL parser of this kind of client (a staticmethod)."""

    batches_decisions: ClassVar[bool] = True
    """Whether the client takes ``batch_decisions`` (the blocking ones never batch)."""

    @classmethod
    def from_url(cls: type[Client], url: str, **options: Any) -> Client:
        """``cls(cls.parse_url(url), **options)``; a bad URL is a ValueError.

        The URL's connection options (``?socket_timeout=``...) win over ``options``.
        """
        make: Callable[..., Client] = cls  # the client's own constructor, not FromUrl's
        address = cls.parse_url(url)
        keywords = apply_connect_options(address.options, options, cls.batches_decisions)
        return make(address, **keywords)


def apply_connect_options(
    options: ConnectOptions, keywords: dict[str, Any], batches: bool = True
) -> dict[str, Any]:
    """``keywords`` for a client constructor, with the URL's options laid over them;
    ``batches``: whether that client takes ``batch_decisions``."""
    merged = dict(keywords)
    if options.batch_decisions is not None:
        if batches:
            merged["batch_decisions"] = options.batch_decisions
        elif options.batch_decisions:
            raise ValueError(
                "batch_decisions=true in the URL: the blocking client sends a call a "
                "check and never batches (only the asyncio clients do); remove "
                "batch_decisions from the URL, or write batch_decisions=false"
            )
    if options.command_timeout_s is not None:
        merged["command_timeout_s"] = options.command_timeout_s
    if options.connect_timeout_s is not None:
        merged["connect_timeout_s"] = options.connect_timeout_s
    if options.has_tls_settings:
        if merged.get("ssl_context") is not None:
            raise ValueError(
                "the URL has ssl_* options and an ssl_context was given too; use one of them"
            )
        try:
            merged["ssl_context"] = options.ssl_context()
        except (OSError, ssl.SSLError) as error:
            raise ValueError(f"the URL's TLS options cannot be loaded: {error}") from None
    return merged


def _seconds(name: str, text: str, bad: Callable[[str], ValueError]) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise bad(f"{name} must be a positive number of seconds (got {text!r})")
    return value
