"""An exact, pure-Python model of moderato's decision scripts (lua/*.lua).

It is the oracle the scripts are tested against (and, later, the in-process
backend): the same state, the same arguments, the same reply. It states the
math of docs/internals.md and docs/algorithms.md as directly as Python allows -- unbounded
ints, so ``elapsed * capacity // window`` needs none of the splitting the Lua
code does to stay below 2^53 -- and it searches for retry instants in ways
independent of the scripts' (scans and bisections over the exact functions
rather than float estimates corrected by them).

The one place it uses floats is the custom token refill rate, which is documented
keeps in floating point; there it performs the scripts' operations in the
same order on IEEE doubles, so the results agree bit for bit.

State is a dict of Redis keys: ``{key: Entry(value, expire_at_ms)}`` where the
value is an int (a string key holding a decimal integer), a dict of ints (a
hash) or a SortedSet (member -> integer score), and ``expire_at_ms`` is the
absolute expiry (PEXPIRETIME) or None. A key is gone once the clock passes its
expiry, as in Redis (expired iff ``now_ms > expire_at_ms``).

GCRA is stated with exact rationals (``fractions.Fraction``): the theoretical
arrival time advances by exactly ``cost * window / capacity``, which the script
stores as whole microseconds plus a remainder in 1/capacity of a microsecond.

A burst (``Policy.burst_scaled``, the token bucket, GCRA and the leaky bucket):
the bucket holds ``burst_scaled`` while it refills ``capacity_scaled`` per
window, so ``capacity_scaled`` is the refill and ``bucket_scaled`` what the
bucket holds (the same number without a burst).

Every decision function has the signature
``(state, now_ms, cost_scaled, apply, policies) -> (reply, new_state)`` and
leaves its input untouched. The reply is the flat layout of docs/internals.md:
``[allowed, deciding, remaining_scaled, retry_ms, reset_ms, ...]``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Optional, Union

MAX_SAFE_INTEGER = 2**53
MAX_CAPACITY_SCALED = 9_007_199_254_000
MAX_WINDOW_S = 86_400
"""The direct contract's day: a custom refill rate fills the bucket within it."""
MAX_LONG_WINDOW_S = 3600 * 86_400
ACCRUAL_EXACT_WINDOW_MS = 94_906_266
"""Past this window the token and leaky buckets take capacity <= 2^53 // window_ms."""
GCRA_MAX_WINDOW_S = 3_599_627
BUCKET_REFILL_BOUND_S = MAX_LONG_WINDOW_S
"""A burst of the token and leaky buckets refills within this, in whole windows."""
GCRA_REFILL_BOUND_S = GCRA_MAX_WINDOW_S
"""A GCRA burst's tolerance, in whole windows, stays within GCRA's longest window."""
MAX_POLICIES = 16
MAX_RESET_KEYS = 256
"""reset takes every algorithm's base keys at once: 16 policies of up to 16 algorithms."""
MAX_STATE_TIME_MS = 2**52
"""A stored token-bucket base beyond this is corrupt (room is left to add waits below 2^53)."""
BUCKET_EXPIRY_MARGIN_MS = 60_000
BUCKET_SUFFIX = ":bucket:v2"
GCRA_SUFFIX = ":gcra"
LOG_SUFFIX = ":log"
LEAKY_SUFFIX = ":leaky"
DRAINED_EXPIRY_MARGIN_MS = 1000
"""GCRA, leaky bucket: a key expires this long after it would read as empty."""
US_PER_MS = 1000
LOG_TOTAL_DIGITS = 16
"""A log member's running total is zero-padded to this width, so members sort by it."""


@dataclass(frozen=True)
class SortedSet:
    """A Redis sorted set: each member's score (integers here)."""

    scores: Mapping[str, int]

    def ordered(self) -> list[tuple[int, str]]:
        """(score, member) in Redis's order: by score, then by member bytes."""
        return sorted((score, member) for member, score in self.scores.items())


Value = Union[int, dict[str, int], SortedSet]


@dataclass(frozen=True)
class Entry:
    value: Value
    expire_at_ms: Optional[int] = None


State = dict[str, Entry]


@dataclass(frozen=True)
class Policy:
    key: str
    """The policy's base key (KEYS[i])."""
    capacity_scaled: int
    window_s: int
    refill_scaled_per_s: Optional[float] = None
    """Token bucket only: None for the exact public rule, else a custom rate."""
    burst_scaled: Optional[int] = None
    """The buckets and GCRA: what the bucket holds, apart from the refill per window
    (capacity_scaled); None: the capacity, as without a burst."""

    @property
    def window_ms(self) -> int:
        return self.window_s * 1000

    @property
    def bucket_scaled(self) -> int:
        """What the bucket holds: the burst, else the capacity (which is also the refill)."""
        return self.capacity_scaled if self.burst_scaled is None else self.burst_scaled


