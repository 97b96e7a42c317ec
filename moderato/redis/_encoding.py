"""The C encoders the client sends with (it never builds RESP itself), and their argument type."""

from __future__ import annotations

from typing import Union

from .._accel import encode_command, encode_evalsha

__all__ = ["Arg", "encode_command", "encode_evalsha"]

# What the encoders accept for one argument (bool, float and None are refused).
Arg = Union[bytes, bytearray, memoryview, str, int]
