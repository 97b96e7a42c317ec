"""What a backend's answers mean, for every backend: the decision reply, and refusals.

A decision script, and the C store that runs the scripts' math in process,
answer one flat array of integers (docs/internals.md):
``[allowed, deciding policy, then (remaining_scaled, retry_ms, reset_ms) per
policy]``. Its positions are named here, and a reply is decoded here, so a
reply of the wrong shape is refused in one wording.

A refusal is an error whose text starts with the scripts' prefix, the same
from Redis (an error reply) and from the store (a ValueError):
``MODERATO_ARG`` (an argument was wrong: RateLimitConfigError) or
``MODERATO_STATE`` (stored state the script will not trust: BackendError).
``refusal`` is that mapping, for both backends.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

from .. import _accel
from ..errors import BackendError, BackendUnavailableError, ModeratoError, RateLimitConfigError
from ..plans import Plan
from ..redis.errors import RedisClientError, RedisReplyError
from ..results import CheckResult

DecisionReply = list[int]
"""A decision's reply: ``[allowed, deciding, (remaining_scaled, retry_ms, reset_ms) * n]``."""

ALLOWED = 0
"""1 when admitted (and charged), else 0."""
DECIDING = 1
"""The index of the policy that speaks for the decision."""
FIRST_POLICY = 2
"""Where the first policy's fields start."""
POLICY_FIELDS = 3
"""Each policy's fields: remaining_scaled, retry_ms, reset_ms."""
RETRY = 1
"""retry_ms, within a policy's fields (0 when admitted, -1 for a permanent denial)."""


def policy_at(index: int) -> int:
    """Where policy ``index``'s fields start in a reply."""
    return FIRST_POLICY + POLICY_FIELDS * index


def reply_size(policies: int) -> int:
    """The length of a reply for ``policies`` policies."""
    return FIRST_POLICY + POLICY_FIELDS * policies


REFUSALS: tuple[tuple[str, type[ModeratoError]], ...] = (
    ("MODERATO_ARG", RateLimitConfigError),
    ("MODERATO_STATE", BackendError),
)
"""The scripts' refusal prefixes, and what each means to the caller."""

# What Redis (7.0) says when a script calls a command its user may not run.
_SCRIPT_ACL_DENIAL = "can't run this command or subcommand"


def refusal(script: str, message: str, *, foreign: str = "") -> Exception:
    """What an error from ``script`` (in Redis, or the store running its math) means.

    A refusal of the scripts' own names the script; a command the script
    calls that the ACL denies (the script's own reads report it as
    unreadable state) is said to be a permission problem; any other error is
    a BackendError with its text after ``foreign``, the backend's name for it.
    """
    kind = next((kind for prefix, kind in REFUSALS if message.startswith(prefix)), None)
    if kind is RateLimitConfigError:
        return kind(f"{script}: {message}")
    if message.startswith("NOPERM") or _SCRIPT_ACL_DENIAL in message or ": NOPERM " in message:
        return BackendError(
            f"NOPERM: the Redis user may not run a command the {script} script needs "
            f"(Redis said: {message}); see the ACL in docs/operations.md"
        )
    if kind is not None:
        return kind(f"{script}: {message}")
    return BackendError(f"{foreign}{message}")


def translated(error: BaseException, script: Optional[str] = None) -> BaseException:
    """A Redis client's error as moderato's: an error reply (of ``script``, if one
    ran) as ``refusal`` reads it, anything else the client raised (no reply:
    unreachable, timed out, connection lost) as a BackendUnavailableError with
    its text; any other exception unchanged."""
    if isinstance(error, RedisReplyError):
        return refusal(script, error.message) if script else BackendError(error.message)
    if isinstance(error, RedisClientError):
        return BackendUnavailableError(str(error))
    return error


def malformed(script: str, error: Exception) -> BackendError:
    """The refusal of a reply of the wrong shape (a BackendError: the backend answered)."""
    return BackendError(f"malformed reply from the {script} script: {error}")


def decoded(plan: Plan, reply: object) -> CheckResult:
    """The CheckResult of a decision's reply; a reply of the wrong shape is a BackendError."""
    try:
        result: CheckResult = _accel.check_result(reply, plan.result_shape)
    except (TypeError, ValueError) as error:
        raise malformed(plan.algorithm.name, error) from None
    return result


def decoded_one(script: str, reply: object) -> tuple[bool, int, int, int]:
    """A one-policy reply's allowed, remaining_scaled, retry_ms and reset_ms."""
    try:
        allowed, _, ((remaining_scaled, retry_ms, reset_ms),) = _accel.decode_decision(reply, 1)
    except (TypeError, ValueError) as error:
        raise malformed(script, error) from None
    return allowed, remaining_scaled, retry_ms, reset_ms


def split_replies(policy_counts: Sequence[int], reply: object) -> list[DecisionReply]:
    """The replies of decisions taken as one call (``policy_counts``: each one's policies)
    from its one flat reply, checked for length."""
    if not isinstance(reply, list):
        raise BackendError(f"malformed reply from a decision: {reply!r:.80}")
    if len(policy_counts) == 1:  # one call: its reply is checked whole when decoded
        return [reply]
    replies: list[DecisionReply] = []
    at = 0
    for policies in policy_counts:
        size = reply_size(policies)
        replies.append(reply[at : at + size])
        at += size
    if at != len(reply):
        raise BackendError(
            f"malformed reply from a decision: {len(reply)} fields for "
            f"{len(policy_counts)} parts that need {at}"
        )
    return replies
