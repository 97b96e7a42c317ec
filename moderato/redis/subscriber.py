"""Subscriber: one connection SUBSCRIBEd to a few channels, handing each message to a callback.

A subscribed connection receives messages nobody asked for, so it cannot
share RedisConnection's rule (one reply per command, in order); this is its
own small protocol. It reaches the server and authenticates as
RedisConnection does (handshake.py: a unix socket, TCP or TLS; AUTH when the
address has a password), subscribes, calls ``on_subscribed(subscriber)``
once the server confirmed every channel, and from then on
``on_message(channel, payload)`` for every message. ``on_lost(subscriber,
reason)`` is called once when the connection ends for any reason but
``close()``: a refused connect, an error reply (a missing ACL permission:
``refused`` is then True), the server closing it, or a connect that takes
longer than ``timeout_s``. Reconnecting is the owner's business.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Sequence
from typing import Any, Callable, Optional, cast

import hiredis

from ._encoding import encode_command
from .handshake import authentication, open_transport
from .url import RedisAddress

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


class Subscription:
    """What either subscriber (this one, blocking/subscriber.py's) holds: the server,
    the channels, where their messages go and whether the server confirmed them all."""

    def __init__(
        self,
        address: RedisAddress,
        channels: Sequence[str],
        on_message: MessageCallback,
        ssl_context: ssl.SSLContext | None,
    ) -> None:
        self.address = address
        self.channels = tuple(channels)
        self._on_message = on_message
        self._ssl_context = ssl_context
        self.subscribed = False
        """True once the server confirmed every channel (until the connection is lost)."""

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
        address: RedisAddress,
        channels: Sequence[str],
        on_message: MessageCallback,
        on_lost: LostCallback,
        *,
        ssl_context: ssl.SSLContext | None = None,
        on_subscribed: Optional[SubscribedCallback] = None,
    ) -> None:
        super().__init__(address, channels, on_message, ssl_context)
        self._on_lost = on_lost
        self._on_subscribed = on_subscribed
        self._reader = hiredis.Reader()
        self._transport: Optional[asyncio.Transport] = None
        self._task: Optional[asyncio.Task[None]] = None
        self._closed = False
        # Only this process may close the socket (see forks.py).
        self._pid = os.getpid()
        self.refused = False
        """True once the server refused AUTH or SUBSCRIBE (an error reply)."""

    def __repr__(self) -> str:
        state = "subscribed" if self.subscribed else "closed" if self._closed else "connecting"
        return f"<Subscriber {self.address} {state}>"

    def start(self, loop: asyncio.AbstractEventLoop, timeout_s: float) -> None:
        """Begin connecting on ``loop`` (its thread); failures come to ``on_lost``."""
        self._task = loop.create_task(self._connect(loop, timeout_s))

    async def _connect(self, loop: asyncio.AbstractEventLoop, timeout_s: float) -> None:
        try:
            opening = open_transport(loop, lambda: self, self.address, self._ssl_context)
            await asyncio.wait_for(opening, timeout_s)
        except (OSError, asyncio.TimeoutError, ssl.SSLError) as error:
            self._task = None  # done: closing must not cancel this task
            self._lose(f"cannot connect: {str(error) or type(error).__name__}")
        finally:
            self._task = None

    # -- asyncio protocol callbacks ------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        if self._closed:
            transport.close()
            return
        auth = authentication(self.address)
        payloads = [] if auth is None else [auth]
        payloads.append(self._subscribe_command())
        self._transport.write(b"".join(payloads))

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
        if self._closed:
            return
        self.close()
        self._on_lost(self, reason)

    def close(self) -> None:
        """End the subscription (no ``on_lost`` call for it); call from its loop's thread."""
        if self._pid != os.getpid():
            self.abandon()
            return
        self._closed = True
        self.subscribed = False
        if self._task is not None:
            self._task.cancel()
            self._task = None
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.close()

    def abandon(self) -> None:
        """Inherited across fork(): drop everything untouched (the parent still reads it)."""
        self._closed = True
        self.subscribed = False
        self._task = None
        self._transport = None
