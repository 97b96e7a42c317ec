"""What a fork()ed child inherits and must let go of without touching.

After ``fork()`` the child holds copies of its parent's descriptors: the
same sockets (a ``shutdown()`` in the child ends the parent's connection,
and a TLS close alert written by the child corrupts the parent's stream)
and the same epoll instance (unregistering a socket from the child's copy
of the event loop unregisters it for the parent too). So a child may only
abandon what it inherited: drop its references and open its own
connections on first use. Its copies of the descriptors close when the
abandoned transports are collected; closing a copy never affects the
parent, whose own descriptor keeps the connection open.

Objects that own connections register here; in the child, right after the
fork and before anything else runs, each one's ``after_fork_in_child()``
abandons what it holds. Where ``os.register_at_fork`` is not available
(no ``fork()``), nothing is registered. Connections also record the pid
that opened them and never shut down or close a socket from another
process, should a process be forked without these hooks running.
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol

__all__ = ["ForkAware", "abandon_in_children"]


class ForkAware(Protocol):
    def after_fork_in_child(self) -> None:
        """Abandon every inherited connection (no I/O, no event-loop call)."""


_owners: weakref.WeakSet[ForkAware] = weakref.WeakSet()


def abandon_in_children(owner: ForkAware) -> None:
    """Have ``owner.after_fork_in_child()`` run in every child forked while it lives."""
    _owners.add(owner)


def _in_child() -> None:
    for owner in list(_owners):
        owner.after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_child)
