"""The exceptions moderato raises; every one names what went wrong."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

# The client's error reply, re-exported: the backends translate it before a
# limiter's caller sees it (a script's refusal, or a BackendError).
from .redis.errors import RedisReplyError as RedisReplyError

if TYPE_CHECKING:  # results.py needs nothing from here; only the annotation does
    from .results import CheckResult


class ModeratoError(Exception):
    """Base class of every moderato exception."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled whole, attributes included (Celery and multiprocessing send
        # exceptions between processes): the default would call the class with
        # the message alone, which most of these constructors do not take.
        return (_unpickled, (type(self), self.args, self.__dict__))


class RateLimitConfigError(ModeratoError, ValueError):
    """A rate, cost, algorithm or option is invalid; raised before Redis is contacted."""


class UnknownOptionError(RateLimitConfigError, TypeError):
    """A keyword moderato does not take (often another library's name for one it does).

    A TypeError too, as Python's own answer to an unexpected keyword would be.
    """


class BackendError(ModeratoError):
    """The backend could not give a decision (connection, timeout, error reply, bad reply).

    Raised as such when Redis answered this one call with an error (its
    message names Redis's: NOPERM, WRONGTYPE, OOM, a script's refusal of
    stored state) or with a reply of the wrong shape: the backend is
    reachable. BackendUnavailableError when it gave no answer at all.
    """


class BackendUnavailableError(BackendError):
    """No answer from the backend: it could not be reached, did not reply within
    the command timeout or dropped the connection, or the circuit breaker,
    open after such failures, refused the call.

    Only these failures count toward the circuit breaker: an error reply is
    an answer, and concerns its own call only.
    """


class RateLimitCallbackError(ModeratoError):
    """A key, tenant, cost or rate callback raised; the request is not let through."""

    def __init__(self, callback: str, error: BaseException) -> None:
        super().__init__(f"rate limit {callback} callback failed: {error!r}")
        self.callback = callback
        self.error = error


class RateLimitExceeded(ModeratoError):
    """A request was denied.

    ``status_code`` is 429 for a temporary denial (``retry_after`` seconds, rounded
    up) and 422 for a permanent one (the cost exceeds the policy's capacity;
    ``retry_after`` and ``reset_at`` are None: waiting cannot help).
    """

    def __init__(
        self,
        *,
        limit: int,
        remaining: int,
        retry_after: Optional[int],
        reset_at: Optional[float],
        window_seconds: int,
        rate: str,
        refill: Optional[int] = None,
    ) -> None:
        self.limit = limit
        self.remaining = remaining
        self.retry_after = retry_after
        self.reset_at = reset_at
        self.window_seconds = window_seconds
        self.rate = rate
        self.refill = refill
        """With a burst (``limit``): the requests refilled per window; None without one."""
        self.permanent = retry_after is None
        self.status_code = 422 if self.permanent else 429
        if self.permanent:
            detail = f"cost exceeds the capacity of '{rate}'; waiting cannot help"
        else:
            detail = f"retry after {retry_after} s"
        super().__init__(f"rate limit '{rate}' exceeded: {detail}")


def exceeded(result: CheckResult) -> RateLimitExceeded:
    """The exception for a denied CheckResult (429 temporary, 422 permanent)."""
    return RateLimitExceeded(
        limit=result.limit,
        remaining=result.remaining if result.remaining is not None else 0,
        retry_after=result.retry_after,
        reset_at=result.reset_at,
        window_seconds=result.window_seconds,
        rate=result.rate,
        refill=result.refill,
    )


def _unpickled(
    kind: type[ModeratoError], args: tuple[Any, ...], state: dict[str, Any]
) -> ModeratoError:
    error = kind.__new__(kind, *args)
    error.args = args
    error.__dict__.update(state)
    return error
