"""One composite script call (lua/together.lua) for several decisions taken as one.

Both Redis backends, the asyncio one (redis.py) and the blocking one
(blocking_redis.py), send the same call: this builds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from ..algorithms import ScriptArg
from ..scripts import Script, composite_script
from .base import Part


class CompositeCall(NamedTuple):
    """The composite script with its keys and arguments, and each part's key count
    (to split its reply with ``split_replies``)."""

    script: Script
    keys: list[bytes]
    arguments: list[ScriptArg]
    key_counts: list[int]


def composite_call(parts: Sequence[Part]) -> CompositeCall:
    """The call deciding ``parts`` as one, in lua/together.lua's argument layout."""
    names = tuple(dict.fromkeys(algorithm.name for algorithm, _, _ in parts))
    keys: list[bytes] = []
    layout: list[ScriptArg] = [len(parts)]
    arguments: list[ScriptArg] = []
    for algorithm, part_keys, part_arguments in parts:
        layout.extend((names.index(algorithm.name) + 1, len(part_keys), len(part_arguments)))
        keys.extend(part_keys)
        arguments.extend(part_arguments)
    key_counts = [len(part_keys) for _, part_keys, _ in parts]
    return CompositeCall(composite_script(names), keys, [*layout, *arguments], key_counts)
