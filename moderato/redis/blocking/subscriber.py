"""BlockingSubscriber: a thread holding one connection SUBSCRIBEd to a few channels.

The blocking twin of subscriber.py: the connection, made by the Connector it
is given (connector.py), greets the server as every connection does
(connection.py), subscribes, and hands each message to ``on_message(channel,
payload)`` on the subscriber's own daemon thread. When the connection ends
(refused, an error reply such as a missing ACL permission, the server gone)
the reason is kept in ``problem`` and the thread connects again after
``retry_s`` (``refused_retry_s`` after a refusal), until ``close()``. A read
waits the Connector's ``command_timeout_s`` (POLL_S for a sentinel's), then the
thread looks whether it was closed.

After fork() the thread does not exist in the child: ``abandon()`` drops
the connection untouched (closing the child's copy of the descriptor leaves
the parent's subscription working).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import hiredis

from ..connector import Connector
from ..errors import RedisClientError, RedisReplyError
from ..subscriber import MessageCallback, Subscription

__all__ = ["POLL_S", "BlockingSubscriber"]

POLL_S = 0.5
"""How long a subscribed connection's read waits before its thread looks whether
it was closed: the command timeout of the Connector a subscriber is given."""


class BlockingSubscriber(Subscription):
    """A daemon thread subscribed to ``channels`` of ``server``; ``close()`` ends it
    within the server's ``command_timeout_s``, ``abandon()`` in a fork()ed child
    drops the inherited connection (the thread is the parent's)."""

    def __init__(
        self,
        server: Connector,
        channels: Sequence[str],
        on_message: MessageCallback,
        *,
        retry_s: float,
        refused_retry_s: float,
    ) -> None:
        super().__init__(server, channels, on_message)
        self._retry_s = retry_s
        self._refused_retry_s = refused_retry_s
        self.problem: str | None = None
        """Why the subscription was last lost (for diagnostics)."""
        self._thread = threading.Thread(
            target=self._run, name=f"moderato subscriber {server.address}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._closed.is_set():
            refused = False
            try:
                self._link = connection = self.server.blocking_connection()
                connection.send(self._subscribe_command())
                while not self._closed.is_set():
                    message = connection.receive()
                    if message is not None and self._handle(message):
                        refused = True
                        break
            except RedisClientError as error:
                self.problem = str(error)
                refused = "refused" in self.problem
            finally:
                self._unlink(close=True)
            self._closed.wait(self._refused_retry_s if refused else self._retry_s)

    def _handle(self, message: Any) -> bool:
        """Hand a message on; True when it is a refusal (the connection is given up)."""
        if isinstance(message, (RedisReplyError, hiredis.ReplyError)):
            # SUBSCRIBE refused (an ACL without the channel).
            self.problem = f"refused: {message}"
            return True
        self._pushed(message)
        return False
