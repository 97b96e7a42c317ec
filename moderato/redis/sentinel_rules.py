"""What both Sentinel clients (asyncio and blocking) decide without I/O.

Which server the sentinels name (``SENTINEL MASTER`` with its configuration
epoch, and ``SENTINEL REPLICAS``), which sentinel is behind the newest
configuration, whether the server named is a primary (its ``ROLE`` reply),
which error replies mean the primary moved, what a ``WAIT`` after a write
means, and the order in which sentinels are asked and when to ask again.
sentinel.py and blocking/sentinel.py do the asking with them.
"""

from __future__ import annotations

import math
from time import monotonic
from typing import Any, Generic, NamedTuple, Optional, TypeVar, Union

from .errors import RedisClientError, RedisConnectionError, RedisReplyError
from .url import SentinelAddress

__all__ = [
    "FOLLOW_FOR_S",
    "REPLICAS_RECOUNT_S",
    "RETRY_INTERVAL_S",
    "SUBSCRIBE_REFUSED_RETRY_S",
    "SUBSCRIBE_RETRY_S",
    "Answer",
    "Primary",
    "PrimaryFacts",
    "SentinelState",
    "WaitVerdict",
    "host_port",
    "moved_primary",
    "not_a_primary",
    "primary_named",
    "replica_wait_ms",
    "replicas_of",
    "sentinel_fields",
    "wait_verdict",
]

# While the sentinels keep naming a server that is not a primary (a failover
# in progress), they are asked again at most this often.
RETRY_INTERVAL_S = 0.05
SUBSCRIBE_RETRY_S = 1.0
"""A lost subscription to a sentinel is reopened after this long."""
FOLLOW_FOR_S = 10.0
"""After an announcement, the client keeps trying to reach the new primary this long."""
SUBSCRIBE_REFUSED_RETRY_S = 60.0
"""After a sentinel refused the subscription (an ACL without the channel), this long."""
REPLICAS_RECOUNT_S = 1.0
"""While a primary is in use, its ROLE is read again at most this often, and every
replica it lists must acknowledge from then on: one that finished its sync (the old
primary, demoted after a switchover, say). WAIT alone cannot show them while every
command writes: each WAIT then asks about a write the replicas' periodic
acknowledgement has not covered yet. Never lowered this way (see SentinelClient)."""


# A replica a sentinel flags so cannot be promoted by it.
DOWN_FLAGS = frozenset({"s_down", "o_down", "disconnected"})

Answer = tuple[tuple[str, int], int, int]
"""What a sentinel said: (where the primary is, configuration epoch, replicas up)."""


Client = TypeVar("Client")


class Primary(Generic[Client]):
    """The primary in use and what a Sentinel client (either kind) knows about it."""

    __slots__ = ("at", "client", "epoch", "recount_at", "replicas")

    def __init__(self, client: Client, at: tuple[str, int], epoch: int, replicas: int):
        self.client = client
        self.at = at
        # The configuration epoch of the sentinels' answer that named it.
        self.epoch = epoch
        # How many replicas must acknowledge a write before its reply is released.
        self.replicas = replicas
        # When its ROLE is read again (monotonic seconds; see REPLICAS_RECOUNT_S).
        self.recount_at = monotonic() + REPLICAS_RECOUNT_S


class PrimaryFacts:
    """What both Sentinel clients tell of the primary in use and the sentinels they watch."""

    _primary: Optional[Primary[Any]]
    _subscribers: dict[tuple[str, int], Any]  # a subscriber (either kind) per sentinel

    @property
    def primary_address(self) -> Optional[tuple[str, int]]:
        """(host, port) of the primary in use, None before the first discovery."""
        return None if self._primary is None else self._primary.at

    @property
    def replicas_required(self) -> int:
        """How many replicas must acknowledge a write before its reply is released."""
        return 0 if self._primary is None else self._primary.replicas

    @property
    def watching(self) -> int:
        """How many sentinels' announcements this client is subscribed to now."""
        return sum(1 for subscriber in self._subscribers.values() if subscriber.subscribed)


def host_port(at: tuple[str, int]) -> str:
    host, port = at
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def moved_primary(message: str) -> bool:
    """Whether an error reply means the server is no primary any more: ``READONLY``
    (demoted to a replica, it refused the write, nothing ran)."""
    return "READONLY" in message


