# Type stub of the C accelerator (csrc/); docs/internals.md is the contract.
from collections.abc import Sequence
from typing import Optional, Union

_Text = Union[str, bytes]
_Arg = Union[bytes, bytearray, memoryview, str, int]

MAX_POLICIES: int
MAX_WINDOW_S: int
MAX_LIMIT: int
MAX_SCALED: int

def parse_rate(text: str, /) -> tuple[tuple[int, int], ...]: ...
def build_keys(
    prefix: _Text,
    algorithm: _Text,
    tenant: _Text,
    scope: _Text,
    identity: _Text,
    windows_s: Sequence[int],
    /,
    secret: Optional[bytes] = None,
) -> list[bytes]: ...
def key_pattern(
    prefix: _Text,
    tenant: _Text,
    scope: _Text,
    identity: _Text,
    /,
    secret: Optional[bytes] = None,
) -> bytes: ...
def key_slot(key: _Text, /) -> int: ...
def encode_command(*args: _Arg) -> bytes: ...
def encode_evalsha(sha: _Text, keys: Sequence[_Arg], args: Sequence[_Arg], /) -> bytes: ...
def decode_decision(
    reply: object, policies: int, /
) -> tuple[bool, int, tuple[tuple[int, int, int], ...]]: ...
