"""Every rule declared for a limiter, for the operator's dashboard to list.

The decorator, the dependency, RateLimitMiddleware and message limits add
each rule they make. Rules are held weakly: one that nothing uses any more
(a route removed, a middleware built only to check install()'s options) drops
out by itself. Reading it is not on any request path.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..limiter import RateLimiter
    from .rule import LimitRule

_rules: weakref.WeakKeyDictionary[RateLimiter, weakref.WeakSet[LimitRule]] = (
    weakref.WeakKeyDictionary()
)
_lock = threading.Lock()


def declare(rule: LimitRule) -> None:
    """Remember ``rule`` among its limiter's declared rules."""
    with _lock:
        _rules.setdefault(rule.limiter, weakref.WeakSet()).add(rule)


def rules_of(limiter: RateLimiter) -> list[LimitRule]:
    """The rules declared for ``limiter`` that are still in use, in no particular order."""
    with _lock:
        return list(_rules.get(limiter, ()))
