"""A loop turn's checks joined into batched script calls (issue 30).

When a connection's flush finds two or more new commands (``ConnectionCore._flush``
calls ``_group`` first, see csrc/connection_core.c), ``group_checks`` looks at
the turn's script calls and joins each run of adjacent calls of the same decision
script (``moderato.scripts.load_script(algorithm)``, as every check sends it) into
one call of its batched form (``moderato.scripts.batched_script``): one EVALSHA,
one ``TIME``, one reply, the checks decided in the order they were sent, each
exactly as alone. Nothing waits for a batch to fill: a turn's commands leave
in the same write as they would have, only fewer of them. A run is cut at
the algorithm's ``batch_parts`` checks (``MAX_BATCH_PARTS`` at most; a check sent as
the one before it again weighs ``batch_repeat_units / BATCH_PART_UNITS`` of one),
``MAX_BATCH_POLICIES`` policies and ``MAX_BATCH_ARGUMENT_BYTES``; any other command
(or a call already re-sent after NOSCRIPT) stays where it is, so the order of
everything on the connection is kept.

A connection loads a batched script (``SCRIPT LOAD``, queued just before its first
batched call, its reply awaited by nobody) before it first sends it: otherwise,
with the script alone cached and its batched form not, a batch answered NOSCRIPT
would be re-sent behind a lone check sent after it, and the two would be decided
out of order. (After a SCRIPT FLUSH every call is answered NOSCRIPT and re-sent
in the order sent, as before.)

The batched call takes the checks' place in the pipeline: one slot in
``_pending`` (a ``BatchedReply``, which hands each check its own entry of the
reply, a decision or a refusal, in the same read) and one record in
``_scripts`` (so a NOSCRIPT loads the batched script once and re-sends the
batch, as for any script call). A batch that fails as a whole (a timeout, a
lost connection, an error reply for the call) fails each of its checks with
that error: each decision is then unknown, as when one call's reply is lost,
and nothing is retried.

A single server's connections join in C (``joining``: ``moderato._accel.Grouping``
and its ``BatchedReply``, csrc/grouping.c, the same steps); ``group_checks`` and
this module's ``BatchedReply`` are the reference it is tested against
(tests/redis/test_grouping_in_c.py), and what a cluster node's connections run
(``group_node_checks``).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Sequence
from functools import cache, partial
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

from .._accel import MAX_CAPACITY_SCALED, MAX_WINDOW_S, Grouping, key_slot
from ._encoding import Arg, encode_command, encode_evalsha
from .cluster_map import key_text
from .errors import RedisBatchRefusedError, RedisConnectionError, RedisReplyError

if TYPE_CHECKING:
    from ..scripts import Script

__all__ = [
    "AloneScript",
    "BatchedReply",
    "NodeBatching",
    "batch_layout",
    "cluster_batch_layout",
    "cluster_batched_script",
    "group_checks",
    "group_node_checks",
    "joining",
    "not_run",
    "split_reply",
]

# A record of _scripts: (sequence, script, keys, args, resends).
Record = tuple[int, Any, Sequence[Arg], Sequence[Arg], int]


_PART_UNITS = 4
"""moderato.scripts.BATCH_PART_UNITS (csrc/grouping.c's PART_UNITS): a check's weight in a
batched call unless sent as the check before it again."""


def _decimal(value: Any, digits: int) -> Optional[int]:
    """An argument's number when it is sent as 1 to ``digits`` - 1 ASCII digits (a str,
    bytes, or an int, sent as its decimal), else None."""
    if type(value) is int:
        return value if 0 <= value < 10 ** (digits - 1) else None
    if type(value) in (str, bytes) and 0 < len(value) < digits and value.isascii():
        return int(value) if value.isdigit() else None
    return None


def _straight_line(record: Record) -> bool:
    """Whether a check's arguments take its script's one-policy straight-line path (the
    test of lua/one_policy.lua: one key; ARGV[2] "1"; cost, capacity and window short
    decimals, the window at most a day; the token bucket's empty refill field; and a cost
    within the capacity), so a repeat of it is decided on a batched run's Lua locals and
    weighs its algorithm's ``batch_repeat_units``. (Any other check is decided on its own
    in full, repeat or not.)"""
    args = record[3]
    if len(record[2]) != 1 or not (
        len(args) == 4 or (len(args) == 5 and type(args[4]) in (str, bytes) and not args[4])
    ):
        return False
    if _decimal(args[1], 2) != 1:  # "1", b"1" or 1
        return False
    cost, capacity, window = _decimal(args[0], 16), _decimal(args[2], 14), _decimal(args[3], 6)
    return (
        cost is not None
        and capacity is not None
        and window is not None
        and 1 <= cost <= capacity <= MAX_CAPACITY_SCALED
        and 1 <= window <= MAX_WINDOW_S
    )


@cache
def _batching() -> tuple[dict[str, Script], dict[str, tuple[int, int]], int, int]:
    """The decision scripts' SHA1s, each to its batched form and to the units its checks
    may weigh in one batched call and a repeat's units (a check sent otherwise weighs
    ``BATCH_PART_UNITS``); the most policies (keys) and bytes one batched call takes, the
    policies in units too (each check's count times its weight). (Imported here:
    moderato.scripts imports the algorithms, which import moderato.errors, which imports
    this package.)"""
    from ..algorithms import ALGORITHMS
    from ..scripts import (
        BATCH_PART_UNITS,
        MAX_BATCH_ARGUMENT_BYTES,
        MAX_BATCH_PARTS,
        MAX_BATCH_POLICIES,
        batched_script,
        load_script,
    )

    assert BATCH_PART_UNITS == _PART_UNITS
    forms = {load_script(name).sha: batched_script(name) for name in ALGORITHMS}
    parts = {
        load_script(name).sha: (
            min(entry.batch_parts, MAX_BATCH_PARTS) * BATCH_PART_UNITS,
            entry.batch_repeat_units,
        )
        for name, entry in ALGORITHMS.items()
    }
    return forms, parts, MAX_BATCH_POLICIES * BATCH_PART_UNITS, MAX_BATCH_ARGUMENT_BYTES


class BatchedReply:
    """The slot of one batched call in a connection's ``_pending``: it takes the call's
    reply (``set_result``) or its failure (``set_exception``) and gives each check's
    future its part at once, in the read that brought it."""

    __slots__ = ("_done", "_parts")

    def __init__(self, parts: list[Any]) -> None:
        self._parts = parts
        self._done = False

    def done(self) -> bool:
        """Answered, or every check gone (cancelled or timed out): the reply then only
        frees the slot."""
        return self._done or all(part.done() for part in self._parts)

    def set_result(self, reply: Any) -> None:
        self._done = True
        parts = self._parts
        items = split_reply(reply, len(parts))
        if items is None:
            self.set_exception(
                RedisConnectionError(
                    f"a batched call of {len(parts)} checks was answered {reply!r:.200}"
                )
            )
            return
        for part, item in zip(parts, items):
            if not part.done():
                if isinstance(item, RedisReplyError):
                    part.set_exception(item)
                else:
                    part.set_result(item)

    def set_exception(self, error: BaseException) -> None:
        self._done = True
        for part in self._parts:
            if not part.done():
                # A copy per check: one instance raised in many tasks would gather
                # every task's traceback.
                part.set_exception(copy.copy(error))


def split_reply(reply: Any, count: int) -> Optional[list[Any]]:
    """Each of a batched call's ``count`` parts' replies out of its one flat reply
    (lua/batch.lua: per part its length then its entries, or its refusal, one error
    entry, or what changed since the part before's decision: ``-1 - mask``, then the
    entries whose bit ``i`` is set in ``mask``, i from 0), each as the part alone is
    answered (a list, or the RedisReplyError); None when the reply does not add up to
    ``count`` parts."""
    if type(reply) is not list:
        return None
    items: list[Any] = []
    before: Optional[list[Any]] = None  # the part before's decision (None: a refusal, none)
    at, size = 0, len(reply)
    while at < size and len(items) < count:
        head = reply[at]
        if type(head) is int:
            if head >= 0:
                end = at + 1 + head
                if end > size:
                    return None
                before = reply[at + 1 : end]
                at = end
            else:
                before = _changed(reply, at, before)
                if before is None:
                    return None
                at += 1 + bin(-1 - head).count("1")
            items.append(before)
        elif isinstance(head, RedisReplyError):
            items.append(head)
            before = None
            at += 1
        else:
            return None
    return items if at == size and len(items) == count else None


def _changed(reply: list[Any], at: int, before: Optional[list[Any]]) -> Optional[list[Any]]:
    """The decision ``reply[at]`` (``-1 - mask``) sends as ``before`` with the entries
    of mask's bits replaced by those after it; None when that does not add up."""
    mask = -1 - reply[at]
    if before is None or mask >> min(len(before), 62):  # grouping.c's bound too
        return None
    changed = before.copy()
    at += 1
    index = 0
    while mask:
        if mask & 1:
            if at >= len(reply):
                return None
            changed[index] = reply[at]
            at += 1
        mask >>= 1
        index += 1
    return changed