class ModelArgumentError(ValueError):
    """The scripts answer this with a MODERATO_ARG error reply."""


class ModelStateError(ValueError):
    """The scripts answer this with a MODERATO_STATE error reply."""


# -- helpers shared by every algorithm -------------------------------------------------


def expire(state: Mapping[str, Entry], now_ms: int) -> State:
    """The keys still alive at now_ms (Redis: a key is expired once now > its expiry)."""
    return {
        key: entry
        for key, entry in state.items()
        if entry.expire_at_ms is None or now_ms <= entry.expire_at_ms
    }


def exact_accrual(policy: Policy) -> None:
    """The token and leaky buckets' long-window rule (prelude.lua's split_per_ms)."""
    window_ms = policy.window_ms
    largest_scaled = MAX_SAFE_INTEGER // window_ms
    if window_ms > ACCRUAL_EXACT_WINDOW_MS and policy.capacity_scaled > largest_scaled:
        raise ModelArgumentError(f"capacity_scaled {policy.capacity_scaled} above {largest_scaled}")


def gcra_window(policy: Policy) -> None:
    if policy.window_s > GCRA_MAX_WINDOW_S:
        raise ModelArgumentError(f"window_s {policy.window_s} too long for gcra")


def burst_layout(policies: Sequence[Policy]) -> bool:
    """Whether a call sends a burst field per policy: when any of its policies has one
    (the others then send their capacity, which is the same policy)."""
    return any(policy.burst_scaled is not None for policy in policies)


