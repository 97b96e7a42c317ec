"""BreakerSet: one breaker per cluster node, the backend-wide one, the reported state."""

from __future__ import annotations

from moderato.breaker import CLOSED, HALF_OPEN, OPEN, BreakerSet, CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_each_node_has_its_own_breaker() -> None:
    clock = Clock()
    reported: list[str] = []
    breakers = BreakerSet(CircuitBreaker(2, 1.0, clock=clock), reported.append)
    a, b = breakers.for_node("10.0.0.1:7000"), breakers.for_node("10.0.0.2:7000")
    assert breakers.for_node("10.0.0.1:7000") is a
    assert breakers.for_node(None) is breakers.default
    assert a is not b and a is not breakers.default
    assert (a.failure_threshold, a.cooldown_s) == (2, 1.0)

    a.failure()
    a.failure()
    assert (a.state, b.state, breakers.default.state) == (OPEN, CLOSED, CLOSED)
    assert not a.allow() and b.allow() and breakers.default.allow()
    assert reported == [OPEN]
    assert breakers.nodes() == {"10.0.0.1:7000": OPEN, "10.0.0.2:7000": CLOSED}
    assert a.describe() == "backend circuit breaker for node 10.0.0.1:7000"
    assert breakers.default.describe() == "backend circuit breaker"

    # The reported state is the worst of them all: open, then half-open, then closed.
    b.failure()
    b.failure()
    clock.now_s += 1.0
    assert a.allow()  # a is half-open now, b still open
    assert reported == [OPEN, OPEN, OPEN]
    b.success()
    assert reported[-1] == HALF_OPEN
    a.success()
    assert reported[-1] == CLOSED
    assert breakers.worst_state() == CLOSED
