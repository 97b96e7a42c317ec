"""How the middlewares (ASGI and Django) match request paths against ``exempt_paths`` and ``costs``.

The rule, chosen so that a spelling difference never moves a request out of
its limit:

- a path matches itself with or without a trailing slash: ``"/health"``
  covers ``/health`` and ``/health/`` (and ``"/health/"`` covers both too);
- a pattern ending in ``*`` is a prefix, and only such a pattern is:
  ``"/static/*"`` covers ``/static``, ``/static/`` and everything below;
  ``"/ready*"`` covers every path starting with ``/ready`` (``/readyz`` too);
- nothing else is a wildcard, and paths are compared below the ASGI root
  path or Django's SCRIPT_NAME (a mounted application or a proxy prefix sees
  its own paths).

Patterns are checked when the middleware is created; a malformed one is a
RateLimitConfigError naming it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar

from ..errors import RateLimitConfigError

V = TypeVar("V")

_EXAMPLES = "such as '/health', or '/static/*' for a prefix"


def normalize(path: str) -> str:
    """The path without its trailing slash ("/" stays "/")."""
    return path.rstrip("/") or "/"


def _validate(option: str, pattern: object, *, prefix_allowed: bool) -> str:
    if not isinstance(pattern, str):
        raise RateLimitConfigError(
            f"{option}: each path must be a string {_EXAMPLES}, got {type(pattern).__name__}"
        )
    if not pattern.startswith("/"):
        raise RateLimitConfigError(f"{option}: {pattern!r:.80} must start with '/' ({_EXAMPLES})")
    if any(character in pattern for character in "?# \t\r\n"):
        raise RateLimitConfigError(
            f"{option}: {pattern!r:.80} must be a bare path, without query, fragment or spaces"
        )
    wildcards = pattern.count("*")
    if wildcards and not prefix_allowed:
        raise RateLimitConfigError(f"{option}: {pattern!r:.80} must be an exact path, without '*'")
    if wildcards > 1 or (wildcards == 1 and not pattern.endswith("*")):
        raise RateLimitConfigError(
            f"{option}: {pattern!r:.80} may only end in '*' (a prefix); "
            "'*' elsewhere is not a wildcard"
        )
    return pattern


class ExemptPaths:
    """The ``exempt_paths`` of a middleware, validated once, matched per request."""

    def __init__(self, patterns: Iterable[str]) -> None:
        if isinstance(patterns, str):
            patterns = (patterns,)  # one path, not its characters
        elif not isinstance(patterns, Iterable):
            raise RateLimitConfigError(
                f"exempt_paths must be a list of paths {_EXAMPLES}, got {type(patterns).__name__}"
            )
        exact: set[str] = set()
        prefixes: list[str] = []
        for pattern in patterns:
            pattern = _validate("exempt_paths", pattern, prefix_allowed=True)
            if pattern.endswith("*"):
                prefixes.append(pattern[:-1])
                if pattern.endswith("/*"):
                    exact.add(normalize(pattern[:-2]))  # "/static/*" covers "/static" itself
            else:
                exact.add(normalize(pattern))
        self.exact = frozenset(exact)
        self.prefixes = tuple(prefixes)

    def __bool__(self) -> bool:
        return bool(self.exact or self.prefixes)

    def with_mounts(self, mount_paths: Iterable[str]) -> ExemptPaths:
        """These exempt paths and everything at or below each of ``mount_paths``."""
        extended = ExemptPaths(())
        mounts = [normalize(path) for path in mount_paths]
        extended.exact = self.exact | frozenset(mounts)
        extended.prefixes = (*self.prefixes, *(path.rstrip("/") + "/" for path in mounts))
        return extended

    def match(self, path: str) -> bool:
        return normalize(path) in self.exact or path.startswith(self.prefixes)


def exact_paths(option: str, values: Mapping[str, V]) -> dict[str, V]:
    """A mapping keyed by exact paths (``costs``), validated and keyed without trailing slashes."""
    if not isinstance(values, Mapping):
        raise RateLimitConfigError(
            f"{option} must map paths to values, e.g. {{'/export': 20}}, "
            f"got {type(values).__name__}"
        )
    normalized: dict[str, V] = {}
    for path, value in values.items():
        key = normalize(_validate(option, path, prefix_allowed=False))
        if key in normalized:
            raise RateLimitConfigError(f"{option}: {path!r:.80} names the same path as {key!r}")
        normalized[key] = value
    return normalized
