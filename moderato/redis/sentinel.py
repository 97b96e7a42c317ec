"""SentinelClient: the primary of a Sentinel-watched Redis, found and followed across failovers.

The sentinels are asked for the primary (``SENTINEL get-master-addr-by-name``,
each sentinel in turn until one answers); the server they name is sent
``ROLE`` and used only if it answers ``master``. Commands then go to it
through a RedisClient (every loop, every pipelining trick of the single-node
client).

Following a failover. Whatever suggests the primary moved makes the next
command ask again before it is sent:

- the primary stopped answering (a lost connection, a refused connect, a
  command timeout: any RedisConnectionError); the failed command is not retried, as it
  may have run;
- a ``-READONLY`` reply: the server was demoted to a replica and refused the
  write, so nothing ran there and the command is sent once more to the primary
  the sentinels name now.

Until the sentinels promote a replica they keep naming the dead primary, whose
ROLE check fails; asking again is then limited to once per
``RETRY_INTERVAL_S`` (commands meanwhile fail fast with the last error), so an
outage costs the sentinels a few queries a second, not one per check. A server
that is not (or no longer) a master is never sent a command: that is what
"never decide on a replica" takes, since a replica that still holds an old
copy of the counters would admit what the primary already spent.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from asyncio import get_running_loop
from collections.abc import Awaitable, Sequence
from time import monotonic
from typing import TYPE_CHECKING, Any, Callable

from ._encoding import Arg
from .client import ClientOptions, RedisClient
from .connection import ScriptLike
from .errors import RedisClientError, RedisConnectionError, RedisReplyError
from .url import SentinelAddress, address_of, parse_sentinel_url
from .url_options import client_from_url

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["RETRY_INTERVAL_S", "SentinelClient"]

RETRY_INTERVAL_S = 0.05


class SentinelClient:
    """A Redis client for the primary a set of sentinels names (see the module doc).

    Takes RedisClient's options; they apply to the primary. The sentinels are
    asked with the same timeouts over one connection each.
    """

    def __init__(self, address: SentinelAddress | str, **options: Unpack[ClientOptions]) -> None:
        address = address_of(address, SentinelAddress, parse_sentinel_url)
        self.address = address
        self._options = options
        # Validates every option now (a RedisClient connects nothing until used).
        primary = RedisClient(address.primary(*address.sentinels[0]), **options)
        ssl_context = options.get("ssl_context")
        self._sentinel_options: ClientOptions = {
            "connect_timeout_s": primary.connect_timeout_s,
            "command_timeout_s": primary.command_timeout_s,
            "ssl_context": ssl_context if address.sentinel_tls == address.tls else None,
        }
        self._sentinel_order = list(address.sentinels)
        self._sentinel_clients: dict[tuple[str, int], RedisClient] = {}
        self._primary: RedisClient | None = None
        self._primary_at: tuple[str, int] | None = None
        # True when the primary must be confirmed before the next command.
        self._stale = True
        self._finding: dict[asyncio.AbstractEventLoop, asyncio.Task[RedisClient]] = {}
        self._retry_at = 0.0
        self._last_error: RedisClientError | None = None
        self.failovers = 0
        """How many times the primary changed under this client (for diagnostics)."""

    @classmethod
    def from_url(cls, url: str, **options: Any) -> SentinelClient:
        """``SentinelClient(parse_sentinel_url(url), **options)``; URL options win."""
        return client_from_url(cls, parse_sentinel_url, url, options)

    def __repr__(self) -> str:
        return f"<SentinelClient {self.address} primary={self.primary_address}>"

    @property
    def primary_address(self) -> tuple[str, int] | None:
        """(host, port) of the primary in use, None before the first discovery."""
        return self._primary_at

    # -- commands ----------------------------------------------------------------

    async def execute(self, *args: Arg) -> Any:
        """Run one command on the primary; RedisClient.execute's replies and errors."""
        return await self._run(lambda client: client.execute(*args))

    async def evalsha(self, script: ScriptLike, keys: Sequence[Arg], args: Sequence[Arg]) -> Any:
        """Run a script on the primary (EVALSHA; after NOSCRIPT, loaded and sent again)."""
        return await self._run(lambda client: client.evalsha(script, keys, args))

    async def _run(self, send: Callable[[RedisClient], Awaitable[Any]]) -> Any:
        client = await self._current()
        try:
            return await send(client)
        except RedisReplyError as error:
            if "READONLY" not in error.message:
                raise
            # Demoted to a replica: it refused the write, nothing ran. Once more
            # to the primary the sentinels name now.
            self._suspect(client)
            client = await self._current()
            return await send(client)
        except RedisClientError:
            self._suspect(client)
            raise

    # -- lifecycle ---------------------------------------------------------------

    async def connect(self) -> None:
        """Find the primary and open this loop's connections to it; RedisConnectionError if not."""
        client = await self._current()
        await client.connect()

    async def close(self) -> None:
        """Close the connections to the primary and the sentinels (usable again after)."""
        clients = list(self._sentinel_clients.values())
        if self._primary is not None:
            clients.append(self._primary)
        self._stale = True
        for client in clients:
            await client.close()

    # -- finding the primary -----------------------------------------------------

    def _suspect(self, client: RedisClient) -> None:
        if client is self._primary:
            self._stale = True

    async def _current(self) -> RedisClient:
        primary = self._primary
        if primary is not None and not self._stale:
            return primary
        loop = get_running_loop()
        finding = self._finding.get(loop)
        if finding is None:
            finding = loop.create_task(self._find())
            self._finding[loop] = finding
            finding.add_done_callback(self._found)
        # Shielded: one caller giving up must not abandon the others' discovery.
        return await asyncio.shield(finding)

    def _found(self, task: asyncio.Task[RedisClient]) -> None:
        for loop, finding in list(self._finding.items()):
            if finding is task:
                del self._finding[loop]
        if not task.cancelled():
            task.exception()  # retrieved: every caller may have given up

    async def _find(self) -> RedisClient:
        wait_s = self._retry_at - monotonic()
        if wait_s > 0 and self._last_error is not None:
            raise RedisConnectionError(
                f"{self._last_error}; next sentinel query in {math.ceil(wait_s * 1000)} ms"
            )
        candidate: RedisClient | None = None
        try:
            where = await self._ask_sentinels()
            if where == self._primary_at and self._primary is not None:
                candidate = self._primary
            else:
                candidate = RedisClient(self.address.primary(*where), **self._options)
            role = await candidate.execute("ROLE")
            if not (isinstance(role, list) and role and role[0] == b"master"):
                shown = role[0].decode() if isinstance(role, list) and role else repr(role)
                raise RedisConnectionError(
                    f"{_host_port(where)}, named primary of {self.address.service_name!r} "
                    f"by the sentinels, is a {shown} (a failover in progress?)"
                )
        except RedisClientError as error:
            self._retry_at = monotonic() + RETRY_INTERVAL_S
            self._last_error = error
            if candidate is not None and candidate is not self._primary:
                await candidate.close()
            raise
        old = self._primary
        if candidate is not old:
            self._primary, self._primary_at = candidate, where
            if old is not None:
                self.failovers += 1
                await old.close()
        self._stale = False
        self._last_error = None
        return candidate

    async def _ask_sentinels(self) -> tuple[str, int]:
        name = self.address.service_name
        problems: list[str] = []
        for at in list(self._sentinel_order):
            try:
                reply = await self._sentinel(at).execute(
                    "SENTINEL", "GET-MASTER-ADDR-BY-NAME", name
                )
            except RedisClientError as error:
                problems.append(f"sentinel {_host_port(at)}: {error}")
                continue
            if reply is None:
                problems.append(f"sentinel {_host_port(at)} does not monitor {name!r}")
                continue
            with contextlib.suppress(ValueError, TypeError, IndexError, AttributeError):
                where = (reply[0].decode(), int(reply[1]))
                # The sentinel that answered is asked first next time.
                self._sentinel_order.remove(at)
                self._sentinel_order.insert(0, at)
                return where
            problems.append(f"sentinel {_host_port(at)} replied {reply!r}")
        raise RedisConnectionError(
            f"no sentinel of {self.address} named a primary for {name!r}: " + "; ".join(problems)
        )

    def _sentinel(self, at: tuple[str, int]) -> RedisClient:
        client = self._sentinel_clients.get(at)
        if client is None:
            client = RedisClient(self.address.sentinel(*at), **self._sentinel_options)
            self._sentinel_clients[at] = client
        return client


def _host_port(at: tuple[str, int]) -> str:
    host, port = at
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