def _retrieve(future: Any) -> None:
    """Read the outcome of a load nobody awaits, so asyncio does not log it."""
    if not future.cancelled():
        future.exception()


# -- joining a turn's calls ------------------------------------------------------------
#
# _join() is written once: it finds the runs among a turn's new commands (adjacent calls
# with one run key, cut at the algorithm's batch_parts checks, MAX_BATCH_POLICIES policies
# and MAX_BATCH_ARGUMENT_BYTES) and puts
# one batched call in each run's place. What makes a run and what its call looks like is
# the single server's (_SingleServer) or a cluster node's (_ClusterNode).


class _Calls:
    """What the single server joins: adjacent calls of one decision script, sent as is."""

    def run_keys(self, records: list[Optional[Record]]) -> tuple[list[Any], list[Any]]:
        """Per command, the key a run of calls shares (None: it stays alone), and what
        ``call`` needs to know of it."""
        forms = _batching()[0]
        keys = [
            record[1].sha if record is not None and record[4] == 0 and record[1].sha in forms
            else None
            for record in records
        ]  # fmt: skip
        return keys, keys

    def call(
        self, parts: list[Record], futures: list[Any], details: list[Any]
    ) -> tuple[Script, list[Arg], list[Arg], BatchedReply]:
        """The batched call of ``parts`` (``details``: what run_keys said of them): its
        script, keys and arguments, and its reply's slot."""
        form = _batching()[0][parts[0][1].sha]
        keys: list[Arg] = []
        args: list[Arg] = [len(parts)]
        _append_parts(args, keys, parts)
        return form, keys, args, BatchedReply(futures)


