"""Where a limiter's state lives: its key prefix, its identity secret, and the keys they make.

The limiter creates one KeySpace and binds its backend to it; the backend
builds the keys of every decision from it (``decision_keys``), and a reset
asks it for its keys (``reset_keys``) or SCAN patterns (``reset_patterns``).
The key layout is known here and in ``_accel``, which does the byte work
(docs/internals.md lays the keys out); the limiter only names an identity,
tenant, scope, algorithm tags and windows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional, Union

from . import _accel
from .errors import RateLimitConfigError
from .policy import Policy

if TYPE_CHECKING:
    from .plans import Plan

Identity = Union[str, bytes]


class KeyPartError(RateLimitConfigError):
    """A part of a key was refused before the backend was asked anything."""


_OPTION_NAMES = (
    ("build_keys() prefix", "key_prefix (the start of every key)"),
    ("build_keys() secret", "identity_secret"),
)
"""``_accel.build_keys``'s names for RateLimiter's options, as its refusals spell them."""


class KeySpace:
    """A key prefix and an optional identity secret, validated once."""

    __slots__ = ("identity_secret", "prefix")

    def __init__(self, prefix: str, identity_secret: Optional[bytes], probe_tag: str) -> None:
        self.prefix = prefix
        self.identity_secret = identity_secret
        # Building one key validates the prefix and the secret up front; the
        # refusal is reworded to name the options the user wrote.
        try:
            _accel.build_keys(prefix, probe_tag, "", "", "", (1,), identity_secret)
        except (TypeError, ValueError) as error:
            message = str(error)
            for part, option in _OPTION_NAMES:
                message = message.replace(part, option)
            raise RateLimitConfigError(message) from None

    def build(self, function: Any, *parts: object) -> Any:
        """``function(prefix, *parts, secret)``, its refusals as RateLimitConfigError."""
        try:
            return function(self.prefix, *parts, self.identity_secret)
        except (TypeError, ValueError) as error:
            raise RateLimitConfigError(str(error)) from None

    def decision_keys(
        self,
        key_tag: str,
        policy: Policy,
        key: object,
        tenant_type: object,
        scope: object,
    ) -> list[bytes]:
        """One key per policy window of ``policy``, for this identity, tenant and scope
        (a policy with a burst has keys of its own: ``...:<window_s>b<burst>``)."""
        # The common call (no tenant, str scope and key) skips the checks that
        # only exist to name a wrong type in the error.
        tenant = "" if tenant_type is None else tenant_part(tenant_type)
        if type(scope) is not str:
            scope = scope_part(scope)
        if type(key) is not str:
            key = identity_part(key)
        try:
            if policy.burst is None:
                keys: list[bytes] = _accel.build_keys(
                    self.prefix, key_tag, tenant, scope, key, policy.windows_s, self.identity_secret
                )
            else:
                keys = _accel.build_keys(
                    self.prefix,
                    key_tag,
                    tenant,
                    scope,
                    key,
                    policy.windows_s,
                    self.identity_secret,
                    burst=policy.burst,
                )
        except (TypeError, ValueError) as error:
            raise KeyPartError(str(error)) from None
        return keys

    def plan_keys(
        self, plan: Plan, key: object, tenant_type: Optional[str], scope: object
    ) -> list[bytes]:
        """``decision_keys`` for a check's plan: a backend's ``decision_keys`` (bound to
        it by ``KeySpaceBound.bind``). The commonest check (text identity and scope, no
        tenant, no burst) builds its keys in one call: this is on every check's path."""
        if (
            tenant_type is None
            and type(key) is str
            and type(scope) is str
            and plan.policy.burst is None
        ):
            try:
                keys: list[bytes] = _accel.build_keys(
                    self.prefix,
                    plan.key_tag,
                    "",
                    scope,
                    key,
                    plan.windows_s,
                    self.identity_secret,
                )
            except (TypeError, ValueError) as error:
                raise KeyPartError(str(error)) from None
            return keys
        return self.decision_keys(plan.key_tag, plan.policy, key, tenant_type, scope)

    def reset_keys(
        self,
        key_tags: Sequence[str],
        policy: Policy,
        key: object,
        tenant_type: object,
        scope: object,
    ) -> list[bytes]:
        """The base keys a reset of this identity deletes: one per policy window of each
        algorithm tag (the keys derived from each are the backend's to find)."""
        tenant_part(tenant_type)
        identity = identity_part(key)
        keys: list[bytes] = []
        for key_tag in key_tags:
            keys.extend(self.decision_keys(key_tag, policy, identity, tenant_type, scope))
        return keys

    def reset_patterns(
        self,
        key: object,
        tenant_type: object,
        scope: Optional[str],
        *,
        key_tag: Optional[str],
        windows_s: Optional[tuple[int, ...]],
        burst: Optional[int] = None,
    ) -> list[bytes]:
        """The SCAN patterns of a reset: this identity's keys in ``scope`` (None: every
        scope), of one algorithm tag (None: every one) and of some windows (None: all),
        those of a burst (None: those without one).

        One scope's patterns share a hash tag: on a cluster, one node holds them all.
        """
        tenant = tenant_part(tenant_type)
        identity = identity_part(key)
        pattern: bytes = self.build(
            _accel.key_pattern, tenant, "" if scope is None else scope_part(scope), identity
        )
        return narrowed(
            pattern,
            len(self.prefix),
            every_scope=scope is None,
            key_tag=key_tag,
            windows_s=windows_s,
            burst=burst,
        )


