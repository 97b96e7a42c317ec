"""A loop turn's checks joined into batched script calls (issue 30).

When a connection's flush finds two or more new commands (``ConnectionCore._flush``
calls ``_group`` first, see csrc/connection_core.c), ``group_checks`` looks at
the turn's script calls and joins each run of adjacent calls of the same decision
script (``moderato.scripts.load_script(algorithm)``, as every check sends it) into
one call of its batched form (``moderato.scripts.batched_script``): one EVALSHA,
one ``TIME``, one reply, the checks decided in the order they were sent, each
exactly as alone. Nothing waits for a batch to fill: a turn's commands leave
in the same write as they would have, only fewer of them. A run is cut at
``MAX_BATCH_PARTS`` checks and ``MAX_BATCH_ARGUMENT_BYTES``; any other command
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
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from functools import cache
from typing import TYPE_CHECKING, Any, Optional

from ._encoding import Arg, encode_command, encode_evalsha
from .errors import RedisConnectionError, RedisReplyError

if TYPE_CHECKING:
    from ..scripts import Script

__all__ = ["BatchedReply", "group_checks"]

# A record of _scripts: (sequence, script, keys, args, resends).
Record = tuple[int, Any, Sequence[Arg], Sequence[Arg], int]


@cache
def _batching() -> tuple[dict[str, Script], int, int]:
    """The decision scripts' SHA1s, each to its batched form; the most checks and
    bytes one batched call takes. (Imported here: moderato.scripts imports the
    algorithms, which import moderato.errors, which imports this package.)"""
    from ..algorithms import ALGORITHMS
    from ..scripts import MAX_BATCH_ARGUMENT_BYTES, MAX_BATCH_PARTS, batched_script, load_script

    forms = {load_script(name).sha: batched_script(name) for name in ALGORITHMS}
    return forms, MAX_BATCH_PARTS, MAX_BATCH_ARGUMENT_BYTES


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
        if not isinstance(reply, list) or len(reply) != len(parts):
            self.set_exception(
                RedisConnectionError(
                    f"a batched call of {len(parts)} checks was answered {reply!r:.200}"
                )
            )
            return
        for part, item in zip(parts, reply):
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


def _retrieve(future: Any) -> None:
    """Read the outcome of a load nobody awaits, so asyncio does not log it."""
    if not future.cancelled():
        future.exception()


def group_checks(connection: Any) -> None:
    """Join the adjacent calls of one decision script among ``connection``'s new
    commands into batched calls (its flush calls this with two or more new ones)."""
    buffer: list[bytes] = connection._write_buffer
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
    forms, max_parts, max_bytes = _batching()
    runs: list[tuple[int, int, Optional[Script]]] = []
    start = 0
    while start < new:
        record = records[start]
        form = forms.get(record[1].sha) if record is not None and record[4] == 0 else None
        stop = start + 1
        if form is not None and record is not None:
            size = len(buffer[first + start])
            while stop < new and stop - start < max_parts:
                after = records[stop]
                if after is None or after[4] != 0 or after[1].sha != record[1].sha:
                    break
                size += len(buffer[first + stop])
                if size > max_bytes:
                    break
                stop += 1
        runs.append((start, stop, form if stop - start > 1 else None))
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
    for start, stop, form in runs:
        if form is None:
            buffer.append(payloads[start])
            pending.append(futures[start])
            record = records[start]
            if record is not None:
                scripts.append((base + len(buffer) - first, *record[1:]))
            continue
        if form.sha not in loaded:
            loaded.add(form.sha)
            load = connection._future_type(loop=connection._loop)
            load.add_done_callback(_retrieve)
            buffer.append(encode_command("SCRIPT", "LOAD", form.source))
            pending.append(load)
            connection._loads[form.sha] = base + len(buffer) - first
        keys: list[Arg] = []
        args: list[Arg] = [stop - start]
        for index in range(start, stop):
            part = records[index]
            assert part is not None
            keys.extend(part[2])
            args += (len(part[2]), len(part[3]))
            args.extend(part[3])
        buffer.append(encode_evalsha(form.sha, keys, args))
        pending.append(BatchedReply(futures[start:stop]))
        scripts.append((base + len(buffer) - first, form, keys, args, 0))
