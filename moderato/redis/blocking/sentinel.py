"""SentinelClient (blocking): the primary a set of sentinels names, found and followed.

The asyncio SentinelClient's rules (moderato/redis/sentinel.py tells them),
with blocking calls; what needs no I/O is the same code (sentinel_rules.py):

- the sentinels are asked in turn (``SENTINEL get-master-addr-by-name``),
  the one that answered first next time; the server they name is sent
  ``ROLE`` and used only if it answers ``master``: a replica is never
  decided on;
- a lost connection, a refused connect or a timeout makes the next command
  ask the sentinels again (the failed one is not retried: it may have run);
- a ``-READONLY`` reply (the primary was demoted; nothing ran) asks them
  again at once and sends the command once more, to the primary named now;
- while the named server is no primary, the sentinels are asked at most
  once per RETRY_INTERVAL_S; commands meanwhile fail fast with the last error.

One thread asks at a time; the others wait for its answer (at most the
connect and command timeouts of one round of asking).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from .._encoding import Arg
from ..connection import ScriptLike
from ..errors import RedisClientError, RedisConnectionError, RedisReplyError
from ..forks import abandon_in_children
from ..sentinel_rules import SentinelState, moved_primary, not_a_primary
from ..url import SentinelAddress, address_of, parse_sentinel_url
from ..url_options import client_from_url
from .client import RedisClient

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .client import BlockingOptions

__all__ = ["SentinelClient"]


class SentinelClient:
    """A blocking Redis client for the primary a set of sentinels names; safe across threads.

    Takes the blocking RedisClient's options; they apply to the primary. The
    sentinels are asked with the same timeouts, over one connection each.
    """

    def __init__(
        self, address: Union[SentinelAddress, str], **options: Unpack[BlockingOptions]
    ) -> None:
        address = address_of(address, SentinelAddress, parse_sentinel_url)
        self.address = address
        self._options = options
        # Validates every option now (a RedisClient connects nothing until used).
        primary = RedisClient(address.primary(*address.sentinels[0]), **options)
        self.command_timeout_s = primary.command_timeout_s
        ssl_context = options.get("ssl_context")
        self._sentinel_options: BlockingOptions = {
            "connect_timeout_s": primary.connect_timeout_s,
            "command_timeout_s": primary.command_timeout_s,
            "max_connections": 1,
            "ssl_context": ssl_context if address.sentinel_tls == address.tls else None,
        }
        self._sentinels = SentinelState(address)
        self._sentinel_clients: dict[tuple[str, int], RedisClient] = {}
        self._primary: Optional[RedisClient] = None
        self._primary_at: Optional[tuple[str, int]] = None
        # True when the primary must be confirmed before the next command.
        self._stale = True
        self._finding = threading.Lock()
        self.failovers = 0
        """How many times the primary changed under this client (for diagnostics)."""
        abandon_in_children(self)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> SentinelClient:
        """``SentinelClient(parse_sentinel_url(url), **options)``; URL options win."""
        return client_from_url(cls, parse_sentinel_url, url, options)

    def __repr__(self) -> str:
        return f"<blocking SentinelClient {self.address} primary={self.primary_address}>"

    @property
    def primary_address(self) -> Optional[tuple[str, int]]:
        """(host, port) of the primary in use, None before the first discovery."""
        return self._primary_at

    # -- commands ----------------------------------------------------------------

    def execute(self, *args: Arg) -> Any:
        """Run one command on the primary; the blocking RedisClient's replies and errors."""
        client = self._current()
        try:
            return client.execute(*args)
        except RedisClientError as error:
            return self._after(client, error, lambda other: other.execute(*args))

    def evalsha(self, script: ScriptLike, keys: Sequence[Arg], args: Sequence[Arg]) -> Any:
        """Run a script on the primary (EVALSHA; after NOSCRIPT, loaded and sent again)."""
        client = self._current()
        try:
            return client.evalsha(script, keys, args)
        except RedisClientError as error:
            return self._after(client, error, lambda other: other.evalsha(script, keys, args))

    def _after(
        self, client: RedisClient, error: RedisClientError, send: Callable[[RedisClient], Any]
    ) -> Any:
        """A command failed on ``client``: ask the sentinels before the next one; after
        READONLY (nothing ran) send it once more, to the primary named now."""
        if isinstance(error, RedisReplyError) and not moved_primary(error.message):
            raise error
        if client is self._primary:
            self._stale = True
        if not isinstance(error, RedisReplyError):
            raise error
        return send(self._current())

    # -- lifecycle ---------------------------------------------------------------

    def connect(self) -> None:
        """Find the primary and check it answers; RedisConnectionError if not."""
        self._current().connect()

    def close(self) -> None:
        """Close the connections to the primary and the sentinels (usable again after)."""
        clients = list(self._sentinel_clients.values())
        if self._primary is not None:
            clients.append(self._primary)
        self._stale = True
        for client in clients:
            client.close()

    def after_fork_in_child(self) -> None:
        """In a fork()ed child: a lock another thread held at the fork is replaced."""
        self._finding = threading.Lock()

    # -- finding the primary -----------------------------------------------------

    def _current(self) -> RedisClient:
        primary = self._primary
        if primary is not None and not self._stale:
            return primary
        with self._finding:
            primary = self._primary
            if primary is not None and not self._stale:
                return primary  # another thread found it meanwhile
            return self._find()

    def _find(self) -> RedisClient:
        sentinels = self._sentinels
        too_soon = sentinels.too_soon()
        if too_soon is not None:
            raise too_soon
        candidate: Optional[RedisClient] = None
        try:
            where = self._ask_sentinels()
            if where == self._primary_at and self._primary is not None:
                candidate = self._primary
            else:
                candidate = RedisClient(self.address.primary(*where), **self._options)
            problem = not_a_primary(candidate.execute("ROLE"), where, self.address.service_name)
            if problem is not None:
                raise RedisConnectionError(problem)
        except RedisClientError as error:
            sentinels.failed(error)
            if candidate is not None and candidate is not self._primary:
                candidate.close()
            raise
        old = self._primary
        if candidate is not old:
            self._primary, self._primary_at = candidate, where
            if old is not None:
                self.failovers += 1
                old.close()
        self._stale = False
        sentinels.found()
        return candidate

    def _ask_sentinels(self) -> tuple[str, int]:
        sentinels = self._sentinels
        problems: list[str] = []
        for at in list(sentinels.order):
            try:
                reply = self._sentinel(at).execute(
                    "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.address.service_name
                )
            except RedisClientError as error:
                sentinels.unreachable(at, error, problems)
                continue
            where = sentinels.answer(at, reply, problems)
            if where is not None:
                return where
        raise sentinels.none_named(problems)

    def _sentinel(self, at: tuple[str, int]) -> RedisClient:
        client = self._sentinel_clients.get(at)
        if client is None:
            client = RedisClient(self.address.sentinel(*at), **self._sentinel_options)
            self._sentinel_clients[at] = client
        return client
