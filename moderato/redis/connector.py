"""Connector: one server and the options every connection to it is made with.

Its address (where, the credentials and database the greeting uses), the TLS
context, the timeouts, the client name and the role the server must report,
checked once (client_options.py's rules), and the one place a connection is
made from them: a blocking one (blocking/connection.py) or one for an event
loop (connection.py). Both clients are Connectors; a subscriber of either
kind is given one (its client, or one for the sentinel it listens to) and
reaches the server with its address and TLS context. Each connection greets
the server with handshake.py's steps.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import TYPE_CHECKING

from .client_options import checked_client_name, checked_ssl_context, positive_seconds
from .connection import CloseCallback, RedisConnection
from .url import RedisAddress

if TYPE_CHECKING:
    from .blocking.connection import BlockingConnection

__all__ = ["Connector"]

_ROLES = (None, "master", "slave")


class Connector:
    """A server's address and the options of every connection to it (see the module doc)."""

    def __init__(
        self,
        address: RedisAddress,
        connect_timeout_s: float,
        command_timeout_s: float,
        ssl_context: ssl.SSLContext | None = None,
        client_name: str | None = None,
        role: str | None = None,
    ) -> None:
        self.address = address
        self.connect_timeout_s = positive_seconds("connect_timeout_s", connect_timeout_s)
        self.command_timeout_s = positive_seconds("command_timeout_s", command_timeout_s)
        self._ssl_context = checked_ssl_context(ssl_context, address)
        self.client_name = checked_client_name(client_name, address)
        if role not in _ROLES:
            raise ValueError(f"role must be 'master', 'slave' or None, got {role!r}")
        self.role = role

    def tls_context(self) -> ssl.SSLContext | None:
        """The TLS context given; for a TLS address without one, the default context,
        built at the first connection (loading the CA store costs milliseconds)."""
        if self.address.tls and self._ssl_context is None:
            self._ssl_context = ssl.create_default_context()
        return self._ssl_context

    def blocking_connection(self, generation: int = 0) -> BlockingConnection:
        """A blocking connection, connected and greeted (RedisConnectionError if not)."""
        # Imported here: the blocking package's __init__ imports its client, a Connector.
        from .blocking.connection import BlockingConnection

        return BlockingConnection(
            self.address,
            connect_timeout_s=self.connect_timeout_s,
            command_timeout_s=self.command_timeout_s,
            ssl_context=self.tls_context(),
            client_name=self.client_name,
            role=self.role,
            generation=generation,
        )

    def loop_connection(
        self, loop: asyncio.AbstractEventLoop, on_close: CloseCallback | None
    ) -> RedisConnection:
        """A connection for ``loop``, not yet started (``start(connect_timeout_s)``)."""
        return RedisConnection(
            loop,
            self.address,
            command_timeout_s=self.command_timeout_s,
            ssl_context=self.tls_context(),
            client_name=self.client_name,
            role=self.role,
            on_close=on_close,
        )
