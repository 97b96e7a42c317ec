"""SentinelClient (blocking): the primary a set of sentinels names, found and followed.

The asyncio SentinelClient's rules (moderato/redis/sentinel.py tells them in
full), with blocking calls; what needs no I/O is the same code
(sentinel_rules.py):

- finding: the sentinels are asked in turn (``SENTINEL MASTER`` and
  ``SENTINEL REPLICAS``, in one write); an answer older than the newest
  configuration epoch seen is passed over; the server named must answer
  ``ROLE`` with ``master``, and so must every connection opened to it later
  (the ROLE check is in each connection's greeting): a replica is never
  sent a command;
- following: a daemon thread per sentinel listens for ``+switch-master``
  and moves the client as the sentinels announce a switch; besides, a lost
  connection, a refused connect or a timeout makes the next command ask
  again (the failed one is not retried: it may have run), and a ``READONLY``
  reply or a command refused by the ROLE check (nothing ran) is sent once
  more, to the primary named now; while the named server is no primary, the
  sentinels are asked at most once per RETRY_INTERVAL_S;
- replies a failover could take back (``wait_for_replicas``, the default):
  each command is followed, in the same write on the same connection, by
  ``WAIT n timeout``, and its reply is released only once ``n`` replicas
  acknowledged it (else RedisConnectionError: the command may have run on a
  server whose writes are about to be discarded). ``n`` is what the
  asyncio client requires: the replicas the primary had when first used,
  raised by every WAIT and every ROLE (read again once a second) that sees
  more, lowered only on the sentinels' word.

One thread searches at a time; the others wait for its answer.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence
from time import monotonic
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from .._encoding import Arg
from ..connection import CommandNotSentError, ScriptLike
from ..connector import Connector
from ..errors import RedisClientError, RedisConnectionError, RedisReplyError
from ..forks import abandon_in_children
from ..sentinel_rules import (
    FOLLOW_FOR_S,
    REPLICAS_RECOUNT_S,
    RETRY_INTERVAL_S,
    SUBSCRIBE_REFUSED_RETRY_S,
    SUBSCRIBE_RETRY_S,
    Answer,
    Primary,
    PrimaryFacts,
    SentinelState,
    host_port,
    moved_primary,
    not_a_primary,
    replica_wait_ms,
    replicas_of,
    wait_verdict,
)
from ..url import SentinelAddress, address_of, parse_sentinel_url
from ..url_options import FromUrl
from .client import RedisClient
from .subscriber import POLL_S, BlockingSubscriber

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .client import BlockingOptions

__all__ = ["SentinelClient"]

# (the command's reply, WAIT's reply) of one call; WAIT's is None without wait_for_replicas.
Send = Callable[[RedisClient, Optional[Sequence[Arg]]], tuple[Any, Any]]


class SentinelClient(FromUrl, PrimaryFacts):
    """A blocking Redis client for the primary a set of sentinels names; safe across threads.

    Takes the blocking RedisClient's options; they apply to the primary. The
    sentinels are asked with the same timeouts over one connection each, and
    listened to over one more each (on a daemon thread).
    """

    parse_url = staticmethod(parse_sentinel_url)
    batches_decisions = False  # a call a check, never batched

    def __init__(
        self, address: Union[SentinelAddress, str], **options: Unpack[BlockingOptions]
    ) -> None:
        address = address_of(address, SentinelAddress, parse_sentinel_url)
        self.address = address
        self._options = options
        # Validates every option now (a RedisClient connects nothing until used).
        primary = RedisClient(address.primary(*address.sentinels[0]), **options)
        self.command_timeout_s = primary.command_timeout_s
        self._connect_timeout_s = primary.connect_timeout_s
        ssl_context = options.get("ssl_context")
        self._sentinel_ssl_context = ssl_context if address.sentinel_tls == address.tls else None
        self._sentinel_options: BlockingOptions = {
            "connect_timeout_s": primary.connect_timeout_s,
            "command_timeout_s": primary.command_timeout_s,
            "max_connections": 1,
            "ssl_context": self._sentinel_ssl_context,
        }
        self.wait_for_replicas = address.wait_for_replicas
        self.replica_wait_ms = replica_wait_ms(primary.command_timeout_s)
        self._sentinels = SentinelState(address)
        self._sentinel_clients: dict[tuple[str, int], RedisClient] = {}
        self._primary: Optional[Primary[RedisClient]] = None
        # True when the primary must be confirmed before the next command.
        self._stale = True
        # Bumped by every announcement: a search that began before one is stale.
        self._announcements = 0
        self._finding = threading.Lock()
        self._subscribers: dict[tuple[str, int], BlockingSubscriber] = {}
        self.failovers = 0
        """How many times the primary changed under this client (for diagnostics)."""
        abandon_in_children(self)

    def __repr__(self) -> str:
        return f"<blocking SentinelClient {self.address} primary={self.primary_address}>"

    # -- commands ----------------------------------------------------------------

    def execute(self, *args: Arg) -> Any:
        """Run one command on the primary; the blocking RedisClient's replies and errors."""

        def send(client: RedisClient, wait: Optional[Sequence[Arg]]) -> tuple[Any, Any]:
            if wait is None:
                return client.execute(*args), None
            command, acks = client.execute_many([args, wait], raise_on_error=False)
            return command, acks

        return self._run(send)

    def evalsha(self, script: ScriptLike, keys: Sequence[Arg], args: Sequence[Arg]) -> Any:
        """Run a script on the primary (EVALSHA; after NOSCRIPT, loaded and sent again)."""

        def send(client: RedisClient, wait: Optional[Sequence[Arg]]) -> tuple[Any, Any]:
            if wait is None:
                return client.evalsha(script, keys, args), None
            return client.evalsha_followed(script, keys, args, wait)

        return self._run(send)

    def _run(self, send: Send) -> Any:
        primary = self._current()
        try:
            return self._confirmed(primary, send)
        except RedisReplyError as error:
            if not moved_primary(error.message):
                raise
            # Demoted to a replica: it refused the write, nothing ran.
        except CommandNotSentError:
            pass  # it never left this process (the connection's ROLE check refused the server)
        except RedisClientError:
            self._suspect(primary)
            raise
        # Once more, to the primary the sentinels name now.
        self._suspect(primary)
        primary = self._current()
        try:
            return self._confirmed(primary, send)
        except RedisConnectionError:
            self._suspect(primary)
            raise

    def _confirmed(self, primary: Primary[RedisClient], send: Send) -> Any:
        """The command's reply once the replicas acknowledged it (wait_for_replicas)."""
        if not self.wait_for_replicas:
            return send(primary.client, None)[0]
        needed = primary.replicas
        reply, acks = send(primary.client, ("WAIT", needed, self.replica_wait_ms))
        if isinstance(reply, RedisReplyError):
            raise reply  # an error reply wrote nothing: as it is
        verdict = wait_verdict(primary.at, needed, acks, self.replica_wait_ms)
        if verdict.demoted:
            self._suspect(primary)
        count = verdict.acknowledged
        if count is not None and count > primary.replicas and primary is self._primary:
            primary.replicas = count  # more replicas than known: each must acknowledge
        if verdict.shortfall and primary is self._primary:
            self._stale = True
            self._sentinels.failed(
                RedisConnectionError(
                    f"the replicas of {host_port(primary.at)} did not acknowledge its writes"
                )
            )
        if verdict.problem is not None:
            kind, message = verdict.problem
            raise kind(message)
        now = monotonic()
        if now >= primary.recount_at:
            primary.recount_at = now + REPLICAS_RECOUNT_S
            # Every replica it lists must acknowledge from now on (never lowered here).
            with contextlib.suppress(RedisClientError):
                listed = replicas_of(primary.client.execute("ROLE"))
                primary.replicas = max(primary.replicas, listed)
        return reply

    # -- lifecycle ---------------------------------------------------------------

    def connect(self) -> None:
        """Find the primary and check it answers; RedisConnectionError if not."""
        self._current().client.connect()

    def close(self) -> None:
        """Close the connections to the primary and the sentinels, and stop listening
        (usable again after)."""
        clients = list(self._sentinel_clients.values())
        if self._primary is not None:
            clients.append(self._primary.client)
        self._stale = True
        subscribers, self._subscribers = self._subscribers, {}
        for subscriber in subscribers.values():
            subscriber.close()
        for client in clients:
            client.close()

    def after_fork_in_child(self) -> None:
        """In a fork()ed child: the listening threads are the parent's (their connections
        are dropped untouched); a lock another thread held at the fork is replaced. The
        child asks the sentinels, and listens, on first use."""
        subscribers, self._subscribers = self._subscribers, {}
        for subscriber in subscribers.values():
            subscriber.abandon()
        self._finding = threading.Lock()
        self._stale = True

    # -- finding the primary -----------------------------------------------------

    def _suspect(self, primary: Primary[RedisClient]) -> None:
        if primary is self._primary:
            self._stale = True

    def _current(self) -> Primary[RedisClient]:
        primary = self._primary
        if primary is not None and not self._stale:
            return primary
        with self._finding:
            primary = self._primary
            if primary is not None and not self._stale:
                return primary  # another thread found it meanwhile
            return self._find()

    def _find(self) -> Primary[RedisClient]:
        self._listen()
        sentinels = self._sentinels
        too_soon = sentinels.too_soon()
        if too_soon is not None:
            raise too_soon
        announcements = self._announcements
        old = self._primary
        candidate: Optional[RedisClient] = None
        try:
            where, epoch, replicas_up = self._ask_sentinels()
            if old is not None and where == old.at:
                candidate = old.client
            else:
                candidate = RedisClient(
                    self.address.primary(*where), role="master", **self._options
                )
            role = candidate.execute("ROLE")
            problem = not_a_primary(role, where, self.address.service_name)
            if problem is not None:
                raise RedisConnectionError(problem)
        except RedisClientError as error:
            sentinels.failed(error)
            if candidate is not None and (old is None or candidate is not old.client):
                candidate.close()
            raise
        sentinels.found(epoch)
        if old is not None and candidate is old.client:
            primary = old
            primary.epoch = max(primary.epoch, epoch)
            # Only the sentinels may lower it: they saw a replica go down.
            primary.replicas = min(primary.replicas, replicas_up)
        else:
            # A new primary: the replicas it has now must acknowledge (ROLE lists them).
            primary = Primary(candidate, where, epoch, replicas_of(role))
            self._primary = primary
            if old is not None:
                self.failovers += 1
                old.client.close()
        # An announcement that arrived meanwhile may name a newer primary.
        self._stale = self._announcements != announcements
        return primary

    def _ask_sentinels(self) -> Answer:
        """(where, configuration epoch, replicas up) from the first sentinel that is not behind."""
        name = self.address.service_name
        sentinels = self._sentinels
        problems: list[str] = []
        behind: list[Answer] = []
        for at in list(sentinels.order):
            replies: Union[tuple[Any, Any], RedisClientError]
            try:
                master, replicas = self._sentinel(at).execute_many(
                    [("SENTINEL", "MASTER", name), ("SENTINEL", "REPLICAS", name)],
                    raise_on_error=False,
                )
                refused = next(
                    (r for r in (master, replicas) if isinstance(r, RedisReplyError)), None
                )
                replies = refused if refused is not None else (master, replicas)
            except RedisClientError as error:
                replies = error
            answer = sentinels.judge(at, replies, problems, behind)
            if answer is not None:
                return answer
        return sentinels.conclude(problems, behind)

    def _sentinel(self, at: tuple[str, int]) -> RedisClient:
        client = self._sentinel_clients.get(at)
        if client is None:
            client = RedisClient(self.address.sentinel(*at), **self._sentinel_options)
            self._sentinel_clients[at] = client
        return client

    # -- the sentinels' announcements --------------------------------------------

    def _listen(self) -> None:
        """Listen for every sentinel's ``+switch-master``, unless already listening."""
        if self._subscribers:
            return
        for at in self.address.sentinels:
            # The sentinel's address and TLS; a read waits POLL_S.
            sentinel = self.address.sentinel(*at)
            server = Connector(
                sentinel, self._connect_timeout_s, POLL_S, self._sentinel_ssl_context
            )
            subscriber = BlockingSubscriber(
                server,
                ["+switch-master"],
                lambda channel, payload, at=at: self._announced(at, payload),  # type: ignore[misc]
                retry_s=SUBSCRIBE_RETRY_S,
                refused_retry_s=SUBSCRIBE_REFUSED_RETRY_S,
            )
            self._subscribers[at] = subscriber
            subscriber.start()

    def _announced(self, at: tuple[str, int], payload: bytes) -> None:
        """Sentinel ``at`` published ``+switch-master``: ``<name> <old ip port> <new ip port>``.

        Runs on that sentinel's listening thread, which then follows the switch
        (the old primary's connections close) for at most FOLLOW_FOR_S.
        """
        fields = payload.split()
        if not fields or fields[0].decode(errors="replace") != self.address.service_name:
            return
        self._announcements += 1
        self._stale = True
        self._sentinels.heard(at)  # it knows the new configuration: asked first
        deadline = monotonic() + FOLLOW_FOR_S
        while self._stale and self._subscribers and monotonic() < deadline:
            try:
                self._current()
            except RedisClientError:
                time.sleep(RETRY_INTERVAL_S)
