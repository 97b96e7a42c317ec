"""Subscriber: one connection SUBSCRIBEd to a few channels, handing each message to a callback.

A subscribed connection receives messages nobody asked for, so it cannot
share RedisConnection's rule (one reply per command, in order); this is its
own small protocol. It reaches the server its Connector names (connector.py:
the client's, or one for a sentinel) and authenticates as RedisConnection does
(handshake.py: a unix socket, TCP or TLS; AUTH when the address has a
password), subscribes, calls ``on_subscribed(subscriber)``
once the server confirmed every channel, and from then on
``on_message(channel, payload)`` for every message. ``on_lost(subscriber,
reason)`` is called once when the connection ends for any reason but
``close()``: a refused connect, an error reply (a missing ACL permission:
``refused`` is then True), the server closing it, or a connect that takes
longer than the Connector's ``connect_timeout_s``. Reconnecting is the owner's
business.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, cast

import hiredis

from ._encoding import encode_command
from .handshake import authentication, open_transport

if TYPE_CHECKING:
    from .connector import Connector

__all__ = ["MessageCallback", "Subscriber", "Subscription", "pushed"]

MessageCallback = Callable[[bytes, bytes], None]
LostCallback = Callable[["Subscriber", str], None]
SubscribedCallback = Callable[["Subscriber"], None]


def pushed(message: Any, on_message: MessageCallback, channel_count: int) -> bool:
    """Hand a published message to ``on_message(channel, payload)``; True when
    ``message`` confirms the last of the ``channel_count`` channels subscribed to."""
    if isinstance(message, list) and len(message) == 3:
        kind, channel, payload = message
        if kind == b"message" and isinstance(payload, bytes):
            on_message(channel, payload)
        elif kind == b"subscribe" and payload == channel_count:
            return True
    return False


class _Link(Protocol):
    """A subscription's way to its server: a blocking connection, or an asyncio transport."""

    def close(self) -> None: ...


class Subscription:
    """What either subscriber (this one, blocking/subscriber.py's) holds: the server,
    the channels, where their messages go, whether the server confirmed them all, and
    the link to the server while there is one; and how a subscription ends."""

    def __init__(self, server: Connector, channels: Sequence[str], on_message: MessageCallback):
        self.server = server
        self.address = server.address
        self.channels = tuple(channels)
        self._on_message = on_message
        self.subscribed = False
        """True once the server confirmed every channel (until the connection is lost)."""
        self._link: Optional[_Link] = None
        self._closed = threading.Event()

    def close(self) -> None:
        """End the subscription: no message is handed on after this, the link is closed."""
        self._closed.set()
        self._unlink(close=True)

    def abandon(self) -> None:
        """Inherited across fork(): drop the link untouched (the parent still reads it)."""
        self._closed.set()
        self._unlink(close=False)

    def _unlink(self, close: bool) -> None:
        """Not subscribed from now on; the link dropped, and closed if ``close``."""
        self.subscribed = False
        link, self._link = self._link, None
        if close and link is not None:
            link.close()

    def _subscribe_command(self) -> bytes:
        return encode_command("SUBSCRIBE", *self.channels)

    def _pushed(self, message: Any) -> bool:
        """Hand a published message on; True, and subscribed, when ``message`` confirms
        the last channel."""
        if pushed(message, self._on_message, len(self.channels)):
            self.subscribed = True
            return True
        return False


class Subscriber(Subscription, asyncio.Protocol):
    """A connection subscribed to ``channels`` of the server at ``address`` (see the module doc)."""

    def __init__(
        self,
        server: Connector,
        channels: Sequence[str],
        on_message: MessageCallback,
        on_lost: LostCallback,
        *,
        on_subscribed: Optional[SubscribedCallback] = None,
    ) -> None:
        super().__init__(server, channels, on_message)
        self._on_lost = on_lost
        self._on_subscribed = on_subscribed
        self._reader = hiredis.Reader()
        self._task: Optional[asyncio.Task[None]] = None
        # Only this process may close the socket (see forks.py).
        self._pid = os.getpid()
        self.refused = False
        """True once the server refused AUTH or SUBSCRIBE (an error reply)."""

    def __repr__(self) -> str:
        closed = self._closed.is_set()
        state = "subscribed" if self.subscribed else "closed" if closed else "connecting"
        return f"<Subscriber {self.address} {state}>"

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Begin connecting on ``loop`` (its thread); failures come to ``on_lost``."""
        self._task = loop.create_task(self._connect(loop))

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> None:
        server = self.server
        try:
            opening = open_transport(loop, lambda: self, server.address, server.tls_context())
            await asyncio.wait_for(opening, server.connect_timeout_s)
        except (OSError, asyncio.TimeoutError, ssl.SSLError) as error:
            self._task = None  # done: closing must not cancel this task
            self._lose(f"cannot connect: {str(error) or type(error).__name__}")
        finally:
            self._task = None

    # -- asyncio protocol callbacks ------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._link = link = cast(asyncio.Transport, transport)
        if self._closed.is_set():
            transport.close()
            return
        auth = authentication(self.address)
        payloads = [] if auth is None else [auth]
        payloads.append(self._subscribe_command())
        link.write(b"".join(payloads))

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        try:
            reply = reader.gets()
            while reply is not False:
                self._handle(reply)
                reply = reader.gets()
        except hiredis.ProtocolError as error:
            self._lose(f"malformed RESP: {error}")

    def _handle(self, reply: Any) -> None:
        if isinstance(reply, hiredis.ReplyError):
            # AUTH or SUBSCRIBE refused (an ACL without the channel).
            self.refused = True
            self._lose(f"refused: {reply}")
        elif self._pushed(reply) and self._on_subscribed is not None:
            self._on_subscribed(self)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._lose("closed by the server" if exc is None else str(exc) or type(exc).__name__)

    # -- closing ---------------------------------------------------------------------

    def _lose(self, reason: str) -> None:
        if self._closed.is_set():
            return
        self.close()
        self._on_lost(self, reason)

    def close(self) -> None:
        """End the subscription (no ``on_lost`` call for it); call from its loop's thread."""
        if self._pid != os.getpid():
            self.abandon()
            return
        if self._task is not None:
            self._task.cancel()
            self._task = None
        super().close()

    def abandon(self) -> None:
        """Inherited across fork(): drop everything untouched (the parent still reads it)."""
        self._task = None
        super().abandon()