# lua/batch.lua's markers: a part as the part before it (REPEAT), or with its own keys
# (OWN_KEYS), its own cost (OWN_COST) or both, the rest the part before's.
REPEAT, OWN_KEYS, OWN_COST, OWN_KEYS_AND_COST = "=", "K", "C", "KC"


def _append_parts(
    args: list[Arg], keys: list[Arg], parts: Sequence[Record], before: Optional[Record] = None
) -> None:
    """Each part of ``parts`` in lua/batch.lua's layout, its arguments onto ``args`` and the
    keys it sends onto ``keys``: as a marker against the part before it (``before`` for
    the first) when they share what the marker says, else in full (its key count, its
    argument count, its arguments). Equal values encode to the same bytes (the encoders
    take bytes-like, str and int, and a str never equals an int or bytes), so a part sent
    as a marker is the part as sent in full."""
    for part in parts:
        part_keys, part_args = part[2], part[3]
        if before is not None:
            before_keys, before_args = before[2], before[3]
            before = part
            if part_args == before_args:
                if part_keys == before_keys:
                    args.append(REPEAT)
                    continue
                if len(part_keys) == len(before_keys):
                    args.append(OWN_KEYS)
                    keys.extend(part_keys)
                    continue
            elif (
                part_args
                and len(part_args) == len(before_args)
                and len(part_keys) == len(before_keys)
                and part_args[1:] == before_args[1:]
            ):
                if part_keys == before_keys:
                    args += (OWN_COST, part_args[0])
                else:
                    args += (OWN_KEYS_AND_COST, part_args[0])
                    keys.extend(part_keys)
                continue
        before = part
        args += (len(part_keys), len(part_args))
        args.extend(part_args)
        keys.extend(part_keys)


def batch_layout(
    checks: Sequence[tuple[Sequence[Arg], Sequence[Arg]]],
) -> tuple[list[Arg], list[Arg]]:
    """The keys and arguments of one call of a batched script deciding ``checks`` (each
    its keys and arguments as the script alone takes them), in lua/batch.lua's layout:
    what the client sends (for tests and benchmarks)."""
    keys: list[Arg] = []
    args: list[Arg] = [len(checks)]
    _append_parts(
        args, keys, [(0, None, part_keys, part_args, 0) for part_keys, part_args in checks]
    )
    return keys, args