def narrowed(
    pattern: bytes,
    prefix_size: int,
    *,
    every_scope: bool,
    key_tag: Optional[str],
    windows_s: Optional[tuple[int, ...]],
    burst: Optional[int] = None,
) -> list[bytes]:
    """A reset's SCAN globs, spliced into ``_accel.key_pattern``'s one.

    ``pattern`` is ``<prefix>:??:{<tenant>:<scope>:<identity>}:*``, built with
    an empty scope when ``every_scope``. Encoded components contain no ``:``,
    ``{``, ``}`` nor glob metacharacter, so a ``*`` spliced between the tag's
    two colons matches exactly one whole scope component, and the literal
    ``{`` after ``??`` keeps a longer key prefix out of reach.
    """
    tag_at = prefix_size + 4  # "<prefix>:??:" then "{"
    if every_scope:
        scope_at = pattern.index(b":", tag_at) + 1
        pattern = pattern[:scope_at] + b"*" + pattern[scope_at:]
    if key_tag is not None:
        pattern = pattern[: prefix_size + 1] + key_tag.encode() + pattern[prefix_size + 3 :]
    if windows_s is None:
        return [pattern]
    stem = pattern[:-1]  # without the final "*": "...}:"
    # The base key "...}:<window_s>" and every key derived from it ("...:<window_s>:..."),
    # or a burst's: "...}:<window_s>b<burst>" and its derived keys.
    ending = b"" if burst is None else b"b%d" % burst
    return [
        stem + b"%d" % window_s + ending + tail for window_s in windows_s for tail in (b"", b":*")
    ]


def tenant_part(tenant_type: object) -> str:
    if tenant_type is None:
        return ""
    if not isinstance(tenant_type, str):
        raise KeyPartError(
            f"tenant_type must be a string or None, got {type(tenant_type).__name__}"
        )
    return tenant_type


def identity_part(key: object) -> Identity:
    if not isinstance(key, (str, bytes)):
        raise KeyPartError(
            f"key must be a str or bytes identity, got {type(key).__name__} {key!r:.80}"
        )
    return key


def scope_part(scope: object) -> str:
    if not isinstance(scope, str):
        raise KeyPartError(f"scope must be a string, got {type(scope).__name__}")
    return scope
