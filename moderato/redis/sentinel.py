"""SentinelClient: the primary of a Sentinel-watched Redis, found and followed across failovers.

Finding the primary. The sentinels are asked in turn (``SENTINEL MASTER``
and ``SENTINEL REPLICAS``, pipelined) until one names it. Each sentinel
reports the configuration epoch of what it names; a failover raises it. An
answer older than the newest configuration this client has seen comes from a
sentinel that has not yet heard of a failover, and is passed over. The server
named must answer ``ROLE`` with ``master``, and so must every connection the
client opens to it later, reconnects included (the ROLE check is part of each
connection's handshake): a demoted primary is never sent a command.

Following a failover. The client subscribes to every sentinel's
``+switch-master`` announcement on the first event loop that uses it, so a
switchover is followed as the sentinels make it, not after a failure: the
announcing sentinel is asked at once and the old primary's connections are
closed. Besides, whatever suggests the primary moved makes the next command
ask again before it is sent:

- the primary stopped answering (a lost connection, a refused connect, a
  command timeout: any RedisConnectionError); the failed command is not
  retried, as it may have run;
- a ``-READONLY`` reply (demoted under a live connection), or a command that
  never left this process because its connection's ROLE check failed: nothing
  ran, so the command is sent once more to the primary named now.

Until the sentinels promote a replica they keep naming the dead primary, whose
ROLE check fails; asking is then limited to once per ``RETRY_INTERVAL_S``
(commands meanwhile fail fast with the last error).

Replies a failover could take back (``wait_for_replicas``, the default).
During a switchover the old primary goes on answering as a master for
seconds after its replica was promoted, and whatever it writes then is lost
when it is demoted and resyncs; after a crash, what had not reached the
replica is lost. No ROLE check can see either. So every loop turn's commands
to the primary are sent as one batch followed by ``WAIT n timeout``, and no
reply is released until ``n`` replicas have acknowledged every write before
it: a reply that could still be lost is never seen by the caller, who gets a
RedisConnectionError instead (the command may have run on a server whose
writes are about to be discarded). ``n`` starts at the number of replicas
the primary reports online (``ROLE``) when it is first used, and rises with
every WAIT that sees more and every ROLE that lists more (read again at
most once per REPLICAS_RECOUNT_S: a replica that finished its sync, say the
old primary demoted after a switchover); it is lowered only when the
sentinels report that fewer replicas are up (one was declared down), never
on the primary's own word: a primary whose replica was just promoted away
reports no replicas at all.
"""

from __future__ import annotations

import asyncio
import contextlib
from asyncio import get_running_loop
from collections.abc import AsyncGenerator, Awaitable, Sequence
from time import monotonic
from typing import TYPE_CHECKING, Any, Callable

