"""BlockingSubscriber: a thread holding one connection SUBSCRIBEd to a few channels.

The blocking twin of subscriber.py: the connection greets the server as
every connection does (connection.py), subscribes, and hands each message to
``on_message(channel, payload)`` on the subscriber's own daemon thread.
When the connection ends (refused, an error reply such as a missing ACL
permission, the server gone) the reason is kept in ``problem`` and the
thread connects again after ``retry_s`` (``refused_retry_s`` after a
refusal), until ``close()``. The thread wakes every ``poll_s`` to see
whether it was closed.

After fork() the thread does not exist in the child: ``abandon()`` drops
the connection untouched (closing the child's copy of the descriptor leaves
the parent's subscription working).
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Sequence
from typing import Any, Optional

import hiredis

from ..errors import RedisClientError, RedisReplyError
from ..subscriber import MessageCallback, Subscription
from ..url import RedisAddress
from .connection import BlockingConnection

__all__ = ["BlockingSubscriber"]


class BlockingSubscriber(Subscription):
    """A daemon thread subscribed to ``channels`` of the server at ``address``."""

    def __init__(
        self,
        address: RedisAddress,
        channels: Sequence[str],
        on_message: MessageCallback,
        *,
        connect_timeout_s: float,
        retry_s: float,
        refused_retry_s: float,
        ssl_context: Optional[ssl.SSLContext] = None,
        poll_s: float = 0.5,
    ) -> None:
        super().__init__(address, channels, on_message, ssl_context)
        self._connect_timeout_s = connect_timeout_s
        self._retry_s = retry_s
        self._refused_retry_s = refused_retry_s
        self._poll_s = poll_s
        self._closed = threading.Event()
        self._connection: Optional[BlockingConnection] = None
        self.problem: Optional[str] = None
        """Why the subscription was last lost (for diagnostics)."""
        self._thread = threading.Thread(
            target=self._run, name=f"moderato subscriber {address}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """End the subscription; the thread ends within ``poll_s``."""
        self._closed.set()
        self.subscribed = False
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()

    def abandon(self) -> None:
        """In a fork()ed child: drop the inherited connection (the thread is the parent's)."""
        self._closed.set()
        self.subscribed = False
        self._connection = None

    def _run(self) -> None:
        while not self._closed.is_set():
            refused = False
            try:
                connection = BlockingConnection(
                    self.address,
                    connect_timeout_s=self._connect_timeout_s,
                    command_timeout_s=self._poll_s,
                    ssl_context=self._ssl_context,
                )
                self._connection = connection
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
                self.subscribed = False
                connection_now, self._connection = self._connection, None
                if connection_now is not None:
                    connection_now.close()
            self._closed.wait(self._refused_retry_s if refused else self._retry_s)

    def _handle(self, message: Any) -> bool:
        """Hand a message on; True when it is a refusal (the connection is given up)."""
        if isinstance(message, (RedisReplyError, hiredis.ReplyError)):
            # SUBSCRIBE refused (an ACL without the channel).
            self.problem = f"refused: {message}"
            return True
        self._pushed(message)
        return False
