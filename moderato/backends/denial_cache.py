"""Denials Redis already decided, repeated locally until they expire: a backend wrapper.

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
  publishes on ``<key prefix>:denial-cache`` (announce.py); every limiter
  holding entries subscribes to that channel (its own connection, the
  client's Subscriber) and empties its cache on any message. Entries are
  kept only while that subscription is confirmed, on the event loop that
  owns it, and only if no message arrived while the denied request was in
  flight (a generation number). Between a reset in process A and the
  message's arrival in process B (A's reset round trip, then Redis's
  delivery: about a millisecond on a LAN), B may still deny locally: that is
  the one bound on exactness. Keys deleted by other means
  (FLUSHDB, eviction under ``maxmemory``) are not seen: ``MAX_HOLD_S`` bounds
  that.

Only a single server (``redis://``, ``rediss://``, ``unix://``) has the
cache; on ``memory://`` a decision is already local, and clusters, Sentinel
and redis-py clients go to Redis every time.

The cache is a backend: ``DenialCachingBackend`` wraps the single server's
RedisBackend. Its ``start_check`` answers a remembered denial with the
CheckResult itself, which the limiter returns as it is, without counting a
backend call (so only while the limiter's breaker is closed: an outage is
handled exactly as without the cache); any other check goes to Redis, and
its reply, once decoded, may be remembered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Sequence
from typing import Any, Optional, Union

from .. import _accel
from ..algorithms import Algorithm, ScriptArg
from ..breaker import CLOSED, CircuitBreaker
from ..errors import RateLimitConfigError
from ..keys import KeySpace
from ..metrics import Metrics
from ..plans import Plan
from ..policy import SCALE
from ..redis import RedisClient
from ..redis.forks import abandon_in_children
from ..redis.subscriber import Subscriber
from ..results import CheckResult
from ..scripts import load_script
from .announce import channel_for
from .base import Backend, DirectDecisions, Part
from .redis import RedisBackend
from .replies import ALLOWED, DECIDING, POLICY_FIELDS, RETRY, DecisionReply, decoded, policy_at

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

CacheKey = tuple[object, bytes]

_FIRST_RETRY = policy_at(0) + RETRY
"""Where the first policy's retry_ms sits in a reply (replies.py), worked out once."""


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
        # The subscription reaches and greets the server as the client's own connections do.
        self._client = client
        self._entries: dict[CacheKey, _Entry] = {}
        # Bumped by every invalidation: a reply whose request was issued under an
        # older generation may predate a reset, so it is not remembered.
        self.generation = 0
        # The loop whose subscription is confirmed; None while there is none.
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        # The subscription, connecting or confirmed; None while there is none.
        self._subscriber: Optional[Subscriber] = None
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
        # _trusted(), inline: this runs for every denial answered here.
        loop = self._loop
        try:
            trusted = loop is not None and asyncio.get_running_loop() is loop
        except RuntimeError:
            trusted = False
        if not trusted:
            self.invalidate()
            return None
        now_s = self.clock()
        if now_s >= entry.deadline_s:
            entries.pop(key, None)
            return None
        elapsed_ms = int((now_s - entry.issued_s) * 1000)
        reply = entry.reply.copy()
        for at in range(_FIRST_RETRY, len(reply), POLICY_FIELDS):
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
        if reply[ALLOWED]:
            if self._entries:
                self._entries.pop((plan, first_key), None)
            return
        retry_ms = reply[_FIRST_RETRY + POLICY_FIELDS * reply[DECIDING]]
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
        if self._subscriber is not None or self.clock() < self._next_attempt_s:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        subscriber = Subscriber(
            self._client,  # its server, credentials, TLS and timeouts
            [self.channel.decode()],
            self._message,
            self._lost,
            on_subscribed=lambda _: self._confirmed(loop),
        )
        self._subscriber = subscriber
        subscriber.start(loop)

    def _message(self, channel: bytes, payload: bytes) -> None:
        self.invalidate()

    def _confirmed(self, loop: asyncio.AbstractEventLoop) -> None:
        self.invalidate()  # nothing from before the subscription is trusted
        self._loop = loop

    def _lost(self, subscriber: Subscriber, reason: str) -> None:
        if self._subscriber is not subscriber:
            return  # an old subscription's last word
        self._subscriber = None
        self._loop = None
        self.invalidate()
        if subscriber.refused:
            # AUTH or SUBSCRIBE refused (an ACL without the channel): no cache,
            # and a new attempt only after a while.
            logger.warning("moderato: the denial cache cannot subscribe: %s", reason)
            wait_s = _REFUSED_RETRY_S
        else:
            if reason.startswith("malformed"):
                logger.warning("moderato: the denial cache's subscription broke: %s", reason)
            else:
                logger.debug("moderato: the denial cache's subscription ended: %s", reason)
            wait_s = _RETRY_SUBSCRIBE_S
        self._next_attempt_s = max(self._next_attempt_s, self.clock() + wait_s)

    def after_fork_in_child(self) -> None:
        """Right after fork(), in the child: the subscription is the parent's; let it go.

        Nothing is remembered until the child has subscribed on its own
        connection (at its next denial).
        """
        subscriber, self._subscriber = self._subscriber, None
        self._loop = None
        self._next_attempt_s = 0.0
        self.invalidate()
        if subscriber is not None:
            subscriber.abandon()

    def close(self) -> None:
        """Drop the subscription and every entry (the limiter is closing)."""
        subscriber, self._subscriber = self._subscriber, None
        self._loop = None
        self.invalidate()
        if subscriber is not None:
            subscriber.close()


