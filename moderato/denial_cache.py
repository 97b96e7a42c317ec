"""Denials Redis already decided, repeated locally until they expire.

An identity over its limit keeps asking; every request would cost a Redis
round trip to hear the same answer. When Redis denies a cost with a retry of
``R`` ms, the cost cannot fit before ``R`` ms have passed on Redis's clock:
the scripts' retry is the first instant at which the *same* cost fits
assuming no other traffic, and other traffic only adds usage, which moves
that instant later. So, until then, the limiter may deny the same request
(same rule, same identity, same cost) without asking.

Exactness, and what it rests on (docs/internals.md says it for users):

- Time. The deadline is on this process's monotonic clock: the instant the
  request was *issued* (before it was sent, so before Redis read its clock)
  plus ``R``, rounded down twice: less 1 ms, because the scripts truncate
  Redis's clock to the millisecond (Redis decided up to 1 ms after the
  ``now`` its retry counts from), then less 0.1% of the rest, rounded up to
  a whole millisecond, for the two clocks' rates (NTP slews each by at most
  0.05%); never more than ``MAX_HOLD_S`` ahead. No clock offset enters: only
  durations are compared, each starting no later than Redis's own. A step
  of Redis's clock (not a slew) is outside the promise, as it is for the
  scripts themselves.
- Rule and cost. An entry is keyed by the limiter's Plan (rate text and
  algorithm) and the first policy's key (prefix, tenant, scope, identity), and
  answers only the cost it was denied for: a larger cost is denied too, but
  Redis would then report a later retry and reset, so it is asked.
- Values. The local reply is Redis's reply with each policy's retry shortened
  by the time elapsed since the request was issued; remaining and the
  absolute reset instants are Redis's. While denied, remaining is below the
  cost (0 for unit costs, whatever other processes do), and reset moves only
  later under other traffic.
- Invalidation. ``reset()`` empties the cache of its own process at once and
  publishes on ``<key prefix>:denial-cache``; every limiter holding entries
  subscribes to that channel (its own connection) and empties its cache on
  any message. Entries are kept only while that subscription is confirmed,
  on the event loop that owns it, and only if no message arrived while the
  denied request was in flight (a generation number). Between a reset in
  process A and the message's arrival in process B (A's reset round trip,
  then Redis's delivery: about a millisecond on a LAN), B may still deny
  locally: that is the one bound on exactness. Keys deleted by other means
  (FLUSHDB, eviction under ``maxmemory``) are not seen: ``MAX_HOLD_S`` bounds
  that.

Only a single server (``redis://``, ``rediss://``, ``unix://``) has the
cache; on ``memory://`` a decision is already local, and clusters, Sentinel
and redis-py clients go to Redis every time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import time
from typing import Any, Optional, cast

import hiredis

from .redis import RedisClient
from .redis._encoding import encode_command
from .redis.forks import abandon_in_children

logger = logging.getLogger("moderato")

DEFAULT_MAX_ENTRIES = 10_000
"""Identities denied at once that one limiter remembers (oldest forgotten first)."""

MAX_HOLD_S = 10.0
"""No entry lives longer: bounds what keys deleted outside ``reset()`` could cause."""

_RATE_MARGIN = 1000
"""Deadlines lose ``1 / _RATE_MARGIN`` of the retry (at least 1 ms): room for two clocks' rates."""

_CLOCK_RESOLUTION_MS = 1
"""The scripts read Redis's TIME in whole milliseconds, truncated: Redis's
decision may have happened up to this much after the instant its retry counts from."""

_RETRY_SUBSCRIBE_S = 1.0
"""After a failed subscription, the next attempt waits at least this long."""

_REFUSED_RETRY_S = 60.0
"""After Redis refused the subscription (ACL), this long."""

# Reply layout: [allowed, deciding, then (remaining_scaled, retry_ms, reset_ms) per policy].
_FIRST_RETRY = 3
_STRIDE = 3

CacheKey = tuple[object, bytes]


def channel_for(key_prefix: str) -> bytes:
    """The pub/sub channel on which resets under ``key_prefix`` are announced."""
    return key_prefix.encode() + b":denial-cache"


class _Entry:
    __slots__ = ("cost_scaled", "deadline_s", "issued_s", "reply")

    def __init__(
        self, cost_scaled: int, deadline_s: float, issued_s: float, reply: list[int]
    ) -> None:
        self.cost_scaled = cost_scaled
        self.deadline_s = deadline_s
        self.issued_s = issued_s
        self.reply = reply


