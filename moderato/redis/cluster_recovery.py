"""The rules for a cluster command that failed, written once for both clients (no I/O).

``recovery()`` is a generator: it decides, and yields each step it needs
taken (send the command to a node, pause, reload the slot map, ask whether
a migration's source is drained); the client's driver takes the step with
its own I/O (awaiting on the asyncio client, blocking on the other) and
sends back what came of it. The rules (cluster.py's module doc tells them
in full):

- ``MOVED``: the slot's new owner goes into the map at once, a reload is
  started, and the command is sent there;
- ``ASK``: the command is sent to the target after ``ASKING``; a script
  only once the source holds no key of the slot, until then it waits;
- a batched call refused whole before it ran (RedisBatchRefusedError, for
  each of its checks): a MOVED's news into the map, then the check alone to
  its own slot's owner;
- ``TRYAGAIN``, ``CLUSTERDOWN``, ``LOADING``: a pause, then the owner again
  (CLUSTERDOWN also starts a reload);
- a lost, refused or backed-off connection: a reload, then the slot's
  owner; a script only if it was never written (CommandNotSentError);
- any other error reply is raised; so is every error once the driver's
  deadline has passed (the driver raises it from a pause it cannot take).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, NamedTuple, Optional, Union

from .cluster_map import RETRIED_REPLIES, C, Node, SlotMap, ask_waiting_error, too_many_redirects
from .connection import CommandNotSentError
from .errors import RedisBatchRefusedError, RedisClientError, RedisReplyError

__all__ = ["Drained", "EnsureMap", "Pause", "Refresh", "Send", "Step", "recovery"]


class Send(NamedTuple):
    """Send the command to ``node`` (after ``ASKING`` when ``asking``); send back its
    reply, or the RedisClientError it raised."""

    node: Node[Any]
    asking: bool


class Pause(NamedTuple):
    """Wait a little before the next attempt; raise ``error`` if the deadline allows none."""

    error: RedisClientError


class Refresh(NamedTuple):
    """Start reloading the slot map if none ran lately; ``wait``: until it is done
    (at most until the deadline)."""

    wait: bool


class EnsureMap(NamedTuple):
    """Load the slot map if there is none yet (raise if it cannot be in time)."""


class Drained(NamedTuple):
    """Does ``source`` hold no key of ``slot`` any more? Send back a bool."""

    slot: int
    source: Node[Any]
    target: Node[Any]


Step = Union[Send, Pause, Refresh, EnsureMap, Drained]


def recovery(
    cluster: SlotMap[C],
    slot: Optional[int],
    script: bool,
    node: Optional[Node[C]],
    error: Optional[RedisClientError],
) -> Generator[Step, Any, Any]:
    """Follow redirections and retry what is safe; returns the command's reply.

    ``node`` and ``error``: the first attempt's node and what it raised (both
    None when no node could be chosen: no slot map yet).
    """
    counters = cluster.counters
    redirects = 0
    asking = False
    while True:
        if error is not None:
            if isinstance(error, RedisBatchRefusedError):
                # The check's batched call was refused whole before it ran (grouping.py):
                # nothing of it was decided. What a MOVED said goes into the map; then the
                # check goes alone to its own slot's owner, where its own reply (MOVED,
                # ASK...) is followed as for any call. Counted as a redirection: bounded.
                counters.batch_splits += 1
                redirects += 1
                message = error.message
                too_many_redirects(redirects, cluster.max_redirects, message)
                kind = message.split(" ", 1)[0]
                if kind == "MOVED":
                    cluster._moved_to(*cluster._redirect_target(message, node))
                if kind in ("MOVED", "CLUSTERDOWN"):
                    yield Refresh(wait=False)
                node, asking = cluster._owner(slot), False
                error = None
            elif isinstance(error, RedisReplyError):
                message = error.message
                kind = message.split(" ", 1)[0]
                if kind in ("MOVED", "ASK"):
                    redirects += 1
                    too_many_redirects(redirects, cluster.max_redirects, message)
                    moved_slot, target = cluster._redirect_target(message, node)
                    if kind == "MOVED":
                        counters.moved += 1
                        cluster._moved_to(moved_slot, target)
                        yield Refresh(wait=False)
                        node, asking = target, False
                    elif (
                        script
                        and node is not None
                        and not (yield Drained(moved_slot, node, target))
                    ):
                        # The source may still hold the script's state: wait.
                        counters.ask_deferred += 1
                        redirects -= 1  # a wait, bounded by the deadline instead
                        yield Pause(
                            ask_waiting_error(
                                moved_slot, node.name, target.name, cluster.command_timeout_s
                            )
                        )
                        asking = False
                    else:
                        counters.ask += 1
                        node, asking = target, True
                elif kind in RETRIED_REPLIES:
                    counters.retried(kind)
                    if kind == "CLUSTERDOWN":
                        yield Refresh(wait=False)
                    yield Pause(error)
                    node, asking = cluster._owner(slot), False
                else:
                    raise error
            else:
                if script and not isinstance(error, CommandNotSentError):
                    # Written, then no usable reply (lost connection, timeout,
                    # garbled stream): the script may have charged, and running
                    # it again would charge twice.
                    counters.lost_replies += 1
                    raise error
                # Lost, refused or backed-off connection: the node may be gone.
                counters.connection_errors += 1
                yield Refresh(wait=True)
                owner = cluster._owner(slot)
                if owner is node or owner is None:
                    yield Pause(error)
                    owner = cluster._owner(slot)
                node, asking = owner, False
        if node is None:
            yield EnsureMap()
            node = cluster._owner(slot)
            if node is None:
                error = cluster._no_owner_error(slot)
                yield Pause(error)
                continue
        outcome = yield Send(node, asking)
        if not isinstance(outcome, RedisClientError):
            return outcome
        error = outcome