def group_checks(connection: Any) -> None:
    """Join the adjacent calls of one decision script among ``connection``'s new
    commands into batched calls (its flush calls this with two or more new ones)."""
    _join(connection, _SINGLE_SERVER)


_SINGLE_SERVER = _Calls()


@cache
def _grouping_in_c() -> Grouping:
    """group_checks' steps in C (csrc/grouping.c), over the same tables."""
    forms, parts, max_policies, max_bytes = _batching()
    return Grouping(
        forms, parts, max_policies, max_bytes, _retrieve, copy.copy,
        RedisConnectionError, RedisReplyError,
    )  # fmt: skip


def joining(connection: Any) -> Callable[[], None]:
    """What a single server's ``connection`` calls first in a flush of two or more new
    commands when batching: group_checks(connection), in C."""
    return partial(_grouping_in_c(), connection)


def _payload_size(payload: Optional[bytes], record: Record) -> int:
    """The bytes a new command takes: its payload's, or for a check queued unencoded
    (None: the connection's flush encodes it if it is not joined), its EVALSHA's."""
    if payload is None:
        return len(encode_evalsha(record[1].sha, record[2], record[3]))
    return len(payload)


def _join(connection: Any, calls: _Calls) -> None:
    buffer: list[Optional[bytes]] = connection._write_buffer
    first = connection._held
    new = len(buffer) - first
    base = connection._batched_total
    scripts = connection._scripts
    turn: list[Record] = []
    for record in reversed(scripts):
        if record[0] <= base:
            break
        turn.append(record)
    # A SCRIPT LOAD or EVAL queued this turn (a NOSCRIPT repair) keeps its number:
    # this turn is sent as it is.
    if len(turn) < 2 or any(at > base for at in connection._loads.values()):
        return
    records: list[Optional[Record]] = [None] * new
    for record in turn:
        records[record[0] - base - 1] = record
    _, algorithm_parts, max_policies, max_bytes = _batching()
    run_keys, details = calls.run_keys(records)
    runs: list[tuple[int, int]] = []
    start = 0
    while start < new:
        key = run_keys[start]
        stop = start + 1
        record = records[start]
        if key is not None and record is not None:
            size = _payload_size(buffer[first + start], record)
            # Weighed as _append_parts sends them: a repeat ("=") its algorithm's units.
            max_units, repeat_units = algorithm_parts.get(record[1].sha, (0, 0))
            units = _PART_UNITS
            policies = len(record[2]) * _PART_UNITS
            while stop < new:
                after = records[stop]
                if run_keys[stop] != key or after is None:
                    break
                before = records[stop - 1]
                assert before is not None
                repeat = after[3] == before[3] and after[2] == before[2]
                weight = repeat_units if repeat and _straight_line(after) else _PART_UNITS
                size += _payload_size(buffer[first + stop], after)
                units += weight
                policies += len(after[2]) * weight
                if units > max_units or size > max_bytes or policies > max_policies:
                    break
                stop += 1
        runs.append((start, stop))
        start = stop
    if len(runs) == new:
        return  # nothing to join
    loaded: set[str] = connection._loaded_forms
    pending = connection._pending
    futures = [pending.pop() for _ in range(new)]
    futures.reverse()
    for _ in turn:
        scripts.pop()
    payloads = buffer[first:]
    del buffer[first:]
    for start, stop in runs:
        if stop - start == 1:
            buffer.append(payloads[start])
            pending.append(futures[start])
            record = records[start]
            if record is not None:
                scripts.append((base + len(buffer) - first, *record[1:]))
            continue
        parts = [record for record in records[start:stop] if record is not None]
        form, keys, args, reply = calls.call(parts, futures[start:stop], details[start:stop])
        if form.sha not in loaded:
            loaded.add(form.sha)
            load = connection._future_type(loop=connection._loop)
            load.add_done_callback(_retrieve)
            buffer.append(encode_command("SCRIPT", "LOAD", form.source))
            pending.append(load)
            connection._loads[form.sha] = base + len(buffer) - first
        buffer.append(encode_evalsha(form.sha, keys, args))
        pending.append(reply)
        scripts.append((base + len(buffer) - first, form, keys, args, 0))