def largest_burst_scaled(policy: Policy, bound_s: int) -> int:
    """The largest burst that refills within bound_s in whole windows:
    ceil(burst / capacity) * window_s <= bound_s."""
    return min(MAX_CAPACITY_SCALED, bound_s // policy.window_s * policy.capacity_scaled)


def validate(
    cost_scaled: int,
    apply: bool,
    policies: Sequence[Policy],
    *,
    token: bool,
    long_window: Optional[Callable[[Policy], None]] = None,
    burst_bound_s: Optional[int] = None,
) -> None:
    """The argument checks every script makes before touching a key."""
    bursting = burst_layout(policies)
    if bursting and burst_bound_s is None:
        raise ModelArgumentError("this algorithm takes no burst")
    if not 1 <= len(policies) <= MAX_POLICIES:
        raise ModelArgumentError(f"expected 1..{MAX_POLICIES} policies, got {len(policies)}")
    keys = [policy.key for policy in policies]
    if len(set(keys)) != len(keys):
        raise ModelArgumentError("base keys must be distinct")
    if not (1 if apply else 0) <= cost_scaled <= MAX_SAFE_INTEGER:
        raise ModelArgumentError(f"cost_scaled {cost_scaled} out of range")
    for policy in policies:
        if not 1 <= policy.capacity_scaled <= MAX_CAPACITY_SCALED:
            raise ModelArgumentError(f"capacity_scaled {policy.capacity_scaled} out of range")
        if not 1 <= policy.window_s <= MAX_LONG_WINDOW_S:
            raise ModelArgumentError(f"window_s {policy.window_s} out of range")
        rate = policy.refill_scaled_per_s
        if rate is not None:
            if not token:
                raise ModelArgumentError("only the token bucket takes a refill rate")
            # The scripts compare in doubles; capacity / 86400 is the correctly rounded quotient.
            if not (
                math.isfinite(rate)
                and policy.capacity_scaled / MAX_WINDOW_S <= rate <= MAX_CAPACITY_SCALED
            ):
                raise ModelArgumentError(f"refill_scaled_per_s {rate!r} out of range")
        if long_window is not None:
            long_window(policy)
        if bursting:
            assert burst_bound_s is not None
            burst = policy.bucket_scaled
            if not 1 <= burst <= MAX_CAPACITY_SCALED:
                raise ModelArgumentError(f"burst_scaled {burst} out of range")
            if rate is not None:
                raise ModelArgumentError("a burst takes the exact public refill")
            if burst > largest_burst_scaled(policy, burst_bound_s):
                raise ModelArgumentError(f"burst_scaled {burst} refills too slowly")


@dataclass
class Verdict:
    """One policy's view of the request, on the state as read (no writes yet)."""

    fits: bool
    permanent: bool
    remaining_uncharged: int
    remaining_charged: int = 0
    reset_charged_ms: int = 0
    reset_uncharged_ms: int = 0
    retry_ms: int = 0
    reset_denied_ms: int = 0
    write: Callable[[State], None] = field(default=lambda state: None)


def conclude(verdicts: Sequence[Verdict], apply: bool, state: State) -> tuple[list[int], State]:
    """Admit iff every policy fits; pick the deciding policy; only then apply the writes."""
    allowed = all(verdict.fits for verdict in verdicts)
    triples: list[tuple[int, int, int]] = []
    for verdict in verdicts:
        if verdict.permanent:
            triples.append((verdict.remaining_uncharged, -1, -1))
        elif allowed:
            triples.append((verdict.remaining_charged, 0, verdict.reset_charged_ms))
        elif verdict.fits:
            triples.append((verdict.remaining_uncharged, 0, verdict.reset_uncharged_ms))
        else:
            triples.append((verdict.remaining_uncharged, verdict.retry_ms, verdict.reset_denied_ms))
    if allowed:
        # The fewest remaining feeds the headers; min() keeps the lowest index on ties.
        deciding = min(range(len(triples)), key=lambda i: triples[i][0])
    else:
        # The longest wait, a permanent one counting as infinite; lowest index on ties.
        deciding = max(
            range(len(triples)),
            key=lambda i: (math.inf if triples[i][1] == -1 else triples[i][1], -i),
        )
    reply = [int(allowed), deciding]
    for triple in triples:
        reply.extend(triple)
    new_state = dict(state)
    if allowed and apply:
        for verdict in verdicts:
            verdict.write(new_state)
    return reply, new_state


def _counter(state: State, key: str) -> int:
    entry = state.get(key)
    if entry is None:
        return 0
    if not isinstance(entry.value, int) or not 0 <= entry.value <= MAX_SAFE_INTEGER:
        raise ModelStateError(f"key {key!r} holds {entry.value!r}")
    return entry.value


def _increment(state: State, key: str, amount: int, expire_at_ms: int) -> None:
    """A window counter charged: the expiry is set when it is found at 0 (created), and
    kept otherwise (a counter that lost it keeps none)."""
    used = _counter(state, key)
    kept = expire_at_ms if used == 0 else state[key].expire_at_ms
    state[key] = Entry(used + amount, kept)


def _decide(
    evaluate: Callable[[State, int, int, Policy], Verdict],
    state: Mapping[str, Entry],
    now_ms: int,
    cost_scaled: int,
    apply: bool,
    policies: Sequence[Policy],
    *,
    token: bool = False,
    long_window: Optional[Callable[[Policy], None]] = None,
    burst_bound_s: Optional[int] = None,
) -> tuple[list[int], State]:
    validate(
        cost_scaled,
        apply,
        policies,
        token=token,
        long_window=long_window,
        burst_bound_s=burst_bound_s,
    )
    live = expire(state, now_ms)
    verdicts = [evaluate(live, now_ms, cost_scaled, policy) for policy in policies]
    return conclude(verdicts, apply, live)


def script_fields(algorithm: str, policies: Sequence[Policy]) -> list[Union[int, str]]:
    """The per-policy ARGV fields of a call (docs/internals.md): capacity_scaled, window_s,
    the token bucket's refill rate ("" for the public rule), then burst_scaled for every
    policy when any has a burst (a policy without one sends its capacity)."""
    bursting = burst_layout(policies)
    fields: list[Union[int, str]] = []
    for policy in policies:
        fields += [policy.capacity_scaled, policy.window_s]
        if algorithm == "token_bucket":
            rate = policy.refill_scaled_per_s
            fields.append("" if rate is None else repr(rate))
        if bursting:
            fields.append(policy.bucket_scaled)
    return fields


# -- fixed window ----------------------------------------------------------------------


def _fixed_window_verdict(state: State, now_ms: int, cost_scaled: int, policy: Policy) -> Verdict:
    window_ms = policy.window_ms
    window_index = now_ms // window_ms
    window_end_ms = (window_index + 1) * window_ms
    key = f"{policy.key}:{window_index}"
    used_scaled = _counter(state, key)
    headroom_scaled = policy.capacity_scaled - used_scaled
    return Verdict(
        fits=cost_scaled <= headroom_scaled,
        permanent=cost_scaled > policy.capacity_scaled,
        remaining_uncharged=max(0, headroom_scaled),
        remaining_charged=max(0, headroom_scaled - cost_scaled),
        reset_charged_ms=window_end_ms,
        reset_uncharged_ms=window_end_ms,
        retry_ms=window_end_ms - now_ms,
        reset_denied_ms=window_end_ms,
        write=lambda new: _increment(new, key, cost_scaled, window_end_ms),
    )


def fixed_window(
    state: Mapping[str, Entry],
    now_ms: int,
    cost_scaled: int,
    apply: bool,
    policies: Sequence[Policy],
) -> tuple[list[int], State]:
    return _decide(_fixed_window_verdict, state, now_ms, cost_scaled, apply, policies)


# -- token bucket ----------------------------------------------------------------------


@dataclass(frozen=True)
class Bucket:
    tokens_scaled: int
    base_ms: int
    credited_scaled: int


def _custom_credit_scaled(rate: float, elapsed_ms: int) -> int:
    """Float accrual, exactly as the script computes it: (elapsed * rate) / 1000, floored."""
    return math.floor(float(elapsed_ms) * rate / 1000.0)


def _read_hash(state: State, key: str, limits: Mapping[str, int]) -> Optional[dict[str, int]]:
    """The hash at key, None if missing; every named field must be an integer 0..its limit."""
    entry = state.get(key)
    if entry is None:
        return None
    fields = entry.value
    if not isinstance(fields, dict):
        raise ModelStateError(f"key {key!r} is not a hash")
    for name, high in limits.items():
        value = fields.get(name)
        if not isinstance(value, int) or not 0 <= value <= high:
            raise ModelStateError(f"field {name} of {key!r} is {value!r}")
    return fields


def read_bucket(state: State, key: str) -> Optional[Bucket]:
    limits = {"tokens": MAX_SAFE_INTEGER, "base": MAX_STATE_TIME_MS, "credited": MAX_SAFE_INTEGER}
    fields = _read_hash(state, key, limits)
    if fields is None:
        return None
    return Bucket(fields["tokens"], fields["base"], fields["credited"])


def refill(policy: Policy, bucket: Optional[Bucket], now_ms: int) -> tuple[Bucket, int]:
    """The bucket brought up to now_ms, and the ms elapsed since its (new) base.

    ALGORITHMS.md's rule, plus what the scripts do with state no consistent
    history produces (a clock that stepped back, a changed capacity or rate):
    credit nothing and restart the accrual at now. The bucket holds
    ``bucket_scaled`` and refills ``capacity_scaled`` per window.
    """
    capacity = policy.bucket_scaled
    refill_scaled = policy.capacity_scaled
    if bucket is None:
        return Bucket(capacity, now_ms, 0), 0
    now_eff_ms = max(now_ms, bucket.base_ms)  # a base ahead of the clock: no time has passed
    elapsed_ms = now_eff_ms - bucket.base_ms
    tokens = min(bucket.tokens_scaled, capacity)
    credited = bucket.credited_scaled
    base_ms = bucket.base_ms
    rate = policy.refill_scaled_per_s

    if rate is None:
        window_ms = policy.window_ms
        due = elapsed_ms * refill_scaled // window_ms
        inconsistent = credited >= refill_scaled or due < credited
    else:
        due = _custom_credit_scaled(rate, elapsed_ms)
        inconsistent = due < credited

    if inconsistent:
        base_ms, credited, elapsed_ms = now_eff_ms, 0, 0
        full = tokens >= capacity
    else:
        tokens = min(capacity, tokens + due - credited)
        credited = due
        full = tokens == capacity
        if not full and rate is not None and due > MAX_SAFE_INTEGER:
            raise ModelStateError("custom refill accrual passed 2^53")
        if rate is None and elapsed_ms >= policy.window_ms:
            # Rebase at whole windows so credited stays below one window's refill.
            whole_windows = elapsed_ms // policy.window_ms
            base_ms += whole_windows * policy.window_ms
            elapsed_ms -= whole_windows * policy.window_ms
            credited -= whole_windows * refill_scaled
    if full:
        # A full bucket discards idle credit, fractions too.
        return Bucket(capacity, now_eff_ms, 0), 0
    return Bucket(tokens, base_ms, credited), elapsed_ms


def wait_end_after_base_ms(
    policy: Policy, bucket: Bucket, elapsed_ms: int, need_scaled: int
) -> int:
    """The ms after the bucket's base at which need_scaled more units are credited."""
    rate = policy.refill_scaled_per_s
    if rate is None:
        # Smallest t with floor(t * C / W) >= credited + need: ceil((credited + need) * W / C).
        target = bucket.credited_scaled + need_scaled
        return -(-target * policy.window_ms // policy.capacity_scaled)
    # The scripts add in doubles; so does the model.
    target_f = float(bucket.credited_scaled) + float(need_scaled)

    def reached(t: int) -> bool:
        return _custom_credit_scaled(rate, t) >= target_f

    # The accrual is monotone in t: bracket by doubling, then bisect.
    low, step = elapsed_ms, 1
    high = low
    while not reached(high):
        low, high, step = high + 1, high + step, step * 2
    while low < high:
        middle = (low + high) // 2
        if reached(middle):
            high = middle
        else:
            low = middle + 1
    return low


def bucket_ttl_ms(policy: Policy) -> int:
    """Twice the longer of a full refill and the window, plus a margin: a burst's full
    refill counted in whole windows."""
    whole_windows = max(1, -(-policy.bucket_scaled // policy.capacity_scaled))
    full_refill_ms = whole_windows * policy.window_ms
    if policy.refill_scaled_per_s is not None:
        full_refill_ms = max(
            full_refill_ms,
            math.ceil(float(policy.capacity_scaled) * 1000.0 / policy.refill_scaled_per_s),
        )
    return 2 * full_refill_ms + BUCKET_EXPIRY_MARGIN_MS


def _bucket_verdict(
    policy: Policy, stored: Optional[Bucket], now_ms: int, cost_scaled: int
) -> tuple[Verdict, Bucket]:
    """A token bucket's verdict (no write yet) and the bucket brought up to now_ms."""
    capacity = policy.bucket_scaled
    bucket, elapsed_ms = refill(policy, stored, now_ms)
    tokens = bucket.tokens_scaled

    def reset_ms(need_scaled: int) -> int:
        return bucket.base_ms + wait_end_after_base_ms(policy, bucket, elapsed_ms, need_scaled)

    fits = cost_scaled <= tokens
    permanent = cost_scaled > capacity
    verdict = Verdict(fits=fits, permanent=permanent, remaining_uncharged=tokens)
    if fits:
        verdict.remaining_charged = tokens - cost_scaled
        verdict.reset_charged_ms = reset_ms(capacity - tokens + cost_scaled)
        verdict.reset_uncharged_ms = reset_ms(capacity - tokens)
    elif not permanent:
        verdict.reset_denied_ms = reset_ms(cost_scaled - tokens)
        verdict.retry_ms = verdict.reset_denied_ms - now_ms
    return verdict, bucket


def _token_bucket_verdict(state: State, now_ms: int, cost_scaled: int, policy: Policy) -> Verdict:
    key = policy.key + BUCKET_SUFFIX
    verdict, bucket = _bucket_verdict(policy, read_bucket(state, key), now_ms, cost_scaled)

    def write(new: State) -> None:
        fields = {
            "tokens": bucket.tokens_scaled - cost_scaled,
            "base": bucket.base_ms,
            "credited": bucket.credited_scaled,
        }
        new[key] = Entry(fields, now_ms + bucket_ttl_ms(policy))

    verdict.write = write
    return verdict


def token_bucket(
    state: Mapping[str, Entry],
    now_ms: int,
    cost_scaled: int,
    apply: bool,
    policies: Sequence[Policy],
) -> tuple[list[int], State]:
    return _decide(
        _token_bucket_verdict,
        state,
        now_ms,
        cost_scaled,
        apply,
        policies,
        token=True,
        long_window=exact_accrual,
        burst_bound_s=BUCKET_REFILL_BOUND_S,
    )


# -- sliding window --------------------------------------------------------------------


def previous_weight_permille(window_s: int, elapsed_s: int) -> int:
    return (window_s - elapsed_s) * 1000 // window_s


def _first_second(seconds: range, fits: Callable[[int], bool]) -> Optional[int]:
    """The first second of the range that fits (fits is monotone: false, then true)."""
    low, high = seconds.start, seconds.stop  # search [low, high); high means none
    while low < high:
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle + 1
    return low if low < seconds.stop else None


def _sliding_window_verdict(state: State, now_ms: int, cost_scaled: int, policy: Policy) -> Verdict:
    window_s, window_ms, capacity = policy.window_s, policy.window_ms, policy.capacity_scaled
    window_index = now_ms // window_ms
    window_start_ms = window_index * window_ms
    window_end_ms = window_start_ms + window_ms
    elapsed_s = (now_ms - window_start_ms) // 1000
    current_key = f"{policy.key}:{window_index}"
    previous_key = f"{policy.key}:{window_index - 1}"
    current = _counter(state, current_key)
    previous = _counter(state, previous_key)

    def estimate(previous_scaled: int, current_scaled: int, second: int) -> int:
        return previous_scaled * previous_weight_permille(window_s, second) // 1000 + current_scaled

    headroom = capacity - estimate(previous, current, elapsed_s)
    fits = cost_scaled <= headroom
    permanent = cost_scaled > capacity

    def write(new: State) -> None:
        _increment(new, current_key, cost_scaled, window_end_ms + window_ms)

    verdict = Verdict(
        fits=fits,
        permanent=permanent,
        remaining_uncharged=max(0, headroom),
        remaining_charged=max(0, headroom - cost_scaled),
        reset_charged_ms=window_end_ms,
        reset_uncharged_ms=window_end_ms,
        write=write,
    )
    if not fits and not permanent:
        # The first whole second at which the same estimate admits the cost, with no other
        # traffic: later in this window, else in the next (this counter becomes the previous
        # one), else at the start of the one after.
        second = _first_second(
            range(elapsed_s + 1, window_s),
            lambda s: estimate(previous, current, s) + cost_scaled <= capacity,
        )
        if second is not None:
            retry_at_ms = window_start_ms + second * 1000
        else:
            second = _first_second(
                range(window_s), lambda s: estimate(current, 0, s) + cost_scaled <= capacity
            )
            if second is not None:
                retry_at_ms = window_end_ms + second * 1000
            else:
                retry_at_ms = window_end_ms + window_ms
        verdict.reset_denied_ms = retry_at_ms
        verdict.retry_ms = retry_at_ms - now_ms
    return verdict


def sliding_window(
    state: Mapping[str, Entry],
    now_ms: int,
    cost_scaled: int,
    apply: bool,
    policies: Sequence[Policy],
) -> tuple[list[int], State]:
    return _decide(_sliding_window_verdict, state, now_ms, cost_scaled, apply, policies)


# -- GCRA ------------------------------------------------------------------------------
#
# The theoretical arrival time (TAT) is when the virtual bucket is empty again. With
# W the window in µs and C the capacity, a request of cost c moves it by exactly
# c * W / C µs; it is admitted iff the new TAT lies at most W ahead of now. So a
# fresh key admits C scaled units at once, and capacity drains continuously. With a
# burst B (the bucket holds B, refilled C per window) the tolerance is B * W / C.


def read_tat(state: State, key: str, capacity_scaled: int) -> Optional[Fraction]:
    """The stored TAT in µs, exactly: tat + frac / capacity (a frac >= capacity counts as 1)."""
    fields = _read_hash(state, key, {"tat": MAX_SAFE_INTEGER, "frac": MAX_SAFE_INTEGER})
    if fields is None:
        return None
    return fields["tat"] + Fraction(min(fields["frac"], capacity_scaled), capacity_scaled)


def _ceil_ms(at_us: Fraction) -> int:
    return math.ceil(at_us / US_PER_MS)


def _gcra_verdict(state: State, now_ms: int, cost_scaled: int, policy: Policy) -> Verdict:
    key = policy.key + GCRA_SUFFIX
    capacity = policy.capacity_scaled  # the refill per window: the TAT's unit
    burst = policy.bucket_scaled
    window_us = policy.window_ms * US_PER_MS
    tolerance_us = Fraction(burst * window_us, capacity)  # W without a burst
    now_us = now_ms * US_PER_MS
    tat = read_tat(state, key, capacity)
    # A passed TAT is an empty bucket; one more than the tolerance ahead (the clock
    # stepped back) reads as a full one.
    start = Fraction(now_us)
    if tat is not None:
        start = min(max(tat, start), now_us + tolerance_us)
    # The scaled units in the bucket, rounded up: what remains is the whole units left.
    remaining = burst - math.ceil((start - now_us) * capacity / window_us)
    fits = cost_scaled <= remaining
    permanent = cost_scaled > burst
    verdict = Verdict(
        fits=fits,
        permanent=permanent,
        remaining_uncharged=remaining,
        reset_uncharged_ms=_ceil_ms(start),
    )
    if permanent:
        return verdict
    new_tat = start + Fraction(cost_scaled * window_us, capacity)
    if fits:
        verdict.remaining_charged = remaining - cost_scaled
        verdict.reset_charged_ms = _ceil_ms(new_tat)

        def write(new: State) -> None:
            whole_us = math.floor(new_tat)
            fraction = (new_tat - whole_us) * capacity
            assert fraction.denominator == 1
            fields = {"tat": whole_us, "frac": int(fraction)}
            new[key] = Entry(fields, verdict.reset_charged_ms + DRAINED_EXPIRY_MARGIN_MS)

        verdict.write = write
    else:
        # The cost fits once the new TAT lies no more than the tolerance ahead.
        verdict.reset_denied_ms = _ceil_ms(new_tat - tolerance_us)
        verdict.retry_ms = verdict.reset_denied_ms - now_ms
    return verdict


def gcra(
    state: Mapping[str, Entry],
    now_ms: int,
    cost_scaled: int,
    apply: bool,
    policies: Sequence[Policy],
) -> tuple[list[int], State]:
    return _decide(
        _gcra_verdict,
        state,
        now_ms,
        cost_scaled,
        apply,
        policies,
        long_window=gcra_window,
        burst_bound_s=GCRA_REFILL_BOUND_S,
    )


# -- sliding log -----------------------------------------------------------------------
#
# Exact rolling window: usage is the sum of the costs admitted in (now - W, now].
# Each admission is a member "<total>:<cost>" scored with its instant (ms), where
# total is the running sum of costs since the log was last empty, zero-padded to 16
# digits so that members of one instant sort by it. The script reads usage as
# newest total - (first total in the window - its cost) and bisects the totals for a
# retry; this model sums costs directly.


@dataclass(frozen=True)
class LogEntry:
    at_ms: int
    total_scaled: int
    """The running total through this entry since the log was last empty."""
    cost_scaled: int

    @property
    def member(self) -> str:
        return log_member(self.total_scaled, self.cost_scaled)


_LOG_MEMBER = re.compile(rf"([0-9]{{{LOG_TOTAL_DIGITS}}}):([0-9]+)")


def log_member(total_scaled: int, cost_scaled: int) -> str:
    return f"{total_scaled:0{LOG_TOTAL_DIGITS}d}:{cost_scaled}"


def _log_entry(key: str, score: int, member: str) -> LogEntry:
    match = _LOG_MEMBER.fullmatch(member)
    if not isinstance(score, int) or not 0 <= score <= MAX_STATE_TIME_MS or match is None:
        raise ModelStateError(f"log {key!r} holds {member!r} at {score!r}")
    total, cost = int(match[1]), int(match[2])
    if not 1 <= cost <= total <= MAX_SAFE_INTEGER:
        raise ModelStateError(f"log {key!r} holds {member!r}")
    return LogEntry(score, total, cost)


def read_log(state: State, key: str, cutoff_ms: int) -> tuple[Optional[LogEntry], list[LogEntry]]:
    """The newest entry (in the window or not) and the entries in the window (after cutoff).

    These are the entries a decision reads; older ones are only ever trimmed, unread.
    Within the window each running total must follow from the previous one.
    """
    entry = state.get(key)
    if entry is None:
        return None, []
    if not isinstance(entry.value, SortedSet):
        raise ModelStateError(f"key {key!r} is not a sorted set")
    ordered = entry.value.ordered()
    if not ordered:
        return None, []
    newest = _log_entry(key, *ordered[-1])
    window = [_log_entry(key, score, member) for score, member in ordered if score > cutoff_ms]
    for previous, following in zip(window, window[1:]):
        if following.total_scaled != previous.total_scaled + following.cost_scaled:
            raise ModelStateError(f"log {key!r}: running totals do not chain")
    return newest, window


def _sliding_log_verdict(state: State, now_ms: int, cost_scaled: int, policy: Policy) -> Verdict:
    key = policy.key + LOG_SUFFIX
    capacity, window_ms = policy.capacity_scaled, policy.window_ms
    cutoff_ms = now_ms - window_ms
    newest, window = read_log(state, key, cutoff_ms)
    headroom = capacity - sum(entry.cost_scaled for entry in window)
    # A clock that stepped back never reorders the log: stamp no earlier than the newest.
    stamp_ms = now_ms if newest is None else max(now_ms, newest.at_ms)
    verdict = Verdict(
        fits=cost_scaled <= headroom,
        permanent=cost_scaled > capacity,
        remaining_uncharged=max(0, headroom),
        remaining_charged=max(0, headroom - cost_scaled),
        reset_uncharged_ms=window[-1].at_ms + window_ms if window else now_ms,
    )
    # Allowed: full recovery once the newest entry has left the window (a usage read, of
    # cost 0, adds none).
    verdict.reset_charged_ms = stamp_ms + window_ms if cost_scaled else verdict.reset_uncharged_ms
    if not verdict.fits and not verdict.permanent:
        # The oldest entries leave first; the cost fits once enough of them have.
        need, freed = cost_scaled - headroom, 0
        for entry in window:
            freed += entry.cost_scaled
            if freed >= need:
                verdict.reset_denied_ms = entry.at_ms + window_ms
                break
        verdict.retry_ms = verdict.reset_denied_ms - now_ms

    def write(new: State) -> None:
        kept = window
        total = kept[-1].total_scaled + cost_scaled if kept else cost_scaled
        # Trimming (everything at or before the cutoff) and the expiry happen once per
        # second of the stamp: when the log is empty or its newest entry is from an
        # earlier second, and when renumbering.
        stamp_second_ms = stamp_ms - stamp_ms % 1000
        renew = newest is None or newest.at_ms < stamp_second_ms
        if total > MAX_SAFE_INTEGER:
            # Renumber the running totals from zero (rare: after 2^53 scaled units).
            base = kept[0].total_scaled - kept[0].cost_scaled
            kept = [LogEntry(e.at_ms, e.total_scaled - base, e.cost_scaled) for e in kept]
            total = kept[-1].total_scaled + cost_scaled
            renew = True
        if renew:
            scores = {entry.member: entry.at_ms for entry in kept}
            expire_at_ms = stamp_second_ms + 2000 + window_ms
        else:
            stored = new[key]
            assert isinstance(stored.value, SortedSet)
            scores, expire_at_ms = dict(stored.value.scores), stored.expire_at_ms
        scores[log_member(total, cost_scaled)] = stamp_ms
        new[key] = Entry(SortedSet(scores), expire_at_ms)

    verdict.write = write
    return verdict


def sliding_log(
    state: Mapping[str, Entry],
    now_ms: int,
    cost_scaled: int,
    apply: bool,
    policies: Sequence[Policy],
) -> tuple[list[int], State]:
    return _decide(_sliding_log_verdict, state, now_ms, cost_scaled, apply, policies)


# -- leaky bucket (policing) -----------------------------------------------------------
#
# A level that drains capacity per window and admits a cost iff level + cost fits.
# It is the token bucket's dual, tokens = capacity - level, with the same exact
# public accrual: the hash stores level, base and drained (scaled units drained
# since base), and an empty bucket discards its idle drain as a full token bucket
# discards idle credit.


def _leaky_verdict(state: State, now_ms: int, cost_scaled: int, policy: Policy) -> Verdict:
    key = policy.key + LEAKY_SUFFIX
    capacity = policy.bucket_scaled
    limits = {"level": MAX_SAFE_INTEGER, "base": MAX_STATE_TIME_MS, "drained": MAX_SAFE_INTEGER}
    fields = _read_hash(state, key, limits)
    stored = None
    if fields is not None:
        # A level above capacity (capacity lowered on a live key) reads as full.
        tokens = capacity - min(fields["level"], capacity)
        stored = Bucket(tokens, fields["base"], fields["drained"])
    verdict, bucket = _bucket_verdict(policy, stored, now_ms, cost_scaled)

    def write(new: State) -> None:
        fields = {
            "level": capacity - bucket.tokens_scaled + cost_scaled,
            "base": bucket.base_ms,
            "drained": bucket.credited_scaled,
        }
        # Allowed: reset_charged_ms is when the level has drained to zero.
        new[key] = Entry(fields, verdict.reset_charged_ms + DRAINED_EXPIRY_MARGIN_MS)

    verdict.write = write
    return verdict


def leaky_bucket(
    state: Mapping[str, Entry],
    now_ms: int,
    cost_scaled: int,
    apply: bool,
    policies: Sequence[Policy],
) -> tuple[list[int], State]:
    return _decide(
        _leaky_verdict,
        state,
        now_ms,
        cost_scaled,
        apply,
        policies,
        long_window=exact_accrual,
        burst_bound_s=BUCKET_REFILL_BOUND_S,
    )


# -- reset -----------------------------------------------------------------------------


def reset(
    state: Mapping[str, Entry], now_ms: int, keys: Sequence[str], windows_s: Sequence[int]
) -> tuple[int, State]:
    """Deletes every key the algorithms derive from each base now; returns how many existed."""
    if not 1 <= len(keys) <= MAX_RESET_KEYS or len(windows_s) != len(keys):
        raise ModelArgumentError(f"expected 1..{MAX_RESET_KEYS} keys, one window_s each")
    if not all(1 <= window_s <= MAX_LONG_WINDOW_S for window_s in windows_s):
        raise ModelArgumentError("window_s out of range")
    live = expire(state, now_ms)
    doomed: set[str] = set()
    for base, window_s in zip(keys, windows_s):
        window_index = now_ms // (window_s * 1000)
        doomed.update(
            {
                f"{base}:{window_index}",
                f"{base}:{window_index - 1}",
                base + BUCKET_SUFFIX,
                f"{base}:bucket",
                base + GCRA_SUFFIX,
                base + LOG_SUFFIX,
                base + LEAKY_SUFFIX,
                base,
            }
        )
    deleted = sum(1 for key in doomed if key in live)
    return deleted, {key: entry for key, entry in live.items() if key not in doomed}


DECIDERS: dict[str, Callable[..., tuple[list[int], State]]] = {
    "fixed_window": fixed_window,
    "token_bucket": token_bucket,
    "sliding_window": sliding_window,
    "gcra": gcra,
    "sliding_log": sliding_log,
    "leaky_bucket": leaky_bucket,
}