def not_a_primary(role: Any, where: tuple[str, int], service: str) -> Optional[str]:
    """Why the server the sentinels named may not be decided on, from its ROLE reply;
    None when it is a master."""
    if isinstance(role, list) and role and role[0] == b"master":
        return None
    shown = role[0].decode() if isinstance(role, list) and role else repr(role)
    return (
        f"{host_port(where)}, named primary of {service!r} by the sentinels, is a {shown} "
        "(a failover in progress?)"
    )


def replicas_of(role: Any) -> int:
    """How many replicas a primary's ROLE reply lists online and acknowledging.

    ROLE lists a replica once its sync is done, but the primary streams writes
    to it only after its first acknowledgement (sent within a second): until
    then its acknowledged offset is 0, and a WAIT for it would fail.
    """
    listed = role[2] if isinstance(role, list) and len(role) > 2 else None
    if not isinstance(listed, list):
        return 0
    acknowledging = 0
    for replica in listed:
        try:
            if int(replica[2]) > 0:
                acknowledging += 1
        except (TypeError, ValueError, IndexError):
            continue
    return acknowledging


def replica_wait_ms(command_timeout_s: float) -> int:
    """The timeout of the WAIT after a write: half the command timeout. WAIT blocks
    the connection it is sent on, and the other half leaves the commands behind it
    time to be answered; a quarter was too tight for a replica on a loaded machine
    (50 ms at command_timeout_s=0.2 failed checks with load average 12 on 2 cores)."""
    return max(1, int(command_timeout_s * 500))


class SentinelState:
    """The sentinels of one address: whom to ask first, the newest configuration epoch
    any of them reported, what the last search found, and when to search again."""

    def __init__(self, address: SentinelAddress) -> None:
        self.address = address
        self.order = list(address.sentinels)
        self.epoch = 0
        self.retry_at = 0.0
        self.last_error: Optional[RedisClientError] = None

    def too_soon(self) -> Optional[RedisConnectionError]:
        """The error to fail with while the last search's failure is fresh, else None."""
        wait_s = self.retry_at - monotonic()
        if wait_s > 0 and self.last_error is not None:
            return RedisConnectionError(
                f"{self.last_error}; next sentinel query in {math.ceil(wait_s * 1000)} ms"
            )
        return None

    def failed(self, error: RedisClientError) -> None:
        """A search (or a write's replicas) failed: the next one waits RETRY_INTERVAL_S."""
        self.retry_at = monotonic() + RETRY_INTERVAL_S
        self.last_error = error

    def found(self, epoch: int) -> None:
        self.epoch = max(self.epoch, epoch)
        self.last_error = None

    def heard(self, at: tuple[str, int]) -> None:
        """Sentinel ``at`` announced a switch: it knows the new configuration (asked
        first), and the next search may start at once."""
        self.retry_at = 0.0
        self._first(at)

    def judge(
        self,
        at: tuple[str, int],
        replies: Union[tuple[Any, Any], RedisClientError],
        problems: list[str],
        behind: list[Answer],
    ) -> Optional[Answer]:
        """What sentinel ``at`` said (its MASTER and REPLICAS replies, or the error that
        came instead), if it is to be followed; else None, the reason in ``problems``
        (and the answer in ``behind`` when it is older than the newest epoch seen)."""
        name = self.address.service_name
        if isinstance(replies, RedisReplyError):
            if "No such master" in replies.message:
                problems.append(f"sentinel {host_port(at)} does not monitor {name!r}")
            else:
                problems.append(f"sentinel {host_port(at)}: {replies.message}")
            return None
        if isinstance(replies, RedisClientError):
            problems.append(f"sentinel {host_port(at)}: {replies}")
            return None
        master, replicas = replies
        answer = primary_named(master, replicas)
        if answer is None:
            problems.append(f"sentinel {host_port(at)} replied {master!r}")
            return None
        where, epoch, _ = answer
        if epoch < self.epoch:
            problems.append(
                f"sentinel {host_port(at)} names {host_port(where)} at configuration "
                f"epoch {epoch}, older than epoch {self.epoch} (it has not heard of a "
                "failover yet)"
            )
            behind.append(answer)
            return None
        self._first(at)  # the sentinel that answered is asked first next time
        return answer

    def conclude(self, problems: list[str], behind: list[Answer]) -> Answer:
        """No sentinel was followed. If every one answered, all naming one server, and
        none knows the newest epoch, their configuration was reset (SENTINEL RESET, a
        new MONITOR): follow it. Else RedisConnectionError with every reason."""
        unanimous = len({where for where, _, _ in behind}) == 1
        if unanimous and len(behind) == len(self.order):
            self.epoch = 0
            return max(behind, key=lambda answer: answer[1])
        raise RedisConnectionError(
            f"no sentinel of {self.address} named a primary for "
            f"{self.address.service_name!r}: " + "; ".join(problems)
        )

    def _first(self, at: tuple[str, int]) -> None:
        if at in self.order:
            self.order.remove(at)
            self.order.insert(0, at)