# -- a cluster node's turn ---------------------------------------------------------------
#
# A node's checks may lie in several slots. Redis refuses a call whose declared keys span
# slots (CROSSSLOT, even with the allow-cross-slot-keys flag: the flag only lets the script
# touch keys of other slots the node serves), so a batch over several slots is a call of the
# script's cluster form (lua/cluster_batch.lua, then the batched script): the checks reordered
# by slot (the first check's slot first, each slot's checks in their order: checks on one key
# share its slot, and checks on different slots share no state), the first slot's keys
# declared, the others after ARGV, each other slot put through Redis's own cluster check
# before any check runs. A batch within one slot is a call of the batched script itself,
# every key declared, as on a single server.
#
# Which error replies mean "not run". Redis refuses a command before running it, with an
# error naming the cluster's reason, for the keys it declares: MOVED, ASK (the slot is
# elsewhere, or migrating and a key is missing here), TRYAGAIN (migrating, some keys here and
# some not), CROSSSLOT, CLUSTERDOWN; also LOADING (a node loading its data set). None of those
# can come out of a running script: a command inside a script that Redis's cluster check
# refuses fails with "ERR Script attempted to access a non local key...", and a script's
# own error replies are the script's. The cluster form's check of the other slots answers
# MODERATO_NOT_RUN before any check runs. A batched call answered with one of these
# decided nothing; its checks are failed with RedisBatchRefusedError, and the cluster
# client sends each alone through its usual routing. Any other error reply for the call
# (OOM, BUSY, NOPERM, a script error) fails each check with it, as on a single server, and
# nothing is re-sent; so does a lost or late reply (each decision unknown).

_NOT_RUN_REPLIES = frozenset(
    {"MOVED", "ASK", "TRYAGAIN", "CROSSSLOT", "CLUSTERDOWN", "LOADING", "MODERATO_NOT_RUN"}
)
CROSS_SLOT_SHEBANG = b"#!lua flags=allow-cross-slot-keys\n"
_CLUSTER_HEAD_FILE = "cluster_batch.lua"


def not_run(error: BaseException) -> bool:
    """Whether ``error``, the reply to a batched call, says Redis ran none of it."""
    return isinstance(error, RedisReplyError) and error.message.split(" ", 1)[0] in _NOT_RUN_REPLIES


class AloneScript(NamedTuple):
    """A script call that a cluster node sends as it is, never joined into a batch (the
    cluster client's re-sends: after a redirection, or a batch refused whole)."""

    sha: str
    source: bytes


class NodeBatching:
    """A cluster's setting its node clients read per turn: whether a batch may span slots
    (its nodes run Redis 7.0 or later, as answering CLUSTER SHARDS shows)."""

    __slots__ = ("cross_slot",)

    def __init__(self) -> None:
        self.cross_slot = False


class NodeBatchedReply(BatchedReply):
    """A batched call's slot on a cluster node: a reply refusing the call before it ran
    fails each check with RedisBatchRefusedError, so each is sent again alone."""

    __slots__ = ()

    def set_exception(self, error: BaseException) -> None:
        if not_run(error):
            assert isinstance(error, RedisReplyError)
            self._done = True
            for part in self._parts:
                if not part.done():
                    part.set_exception(RedisBatchRefusedError(error))
            return
        super().set_exception(error)


@cache
def _node_forms() -> dict[str, tuple[Script, Script, Script]]:
    """Each decision script's SHA1 to its Script object (the one every check sends), its
    batched form and that form's cluster form."""
    from ..algorithms import ALGORITHMS
    from ..scripts import batched_script, load_script

    return {
        load_script(name).sha: (
            load_script(name),
            batched_script(name),
            cluster_batched_script(name),
        )
        for name in ALGORITHMS
    }


@cache
def cluster_batched_script(name: str) -> Script:
    """The batched script ``name``'s cluster form: the flag, lua/cluster_batch.lua's head,
    then the batched script as it is (so its text has one home, moderato/scripts.py)."""
    from ..scripts import Script, batched_script, scripts_dir, without_comments

    head = without_comments((scripts_dir() / _CLUSTER_HEAD_FILE).read_bytes())
    source = CROSS_SLOT_SHEBANG + head + batched_script(name).source
    return Script(
        name=f"cluster_batch({name})", source=source, sha=hashlib.sha1(source).hexdigest()
    )