from ._encoding import Arg, encode_command
from .client import ClientOptions, RedisClient
from .connection import CommandNotSentError, ScriptLike
from .errors import RedisClientError, RedisConnectionError, RedisReplyError
from .forks import abandon_in_children
from .sentinel_rules import (
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
from .subscriber import Subscriber
from .url import SentinelAddress, address_of, parse_sentinel_url
from .url_options import FromUrl

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["RETRY_INTERVAL_S", "SUBSCRIBE_REFUSED_RETRY_S", "SUBSCRIBE_RETRY_S", "SentinelClient"]


Send = Callable[[RedisClient], "asyncio.Future[Any]"]
# Why a reply is withheld: the error to raise in its place, and its message.
Problem = tuple[type[RedisClientError], str]


class _Primary(Primary[RedisClient]):
    __slots__ = ()

    def recount(self, role: asyncio.Future[Any]) -> None:
        """ROLE answered: every replica it lists must acknowledge from now on."""
        if not role.cancelled() and role.exception() is None:
            self.replicas = max(self.replicas, replicas_of(role.result()))


class _Batch:
    """One loop turn's commands for the primary, sent together with the WAIT after them."""

    __slots__ = ("calls", "primary")

    def __init__(self, primary: _Primary) -> None:
        self.primary = primary
        self.calls: list[tuple[Send, asyncio.Future[Any]]] = []


class SentinelClient(FromUrl, PrimaryFacts):
    """A Redis client for the primary a set of sentinels names (see the module doc).

    Takes RedisClient's options; they apply to the primary. The sentinels are
    asked with the same timeouts over one connection each, plus one subscribed
    connection each. ``batch_decisions`` (off by default; ``?batch_decisions=true``
    in the URL) is the primary's, as ClusterClient's is its nodes': the primary's
    client joins a loop turn's checks into batched calls, and the WAIT after the
    turn covers them all; a primary found after a failover batches too.
    """

    parse_url = staticmethod(parse_sentinel_url)

    def __init__(
        self,
        address: SentinelAddress | str,
        *,
        batch_decisions: bool = False,
        **options: Unpack[ClientOptions],
    ) -> None:
        address = address_of(address, SentinelAddress, parse_sentinel_url)
        self.address = address
        self._options = options
        self._batch_decisions = bool(batch_decisions)
        # Validates every option now (a RedisClient connects nothing until used).
        primary = RedisClient(address.primary(*address.sentinels[0]), **options)
        ssl_context = options.get("ssl_context")
        self._sentinel_options: ClientOptions = {
            "connect_timeout_s": primary.connect_timeout_s,
            "command_timeout_s": primary.command_timeout_s,
            "ssl_context": ssl_context if address.sentinel_tls == address.tls else None,
        }
        self._connect_timeout_s = primary.connect_timeout_s
        self.wait_for_replicas = address.wait_for_replicas
        self.replica_wait_ms = replica_wait_ms(primary.command_timeout_s)
        # Whom to ask first, the newest configuration epoch, when to ask again.
        self._sentinels = SentinelState(address)
        self._sentinel_clients: dict[tuple[str, int], RedisClient] = {}
        self._primary: _Primary | None = None
        # True when the primary must be confirmed before the next command.
        self._stale = True
        # Bumped by every announcement: a search that began before one is stale.
        self._announcements = 0
        self._finding: dict[asyncio.AbstractEventLoop, asyncio.Task[_Primary]] = {}
        self._batches: dict[asyncio.AbstractEventLoop, _Batch] = {}
        self._watch_loop: asyncio.AbstractEventLoop | None = None
        self._subscribers: dict[tuple[str, int], Subscriber] = {}
        self._resubscribe: dict[tuple[str, int], asyncio.TimerHandle] = {}
        self._watch_hook: AsyncGenerator[None, None] | None = None
        self.subscription_problems: dict[tuple[str, int], str] = {}
        """Why the subscription to a sentinel was last lost (for diagnostics)."""
        self.failovers = 0
        """How many times the primary changed under this client (for diagnostics)."""
        abandon_in_children(self)

    def __repr__(self) -> str:
        return f"<SentinelClient {self.address} primary={self.primary_address}>"

    # -- commands ----------------------------------------------------------------

    async def execute(self, *args: Arg) -> Any:
        """Run one command on the primary; RedisClient.execute's replies and errors."""
        return await self._run(lambda client: client.execute(*args))

    async def evalsha(self, script: ScriptLike, keys: Sequence[Arg], args: Sequence[Arg]) -> Any:
        """Run a script on the primary (EVALSHA; after NOSCRIPT, loaded and sent again)."""
        return await self._run(lambda client: client.evalsha(script, keys, args))

    async def _run(self, send: Send) -> Any:
        primary = await self._current()
        try:
            return await self._send(primary, send)
        except RedisReplyError as error:
            if not moved_primary(error.message):
                raise
            # Demoted to a replica: it refused the write, nothing ran.
        except CommandNotSentError:
            # It never left this process (the connection's ROLE check refused the
            # server, or the primary changed before the batch went out).
            pass
        except RedisClientError:
            self._suspect(primary)
            raise
        # Once more, to the primary the sentinels name now.
        self._suspect(primary)
        primary = await self._current()
        try:
            return await self._send(primary, send)
        except RedisConnectionError:
            self._suspect(primary)
            raise

    def _send(self, primary: _Primary, send: Send) -> Awaitable[Any]:
        if not self.wait_for_replicas:
            return send(primary.client)
        loop = get_running_loop()
        batch = self._batches.get(loop)
        if batch is None or batch.primary is not primary:
            batch = _Batch(primary)
            self._batches[loop] = batch
            # Sent at the end of this loop turn, so that the WAIT follows every
            # command of the turn on the one connection they all go to.
            loop.call_soon(self._send_batch, loop, batch)
        waiter: asyncio.Future[Any] = loop.create_future()
        batch.calls.append((send, waiter))
        return waiter

    def _send_batch(self, loop: asyncio.AbstractEventLoop, batch: _Batch) -> None:
        if self._batches.get(loop) is batch:
            del self._batches[loop]
        primary = batch.primary
        if primary is not self._primary or self._stale:
            for _, waiter in batch.calls:
                if not waiter.done():
                    waiter.set_exception(
                        CommandNotSentError(f"{host_port(primary.at)} is no longer the primary")
                    )
            return
        client = primary.client
        replies: list[asyncio.Future[Any] | None] = []
        for send, waiter in batch.calls:
            try:
                replies.append(send(client))
            except Exception as error:  # a bad argument (TypeError): this call only
                replies.append(None)
                if not waiter.done():
                    waiter.set_exception(error)
        needed = primary.replicas
        acks = client.execute("WAIT", needed, self.replica_wait_ms)
        acks.add_done_callback(
            lambda acks: self._release(primary, needed, batch.calls, replies, acks)
        )
        now = monotonic()
        if now >= primary.recount_at:
            primary.recount_at = now + REPLICAS_RECOUNT_S
            client.execute("ROLE").add_done_callback(primary.recount)

    def _release(
        self,
        primary: _Primary,
        needed: int,
        calls: list[tuple[Send, asyncio.Future[Any]]],
        replies: list[asyncio.Future[Any] | None],
        acks: asyncio.Future[Any],
    ) -> None:
        """The batch's WAIT answered: release each reply it confirmed."""
        problem = self._acks_problem(primary, needed, acks)
        late: list[tuple[asyncio.Future[Any], asyncio.Future[Any]]] = []
        for (_, waiter), reply in zip(calls, replies):
            if reply is None:
                continue
            if not reply.done():
                # Answered after the WAIT: an EVALSHA re-sent after NOSCRIPT.
                late.append((waiter, reply))
            else:
                _settle(waiter, reply, problem)
        if late:
            task = asyncio.ensure_future(self._release_late(primary, needed, late))
            task.add_done_callback(_retrieve)

    def _acks_problem(
        self, primary: _Primary, needed: int, acks: asyncio.Future[Any]
    ) -> Problem | None:
        """Why a WAIT's answer does not confirm the writes before it; None if it does."""
        if acks.cancelled():
            return RedisConnectionError, "its replicas' acknowledgement (WAIT) was cancelled"
        error = acks.exception()
        verdict = wait_verdict(
            primary.at, needed, error if error is not None else acks.result(), self.replica_wait_ms
        )
        if verdict.demoted:
            self._suspect(primary)
        count = verdict.acknowledged
        if count is not None and count > primary.replicas and primary is self._primary:
            primary.replicas = count  # more replicas than known: each must acknowledge
        if verdict.shortfall:
            self._shortfall(primary)
        return verdict.problem

    async def _release_late(
        self,
        primary: _Primary,
        needed: int,
        late: list[tuple[asyncio.Future[Any], asyncio.Future[Any]]],
    ) -> None:
        """Confirm replies that came after their batch's WAIT (their command was re-sent).

        The re-sent command went to one of this loop's connections; a WAIT on
        each of them covers it, whichever it was.
        """
        await asyncio.wait([reply for _, reply in late])
        payload = encode_command("WAIT", needed, self.replica_wait_ms)
        waits = [connection.send(payload) for connection in primary.client.connections()]
        problem: Problem | None = None
        if not waits:
            problem = RedisConnectionError, "its connection closed before WAIT could confirm it"
        if waits:
            await asyncio.wait(waits)
        for acks in waits:
            judged = self._acks_problem(primary, needed, acks)  # each one retrieved
            problem = problem or judged
        for waiter, reply in late:
            _settle(waiter, reply, problem)

    # -- lifecycle ---------------------------------------------------------------

    @property
    def batch_decisions(self) -> bool:
        """Whether the primary's client joins a loop turn's checks into batched calls
        (off by default; set it before the first check: a connection takes it when it
        opens). The sentinels' own connections never batch."""
        return self._batch_decisions

    @batch_decisions.setter
    def batch_decisions(self, on: bool) -> None:
        self._batch_decisions = bool(on)
        if self._primary is not None:
            self._primary.client.batch_decisions = self._batch_decisions

    async def connect(self) -> None:
        """Find the primary and open this loop's connections to it; RedisConnectionError if not."""
        primary = await self._current()
        await primary.client.connect()

    async def close(self) -> None:
        """Close the connections to the primary and the sentinels (usable again after)."""
        clients = list(self._sentinel_clients.values())
        if self._primary is not None:
            clients.append(self._primary.client)
        self._stale = True
        self._stop_watching()
        for client in clients:
            await client.close()

    def after_fork_in_child(self) -> None:
        """Right after fork(), in the child: let the parent's subscriptions and batches go.

        The RedisClients abandon their own connections (forks.py); the child
        asks the sentinels and subscribes again on first use.
        """
        subscribers, self._subscribers = self._subscribers, {}
        for subscriber in subscribers.values():
            subscriber.abandon()
        self._resubscribe = {}
        self._watch_loop = None
        hook, self._watch_hook = self._watch_hook, None
        if hook is not None:
            # Finished here, so that no finalizer ever schedules it on the
            # parent's loop; its finally finds nothing to stop (no I/O).
            with contextlib.suppress(StopIteration, RuntimeError):
                hook.aclose().send(None)
        self._batches = {}
        self._finding = {}
        self._stale = True

    # -- finding the primary -----------------------------------------------------

    def _suspect(self, primary: _Primary) -> None:
        if primary is self._primary:
            self._stale = True

    def _shortfall(self, primary: _Primary) -> None:
        """Too few replicas acknowledged: ask the sentinels before the next command."""
        if primary is self._primary:
            self._stale = True
            self._sentinels.failed(
                RedisConnectionError(
                    f"the replicas of {host_port(primary.at)} did not acknowledge its writes"
                )
            )

    async def _current(self) -> _Primary:
        primary = self._primary
        if primary is not None and not self._stale:
            return primary
        loop = get_running_loop()
        finding = self._finding.get(loop)
        # A search that is over (its clean-up callback not yet run) answered for
        # a time that is past: the client is stale again, so search again.
        if finding is None or finding.done():
            finding = loop.create_task(self._find())
            self._finding[loop] = finding
            finding.add_done_callback(self._found)
        # Shielded: one caller giving up must not abandon the others' discovery.
        return await asyncio.shield(finding)

    def _found(self, task: asyncio.Task[_Primary]) -> None:
        for loop, finding in list(self._finding.items()):
            if finding is task:
                del self._finding[loop]
        if not task.cancelled():
            task.exception()  # retrieved: every caller may have given up

    async def _find(self) -> _Primary:
        self._watch(get_running_loop())
        sentinels = self._sentinels
        too_soon = sentinels.too_soon()
        if too_soon is not None:
            raise too_soon
        announcements = self._announcements
        old = self._primary
        candidate: RedisClient | None = None
        try:
            where, epoch, replicas_up = await self._ask_sentinels()
            if old is not None and where == old.at:
                candidate = old.client
            else:
                candidate = RedisClient(
                    self.address.primary(*where),
                    role="master",
                    batch_decisions=self._batch_decisions,
                    **self._options,
                )
            role = await candidate.execute("ROLE")
            problem = not_a_primary(role, where, self.address.service_name)
            if problem is not None:
                raise RedisConnectionError(problem)
        except RedisClientError as error:
            sentinels.failed(error)
            if candidate is not None and (old is None or candidate is not old.client):
                await candidate.close()
            raise
        sentinels.found(epoch)
        if old is not None and candidate is old.client:
            primary = old
            primary.epoch = max(primary.epoch, epoch)
            # Only the sentinels may lower it: they saw a replica go down.
            primary.replicas = min(primary.replicas, replicas_up)
        else:
            # A new primary: the replicas it has now must acknowledge (ROLE lists them).
            primary = _Primary(candidate, where, epoch, replicas_of(role))
            self._primary = primary
            if old is not None:
                self.failovers += 1
                await old.client.close()
        # An announcement that arrived meanwhile may name a newer primary.
        self._stale = self._announcements != announcements
        return primary

    async def _ask_sentinels(self) -> Answer:
        """(where, configuration epoch, replicas up) from the first sentinel that is not behind."""
        name = self.address.service_name
        sentinels = self._sentinels
        problems: list[str] = []
        behind: list[Answer] = []
        for at in list(sentinels.order):
            client = self._sentinel(at)
            # One round trip: both go out in the same loop turn.
            asked = (
                client.execute("SENTINEL", "MASTER", name),
                client.execute("SENTINEL", "REPLICAS", name),
            )
            await asyncio.wait(asked)
            replies: tuple[Any, Any] | RedisClientError
            # Both retrieved: a refused connect fails the two of them.
            failures = [reply.exception() for reply in asked]
            failure = next((error for error in failures if error is not None), None)
            if failure is None:
                replies = (asked[0].result(), asked[1].result())
            elif isinstance(failure, RedisClientError):
                replies = failure
            else:
                raise failure
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

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Subscribe to every sentinel's ``+switch-master`` on ``loop``, unless already done."""
        watching = self._watch_loop
        if watching is loop or (watching is not None and _alive(watching)):
            return
        self._stop_watching()
        self._watch_loop = loop
        for at in self.address.sentinels:
            self._subscribe(at)
        # Closed with the loop: asyncio.run() and its kin close every live async
        # generator of a loop before closing it (as RedisClient's pools are).
        hook = _stop_watching_at_loop_shutdown(self, loop)
        with contextlib.suppress(StopIteration):
            hook.__anext__().send(None)  # runs to its first yield: nothing in it awaits
        self._watch_hook = hook  # the loop only keeps a weak reference to it

    def _subscribe(self, at: tuple[str, int]) -> None:
        self._resubscribe.pop(at, None)
        loop = self._watch_loop
        if loop is None:
            return
        subscriber = Subscriber(
            self._sentinel(at),  # the sentinel's address, TLS and timeouts
            ["+switch-master"],
            lambda channel, payload: self._announced(at, payload),
            self._unsubscribed,
        )
        self._subscribers[at] = subscriber
        subscriber.start(loop)

    def _unsubscribed(self, subscriber: Subscriber, reason: str) -> None:
        at = (subscriber.address.host, subscriber.address.port)
        loop = self._watch_loop
        if loop is None or self._subscribers.get(at) is not subscriber:
            return
        del self._subscribers[at]
        self.subscription_problems[at] = reason
        delay_s = SUBSCRIBE_REFUSED_RETRY_S if reason.startswith("refused") else SUBSCRIBE_RETRY_S
        self._resubscribe[at] = loop.call_later(delay_s, self._subscribe, at)

    def _announced(self, at: tuple[str, int], payload: bytes) -> None:
        """Sentinel ``at`` published ``+switch-master``: ``<name> <old ip port> <new ip port>``."""
        fields = payload.split()
        if not fields or fields[0].decode(errors="replace") != self.address.service_name:
            return
        self._announcements += 1
        self._stale = True
        self._sentinels.heard(at)  # it knows the new configuration: asked first
        task = get_running_loop().create_task(self._follow())
        task.add_done_callback(_retrieve)

    async def _follow(self) -> None:
        """Switch now, not at the next command: the old primary's connections close.

        Tried again (a search already under way may have begun before the
        announcement; a sentinel or the new primary may be slow to answer)
        until the client is no longer stale, for at most FOLLOW_FOR_S.
        """
        deadline = monotonic() + FOLLOW_FOR_S
        while self._stale and self._watch_loop is not None and monotonic() < deadline:
            try:
                await self._current()
            except RedisClientError:
                await asyncio.sleep(RETRY_INTERVAL_S)
            else:
                # Still stale: another announcement came during that search.
                # Never without yielding to the loop.
                await asyncio.sleep(0)

    def _stop_watching(self) -> None:
        loop, self._watch_loop = self._watch_loop, None
        subscribers, self._subscribers = self._subscribers, {}
        timers, self._resubscribe = self._resubscribe, {}
        hook, self._watch_hook = self._watch_hook, None
        if loop is None:
            return

        def stop() -> None:
            for timer in timers.values():
                timer.cancel()
            for subscriber in subscribers.values():
                subscriber.close()
            if hook is not None:
                # Retired: its finally finds nothing left to stop. RuntimeError:
                # it is the one running (the loop is shutting down).
                with contextlib.suppress(StopIteration, RuntimeError):
                    hook.aclose().send(None)

        try:
            if get_running_loop() is loop:
                stop()
                return
        except RuntimeError:
            pass
        # Another thread's loop: its transports may only be touched there.
        with contextlib.suppress(RuntimeError):  # closed meanwhile: nothing left to stop
            loop.call_soon_threadsafe(stop)


async def _stop_watching_at_loop_shutdown(
    client: SentinelClient, loop: asyncio.AbstractEventLoop
) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        if client._watch_loop is loop:
            client._stop_watching()


def _settle(
    waiter: asyncio.Future[Any], reply: asyncio.Future[Any], problem: Problem | None
) -> None:
    """Hand ``reply``'s outcome to ``waiter``, unless ``problem`` withholds it."""
    if reply.cancelled():
        if not waiter.done():
            waiter.cancel()
        return
    error = reply.exception()
    if waiter.done():
        return
    if error is not None:
        waiter.set_exception(error)  # an error reply or a lost command: as it is
    elif problem is not None:
        # A fresh exception per caller: one instance raised in many tasks
        # would collect all their tracebacks.
        kind, message = problem
        waiter.set_exception(kind(message))
    else:
        waiter.set_result(reply.result())


def _alive(loop: asyncio.AbstractEventLoop) -> bool:
    return not loop.is_closed() and loop.is_running()


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()