def _hold_ms(retry_ms: int) -> int:
    """How long after issuing the request its denial may be repeated, rounded down.

    Redis's retry counts from its clock truncated to the millisecond, so
    Redis decided up to ``_CLOCK_RESOLUTION_MS`` after that instant: the
    denial is sure to hold for ``retry_ms - 1`` ms after the request was
    issued (issued before Redis decided), less the rate margin, rounded up.
    """
    sure_ms = retry_ms - _CLOCK_RESOLUTION_MS
    return sure_ms - -(-sure_ms // _RATE_MARGIN)


class DenialCache:
    """One limiter's remembered denials, and the subscription that keeps them honest."""

    def __init__(
        self,
        client: RedisClient,
        key_prefix: str,
        *,
        max_entries: int = DEFAULT_MAX_ENTRIES,
    ) -> None:
        self.max_entries = max_entries
        self.channel = channel_for(key_prefix)
        # The subscription greets the server as the client's own connections do.
        self._client = client
        self._address = client.address
        self._entries: dict[CacheKey, _Entry] = {}
        # Bumped by every invalidation: a reply whose request was issued under an
        # older generation may predate a reset, so it is not remembered.
        self.generation = 0
        # The loop whose subscription is confirmed; None while there is none.
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._subscription: Optional[_Subscription] = None
        self._task: Optional[asyncio.Task[None]] = None
        self._next_attempt_s = 0.0
        self.clock = time.monotonic
        abandon_in_children(self)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def subscribed(self) -> bool:
        """Whether resets elsewhere would reach this cache (so denials are remembered)."""
        return self._loop is not None

    # -- the check path ------------------------------------------------------------

    def lookup(self, plan: object, first_key: bytes, cost_scaled: int) -> Optional[list[int]]:
        """Redis's reply as it would read now, if this exact request is known denied.

        The entry's key ``(plan, first_key)`` is built only when something is
        cached: while nobody is denied, a lookup allocates nothing.
        """
        entries = self._entries
        if not entries:
            return None
        key = (plan, first_key)
        entry = entries.get(key)
        if entry is None or entry.cost_scaled != cost_scaled:
            return None
        if not self._trusted():
            self.invalidate()
            return None
        now_s = self.clock()
        if now_s >= entry.deadline_s:
            entries.pop(key, None)
            return None
        elapsed_ms = int((now_s - entry.issued_s) * 1000)
        reply = entry.reply.copy()
        for at in range(_FIRST_RETRY, len(reply), _STRIDE):
            retry_ms = reply[at]
            if retry_ms > 0:
                reply[at] = max(retry_ms - elapsed_ms, 0)
        return reply

    def record(
        self,
        plan: object,
        first_key: bytes,
        cost_scaled: int,
        issued_s: float,
        generation: int,
        reply: list[int],
    ) -> None:
        """Remember a denial (or forget the entry an admission contradicts).

        The entry's key ``(plan, first_key)`` is built only when needed: on the
        allowed path nothing is allocated.
        """
        if reply[0]:
            if self._entries:
                self._entries.pop((plan, first_key), None)
            return
        retry_ms = reply[_FIRST_RETRY + _STRIDE * reply[1]]
        if retry_ms <= 0:  # a permanent denial (-1): nothing to wait for
            return
        if self._loop is None:
            self._subscribe()
            return
        if generation != self.generation or not self._trusted():
            return
        hold_ms = _hold_ms(retry_ms)
        if hold_ms <= 0:
            return
        hold_s = min(hold_ms / 1000, MAX_HOLD_S)
        entries = self._entries
        key = (plan, first_key)
        entries.pop(key, None)  # re-inserted last: the oldest entry goes first
        if len(entries) >= self.max_entries:
            # Another thread may have emptied or changed it meanwhile.
            with contextlib.suppress(KeyError, RuntimeError, StopIteration):
                del entries[next(iter(entries))]
        entries[key] = _Entry(cost_scaled, issued_s + hold_s, issued_s, list(reply))

    def _trusted(self) -> bool:
        """Invalidations reach this loop: the subscription is confirmed and runs here."""
        loop = self._loop
        if loop is None:
            return False
        try:
            return asyncio.get_running_loop() is loop
        except RuntimeError:
            return False

    # -- invalidation ----------------------------------------------------------------

    def invalidate(self) -> None:
        """Forget every entry (a reset happened, or might have gone unheard)."""
        self.generation += 1
        self._entries.clear()

    def _subscribe(self) -> None:
        if self._task is not None or self.clock() < self._next_attempt_s:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._task = loop.create_task(self._connect(loop))

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> None:
        address = self._address
        subscription = _Subscription(self, loop)
        try:
            if address.unix_path is not None:
                opening: Any = loop.create_unix_connection(lambda: subscription, address.unix_path)
            elif address.tls:
                opening = loop.create_connection(
                    lambda: subscription,
                    address.host,
                    address.port,
                    ssl=self._client._ssl_context or ssl.create_default_context(),
                    server_hostname=address.host,
                )
            else:
                opening = loop.create_connection(lambda: subscription, address.host, address.port)
            await asyncio.wait_for(opening, self._client.connect_timeout_s)
            self._subscription = subscription
        except (OSError, asyncio.TimeoutError, ssl.SSLError) as error:
            logger.debug("moderato: the denial cache could not subscribe: %s", error)
            self._next_attempt_s = self.clock() + _RETRY_SUBSCRIBE_S
        finally:
            self._task = None

    def _confirmed(self, loop: asyncio.AbstractEventLoop) -> None:
        self.invalidate()  # nothing from before the subscription is trusted
        self._loop = loop

    def _lost(self, subscription: _Subscription) -> None:
        if self._subscription is subscription:
            self._subscription = None
        self._loop = None
        self.invalidate()
        self._next_attempt_s = max(self._next_attempt_s, self.clock() + _RETRY_SUBSCRIBE_S)

    def after_fork_in_child(self) -> None:
        """Right after fork(), in the child: the subscription is the parent's; let it go.

        Nothing is remembered until the child has subscribed on its own
        connection (at its next denial).
        """
        subscription, self._subscription = self._subscription, None
        self._task = None
        self._loop = None
        self._next_attempt_s = 0.0
        self.invalidate()
        if subscription is not None:
            subscription.abandon()

    def close(self) -> None:
        """Drop the subscription and every entry (the limiter is closing)."""
        subscription, self._subscription = self._subscription, None
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        self._loop = None
        self.invalidate()
        if subscription is not None:
            subscription.close()


class _Subscription(asyncio.Protocol):
    """One connection SUBSCRIBEd to the reset channel: any message empties the cache."""

    def __init__(self, cache: DenialCache, loop: asyncio.AbstractEventLoop) -> None:
        self._cache = cache
        self._loop = loop
        self._reader = hiredis.Reader()
        self._transport: Optional[asyncio.Transport] = None
        self._pid = os.getpid()  # only this process may close the socket (see redis/forks.py)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        address = self._cache._address
        payloads = []
        if address.password is not None:
            if address.username is not None:
                payloads.append(encode_command("AUTH", address.username, address.password))
            else:
                payloads.append(encode_command("AUTH", address.password))
        payloads.append(encode_command("SUBSCRIBE", self._cache.channel))
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
            logger.warning("moderato: the denial cache's subscription broke: %s", error)
            self.close()

    def _handle(self, reply: Any) -> None:
        if isinstance(reply, list) and reply:
            kind = reply[0]
            if kind == b"message":
                self._cache.invalidate()
            elif kind == b"subscribe":
                self._cache._confirmed(self._loop)
        elif isinstance(reply, hiredis.ReplyError):
            # AUTH or SUBSCRIBE refused (an ACL without the channel): no cache,
            # and a new attempt only after a while.
            logger.warning("moderato: the denial cache cannot subscribe: %s", reply)
            self.close()
            self._cache._next_attempt_s = self._cache.clock() + _REFUSED_RETRY_S

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._cache._lost(self)

    def close(self) -> None:
        if self._pid != os.getpid():
            self.abandon()
        elif self._transport is not None:
            self._transport.close()

    def abandon(self) -> None:
        """Inherited across fork(): drop the transport untouched (the parent still reads it)."""
        self._transport = None


async def announce_reset(client: RedisClient, key_prefix: str) -> None:
    """Tell every limiter under ``key_prefix`` that usage was reset (PUBLISH)."""
    await client.execute("PUBLISH", channel_for(key_prefix), b"reset")