Ticket = tuple[bytes, int, float, int]
"""What remembering a sent check's denial needs: its first key and cost, the instant it
was issued and the cache's generation then."""


class DenialCachingBackend(DirectDecisions):
    """A single server's RedisBackend whose denials are remembered (see the module doc).

    Everything but a check's start and finish is the wrapped backend's; the
    limiter's (single) circuit breaker tells whether a local answer may be given.
    """

    synchronous = False
    """Every decision that is not remembered waits for Redis's reply."""

    node_of = None
    reload_routes = None
    """A single server: one breaker, no slot map."""

    def __init__(
        self,
        backend: RedisBackend,
        cache: DenialCache,
        *,
        breaker: CircuitBreaker,
        metrics: Optional[Metrics],
    ) -> None:
        self.backend = backend
        self.client = backend.client
        self.cache = cache
        self._breaker = breaker
        self._local_denials = metrics.local_denials if metrics is not None else None
        # The checks sent and not yet finished, by the client's future: finish_check or
        # check_failed takes each one out (a dict, not an object around the future:
        # awaiting the future itself costs the check nothing more).
        self._in_flight: dict[object, Ticket] = {}
        self.delete_matching = backend.delete_matching

    def bind(self, keyspace: KeySpace) -> None:
        self.keyspace = keyspace
        self.backend.bind(keyspace)
        # The wrapped backend's own, unchanged (taken here: decision_keys is on every check).
        self.decision_keys = self.backend.decision_keys

    # -- a check ---------------------------------------------------------------------

    def start_check(
        self, plan: Plan, keys: list[bytes], cost_scaled: int, apply: bool
    ) -> Union[Awaitable[Any], CheckResult]:
        """A remembered denial's CheckResult, at once; else the decision, sent."""
        if not apply:  # a peek (get_usage) is never remembered nor answered locally
            return self.backend.start_check(plan, keys, cost_scaled, apply)
        cache = self.cache
        # An empty cache answers nothing: no lookup() call (the admitted check's path).
        if cache._entries and self._breaker.state == CLOSED:
            local = cache.lookup(plan, keys[0], cost_scaled)
            if local is not None:
                if self._local_denials is not None:
                    self._local_denials.labels(plan.algorithm.name).inc()
                result: CheckResult = _accel.check_result(local, plan.result_shape)
                return result
        # Issued before it is sent, so before Redis reads its clock.
        issued_s = cache.clock()
        generation = cache.generation
        # The wrapped RedisBackend.start_check, applied (a peek went there above), inline.
        args = plan.unit_args if cost_scaled == SCALE else plan.arguments(cost_scaled, True)
        sent = self.client.evalsha(load_script(plan.script_name), keys, args)
        self._in_flight[sent] = (keys[0], cost_scaled, issued_s, generation)
        return sent

    def finish_check(self, plan: Plan, sent: object, reply: Any) -> CheckResult:
        ticket = self._in_flight.pop(sent, None)
        result = decoded(plan, reply)
        if ticket is not None:  # the reply decoded cleanly: it may be remembered
            if reply[ALLOWED]:
                # record()'s admitted case without the call: an admission forgets the
                # entry it contradicts; nothing is remembered.
                entries = self.cache._entries
                if entries:
                    entries.pop((plan, ticket[0]), None)
                return result
            first_key, cost_scaled, issued_s, generation = ticket
            self.cache.record(plan, first_key, cost_scaled, issued_s, generation, reply)
        return result

    def check_failed(self, plan: Plan, sent: object, error: BaseException) -> BaseException:
        self._in_flight.pop(sent, None)
        return self.backend.check_failed(plan, sent, error)

    # -- everything else: the wrapped backend's ------------------------------------------

    async def connect(self) -> None:
        await self.backend.connect()

    async def close(self) -> None:
        self.cache.close()
        await self.backend.close()

    def direct_reply(
        self, algorithm: Algorithm, keys: Sequence[bytes], args: Sequence[ScriptArg]
    ) -> Awaitable[object]:
        return self.backend.direct_reply(algorithm, keys, args)

    def decide_together(self, parts: Sequence[Part]) -> Awaitable[list[DecisionReply]]:
        return self.backend.decide_together(parts)

    async def reset(self, keys: Sequence[bytes], windows_s: Sequence[int]) -> int:
        return await self.backend.reset(keys, windows_s)

    async def announce_reset(self) -> None:
        """Empty this process's cache at once, then every other limiter's (pub/sub)."""
        self.cache.invalidate()
        await self.backend.announce_reset()


def with_denial_cache(
    backend: Backend,
    max_entries: object,
    *,
    key_prefix: str,
    breaker: CircuitBreaker,
    metrics: Optional[Metrics],
) -> Backend:
    """``backend``, wrapped to remember ``max_entries`` denials when it is a single
    server's and ``max_entries`` is not 0 (off); RateLimitConfigError for a bad size."""
    if type(max_entries) is not int or max_entries < 0:
        raise RateLimitConfigError(
            f"denial_cache_size must be an int >= 0 (0 = off), got {max_entries!r}"
        )
    if not max_entries or not isinstance(backend, RedisBackend):
        return backend
    client = backend.client
    if not isinstance(client, RedisClient):
        return backend
    cache = DenialCache(client, key_prefix, max_entries=max_entries)
    return DenialCachingBackend(backend, cache, breaker=breaker, metrics=metrics)
