"""What the batched-decision tests share (tests/redis/test_grouping.py on one node,
tests/cluster/test_cluster_batching.py on a cluster, and over TLS and Sentinel): each
algorithm's script arguments for one request, what Redis counts of the calls it ran
(INFO commandstats and errorstats since the last CONFIG RESETSTAT), and issue 30's
exact-N run.
"""

from __future__ import annotations

from copy import copy
from typing import Any

from cluster import RedisCluster, call, script_calls
from redis_servers import RedisServer
from shared_quota_worker import run_workers

from moderato.algorithms import ALGORITHMS
from moderato.redis.grouping import group_checks, joining
from moderato.scripts import BATCH_PART_UNITS, MAX_BATCH_PARTS

# cost 1000 (one request), charge, capacity 100 requests, a day's window.
ARGS = {name: ["1000", "1", "100000", "86400"] for name in ALGORITHMS}
ARGS["token_bucket"] = [*ARGS["token_bucket"], ""]


def repeats_per_call(algorithm: str) -> int:
    """The checks one batched call takes when each repeats the one before (one hot
    identity's checks, as ARGS sends them): the first weighs BATCH_PART_UNITS, each repeat
    its algorithm's batch_repeat_units, within its batch_parts checks' units."""
    entry = ALGORITHMS[algorithm]
    units = min(entry.batch_parts, MAX_BATCH_PARTS) * BATCH_PART_UNITS
    return 1 + (units - BATCH_PART_UNITS) // entry.batch_repeat_units


def calls(server: RedisServer, command: str) -> int:
    """How many times ``server`` ran ``command`` (evalsha, eval or script|load)."""
    return script_calls(server.port)[command][0]


def errors(port: int) -> dict[str, int]:
    """{error prefix: replies} since the last CONFIG RESETSTAT (INFO errorstats)."""
    found = {}
    for line in call(port, "INFO", "errorstats").decode().splitlines():
        if line.startswith("errorstat_"):
            name, _, count = line[len("errorstat_") :].partition(":count=")
            found[name] = int(count)
    return found


def reset_stats(cluster: RedisCluster) -> None:
    """CONFIG RESETSTAT on every primary of ``cluster``."""
    for shard in cluster.shards():
        call(shard.primary, "CONFIG", "RESETSTAT")


def evalsha_calls(cluster: RedisCluster) -> int:
    """EVALSHA calls run on all of ``cluster``'s primaries."""
    return sum(script_calls(shard.primary)["evalsha"][0] for shard in cluster.shards())


EXACT_N_CHECKS = 4 * 125 * len(ALGORITHMS)
"""The checks of one exact-N run: 4 processes x 125 tasks, for each algorithm."""


def exact_n_admitted(
    url: str, prefix: str, rate: str, *, batch: bool = True, context: Any = None
) -> dict[str, int]:
    """Issue 30's exact-N run (tests/shared_quota_worker.py): for every algorithm in
    turn, 4 asyncio processes x 125 tasks check one key once each at the same instant.
    Asserts that exactly the rate's limit was admitted for each (the message shows each
    process's report and ``context``), and returns {algorithm: admitted}. ``batch``:
    every worker turns its client's batch_decisions on; False leaves it to the URL."""
    environment = {"SHARED_QUOTA_WORKERS": "125", "SHARED_QUOTA_CHECKS_EACH": "1"}
    if batch:
        environment["SHARED_QUOTA_BATCH"] = "1"
    algorithms = list(ALGORITHMS)
    reports = run_workers(["async"] * 4, url, prefix, rate, algorithms, environment)
    totals = {name: sum(report[name] for report in reports) for name in algorithms}
    limit = int(rate.split("/")[0])
    assert totals == dict.fromkeys(algorithms, limit), (reports, context)
    return totals


# -- the joining in C against grouping.py's (tests/redis/test_grouping*.py) ----------------

_STATE = ("_write_buffer", "_scripts", "_pending", "_loads", "_loaded_forms")


def joined_state(connection: Any, originals: list[Any]) -> dict[str, Any]:
    """What a joining leaves on ``connection``, comparable across the two: the write
    buffer; each record with its script by identity and each argument with its type;
    each slot of _pending as the check's own future (by identity), a batched call's
    futures (by identity) or a load nobody awaits; the loads and the loaded forms."""

    def slot(future: Any) -> Any:
        parts = getattr(future, "_parts", None)
        if parts is not None:
            return ("batch", [id(part) for part in parts])
        if any(future is original for original in originals):
            return ("own", id(future))
        return ("load", type(future), future.done())

    return {
        "buffer": list(connection._write_buffer),
        "scripts": [
            (number, id(script), list(keys), [(type(arg), arg) for arg in args], resends)
            for number, script, keys, args, resends in connection._scripts
        ],
        "pending": [slot(future) for future in connection._pending],
        "loads": dict(connection._loads),
        "loaded": set(connection._loaded_forms),
    }


def _snapshot(connection: Any) -> list[Any]:
    return [copy(getattr(connection, name)) for name in _STATE]


def _restore(connection: Any, saved: list[Any]) -> None:
    for name, value in zip(_STATE, saved):
        held = getattr(connection, name)
        if isinstance(held, list):
            held[:] = value
        else:
            held.clear()
            held.update(value) if isinstance(held, (dict, set)) else held.extend(value)


def join_both(connection: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Join ``connection``'s turn with grouping.group_checks, put the turn back as it
    was, join it in C (grouping.joining, what the client runs), and return what each
    left; the C joining's result stays on the connection."""
    originals = [*connection._pending]
    saved = _snapshot(connection)
    group_checks(connection)
    python = joined_state(connection, originals)
    _restore(connection, saved)
    joining(connection)()
    return python, joined_state(connection, originals)


class Compared:
    """A client's joining that runs both and asserts they leave the same (the C one
    kept): RedisClient._grouping patched with its for_client. ``turns``: the turns joined."""

    def __init__(self) -> None:
        self.turns = 0

    def for_client(self, connection: Any) -> Any:
        def compare() -> None:
            python, in_c = join_both(connection)
            assert in_c == python
            self.turns += 1

        return compare