class WaitVerdict(NamedTuple):
    """What a ``WAIT`` after a write means for the replies before it."""

    problem: Optional[tuple[type[RedisClientError], str]]
    """None: the replies are confirmed; else the error to raise in their place."""
    demoted: bool = False
    """The server is a replica now: nothing was written, send again elsewhere."""
    shortfall: bool = False
    """Too few replicas acknowledged: ask the sentinels before the next command."""
    acknowledged: Optional[int] = None
    """How many replicas acknowledged (when WAIT answered a number)."""


def wait_verdict(
    at: tuple[str, int], needed: int, outcome: Any, replica_wait_ms: int
) -> WaitVerdict:
    """What WAIT's ``outcome`` (its reply, or the error raised instead) means."""
    if isinstance(outcome, RedisReplyError):
        if "replica" in outcome.message:
            # "WAIT cannot be used with replica instances": demoted under a live
            # connection. A replica refuses writes, so nothing was written; like a
            # READONLY reply, the command is sent again.
            return WaitVerdict(
                (
                    RedisReplyError,
                    f"READONLY {host_port(at)} is a replica now; nothing was written "
                    f"(WAIT: {outcome.message})",
                ),
                demoted=True,
            )
        # Reported as what it is (a missing ACL permission, most likely), not as an outage.
        return WaitVerdict(
            (
                RedisReplyError,
                f"{outcome.message} (WAIT, the replicas' acknowledgement; grant +wait or "
                "set wait_for_replicas=false)",
            )
        )
    if isinstance(outcome, BaseException):
        return WaitVerdict((RedisConnectionError, f"no answer to WAIT: {outcome}"))
    if not isinstance(outcome, int):
        return WaitVerdict((RedisConnectionError, f"WAIT answered {outcome!r}"))
    if outcome >= needed:
        return WaitVerdict(None, acknowledged=outcome)
    return WaitVerdict(
        (
            RedisConnectionError,
            f"{outcome} of the {needed} replicas of {host_port(at)} acknowledged "
            f"within {replica_wait_ms} ms (WAIT): the primary may have been replaced, "
            "and the reply is not trusted",
        ),
        shortfall=True,
        acknowledged=outcome,
    )


def primary_named(master: Any, replicas: Any) -> Optional[Answer]:
    """(where, configuration epoch, replicas up) from ``SENTINEL MASTER`` and ``SENTINEL
    REPLICAS`` replies; None if the first names no address. A replica counts as up
    unless the sentinel flags it down or cannot reach it (it could not promote it)."""
    fields = sentinel_fields(master)
    try:
        where = (fields["ip"], int(fields["port"]))
        epoch = int(fields.get("config-epoch", "0"))
    except (KeyError, ValueError):
        return None
    up = 0
    if isinstance(replicas, list):
        for replica in replicas:
            flags = set(sentinel_fields(replica).get("flags", "").split(","))
            if not flags & DOWN_FLAGS:
                up += 1
    return where, epoch, up


def sentinel_fields(reply: Any) -> dict[str, str]:
    """A sentinel's flat [name, value, name, value, ...] reply as a dict of str."""
    if not isinstance(reply, list):
        return {}
    pairs = zip(reply[::2], reply[1::2])
    return {
        name.decode(errors="replace"): value.decode(errors="replace")
        for name, value in pairs
        if isinstance(name, bytes) and isinstance(value, bytes)
    }