class _ClusterNode(_Calls):
    """What a cluster node joins: adjacent calls of one decision script as every check
    sends it (not a re-send), across slots when the cluster's ``batching.cross_slot``
    allows, else within one slot. A call's slot is its first key's, as the cluster client
    routes it; a call whose other keys lie elsewhere is refused before running (CROSSSLOT,
    declared, or by the cluster form's check), then sent alone, where Redis refuses it."""

    def __init__(self, batching: NodeBatching) -> None:
        self.batching = batching

    def run_keys(self, records: list[Optional[Record]]) -> tuple[list[Any], list[Any]]:
        """The run keys (the script; and its slot unless batches may span slots), and
        each call's slot."""
        forms = _node_forms()
        cross_slot = self.batching.cross_slot
        keys: list[Any] = []
        slots: list[Any] = []
        for record in records:
            key = slot = None
            if record is not None and record[4] == 0 and record[2]:
                script = record[1]
                known = forms.get(script.sha)
                if known is not None and known[0] is script:
                    first = record[2][0]
                    slot = key_slot(first if type(first) is bytes else key_text(first))
                    key = script.sha if cross_slot else (script.sha, slot)
            keys.append(key)
            slots.append(slot)
        return keys, slots

    def call(
        self, parts: list[Record], futures: list[Any], details: list[Any]
    ) -> tuple[Script, list[Arg], list[Arg], BatchedReply]:
        _, batched, cross_slot = _node_forms()[parts[0][1].sha]
        keys, args, order = _cluster_layout(parts, details)
        if order is None:
            return batched, keys, args, NodeBatchedReply(futures)
        return cross_slot, keys, args, NodeBatchedReply([futures[index] for index in order])


def _cluster_layout(
    parts: Sequence[Record], slots: Sequence[Any]
) -> tuple[list[Arg], list[Arg], Optional[list[int]]]:
    """The keys and arguments of the batched call of ``parts`` (each in slot ``slots[i]``)
    on a cluster node, and the order its parts are decided in: None when they share one
    slot (the batched script, every key declared); else the cluster form's (the parts by
    slot group, the first group's keys declared, the others' after ARGV, each group's
    key count, the group count; lua/cluster_batch.lua)."""
    groups: dict[Any, list[int]] = {}
    for index, slot in enumerate(slots):
        group = groups.get(slot)
        if group is None:
            groups[slot] = [index]
        else:
            group.append(index)
    keys: list[Arg] = []
    args: list[Arg] = [len(parts)]
    if len(groups) == 1:
        _append_parts(args, keys, parts)
        return keys, args, None
    members = list(groups.values())
    # A part in another group than the part before it has other keys (another slot), so
    # each group's first part sends its keys, and a marker never reaches across groups.
    before: Optional[Record] = None
    group_keys: list[list[Arg]] = []
    for group in members:
        ordered = [parts[index] for index in group]
        sent: list[Arg] = keys if before is None else []
        _append_parts(args, sent, ordered, before)
        if before is not None:
            group_keys.append(sent)
        before = ordered[-1]
    for sent in group_keys:
        args.extend(sent)
    args.extend(len(sent) for sent in group_keys)
    args.append(len(members) - 1)
    return keys, args, [index for group in members for index in group]


def cluster_batch_layout(
    checks: Sequence[tuple[Sequence[Arg], Sequence[Arg]]], slots: Sequence[int]
) -> tuple[list[Arg], list[Arg], Optional[list[int]]]:
    """What a cluster node sends for ``checks`` (each its keys and arguments, in slot
    ``slots[i]``): the call's keys and arguments, and the order its parts are decided in
    (None: as given, one slot, the batched script; else the cluster form's). For tests
    and benchmarks."""
    return _cluster_layout(
        [(0, None, part_keys, part_args, 0) for part_keys, part_args in checks], slots
    )


def group_node_checks(connection: Any, batching: NodeBatching) -> None:
    """group_checks() for a cluster node's connection: the turn's checks of one decision
    script joined across the slots this node serves (see above)."""
    _join(connection, _ClusterNode(batching))
