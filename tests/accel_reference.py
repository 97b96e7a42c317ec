"""A pure-Python twin of ``moderato._accel``: the oracle the C code is tested against.

Every function takes the same arguments, returns the same values and raises
the same exception types (``TypeError`` for a wrong type, ``ValueError`` for a
wrong value, checked in the same order) as its C counterpart, per the
contract in docs/internals.md. It is written for obviousness, not speed, and
shares no code with the C implementation: SHA-256 and HMAC come from the
standard library, CRC16/XMODEM from ``binascii.crc_hqx``.

Messages are not mirrored; the tests check the C messages on their own.
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
import math
import re
from collections.abc import Sequence
from typing import Any, Union

from moderato.results import CheckResult, PolicyState

MAX_POLICIES = 16
MAX_WINDOW_S = 86_400
MAX_LONG_WINDOW_S = 3600 * 86_400
MAX_LIMIT = 9_007_199_254
MAX_SAFE_INTEGER = 2**53

Text = Union[str, bytes]
Decision = tuple[bool, int, tuple[tuple[int, int, int], ...]]

_DAY_S = 86_400
# limits' units (a month is 30 days, a year 360) and throttled-py's abbreviations.
_UNIT_S = {
    **dict.fromkeys(["second", "seconds", "s", "sec", "secs"], 1),
    **dict.fromkeys(["minute", "minutes", "m", "min", "mins"], 60),
    **dict.fromkeys(["hour", "hours", "h", "hr", "hrs"], 3600),
    **dict.fromkeys(["day", "days", "d"], _DAY_S),
    **dict.fromkeys(["week", "weeks", "w", "wk", "wks"], 7 * _DAY_S),
    **dict.fromkeys(["month", "months"], 30 * _DAY_S),
    **dict.fromkeys(["year", "years"], 360 * _DAY_S),
}
_SEPARATORS = re.compile("[;,|]")

# One policy: ws* count (ws* "/" | ws+ "per" ws+) ws* [multiple ws*] unit ws*.
# [0-9] and [A-Za-z] are ASCII-only; the blanks around the separator are
# folded into it so that no two parts compete for the same blanks.
_POLICY = re.compile(
    r"[ \t]*(?P<count>[0-9]+)(?:[ \t]*/[ \t]*|[ \t]+[Pp][Ee][Rr][ \t]+)"
    r"(?:(?P<multiple>[0-9]+)[ \t]*)?(?P<unit>[A-Za-z]+)[ \t]*"
)

_PREFIX_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-")
_ALGORITHM_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789_")
_KEPT_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._/@+=,-")
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _utf8(value: str) -> bytes:
    try:
        return str.encode(value, "utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"cannot be encoded as UTF-8: {error}") from error


def parse_rate(text: str, /) -> tuple[tuple[int, int], ...]:
    if not isinstance(text, str):
        raise TypeError(f"text must be str, not {type(text).__name__}")
    policies: list[tuple[int, int]] = []
    for item in _SEPARATORS.split(text):
        if len(policies) == MAX_POLICIES:
            raise ValueError("more than 16 policies")
        match = _POLICY.fullmatch(item)
        if match is None:
            raise ValueError(f"invalid rate {text!r}")
        limit = int(match["count"])
        multiple = int(match["multiple"] or "1")
        unit_s = _UNIT_S.get(match["unit"].lower())
        if not 1 <= limit <= MAX_LIMIT:
            raise ValueError(f"count {limit} out of range")
        if not 1 <= multiple <= MAX_LONG_WINDOW_S:
            raise ValueError(f"multiple {multiple} out of range")
        if unit_s is None:
            raise ValueError(f"unknown unit {match['unit']!r}")
        window_s = multiple * unit_s
        if window_s > MAX_LONG_WINDOW_S:
            raise ValueError(f"window {window_s} s longer than ten years")
        if any(window_s == earlier for _, earlier in policies):
            raise ValueError(f"two policies with a window of {window_s} s")
        policies.append((limit, window_s))
    return tuple(policies)


def _text_bytes(value: object, name: str) -> bytes:
    if isinstance(value, bytes):
        return bytes(value)
    if isinstance(value, str):
        return _utf8(value)
    raise TypeError(f"{name} must be str or bytes, not {type(value).__name__}")


def _token(value: object, name: str, max_size: int, allowed: frozenset[int]) -> bytes:
    data = _text_bytes(value, name)
    if not 1 <= len(data) <= max_size or not set(data) <= allowed:
        raise ValueError(f"invalid {name} {value!r}")
    return data


def _component(data: bytes) -> bytes:
    if len(data) <= 64:  # encoding never shrinks: longer data is always hashed
        kept = b"".join(bytes([byte]) if byte in _KEPT_BYTES else b"%%%02X" % byte for byte in data)
        if len(kept) <= 64:
            return kept
    return b"~" + hashlib.sha256(data).hexdigest()[:32].encode()


def _tag_parts(tenant: object, scope: object, identity: object) -> tuple[bytes, bytes, bytes]:
    return (
        _text_bytes(tenant, "tenant"),
        _text_bytes(scope, "scope"),
        _text_bytes(identity, "identity"),
    )


def _check_secret(secret: object) -> None:
    if not isinstance(secret, bytes):
        raise TypeError("secret must be bytes or None")
    if len(secret) < 16:
        raise ValueError("secret must be at least 16 bytes long")


def _tag(parts: tuple[bytes, bytes, bytes], secret: bytes | None) -> bytes:
    tenant, scope, identity = parts
    if secret is None:
        identity_part = _component(identity)
    else:
        digest = hmac.new(secret, identity, hashlib.sha256).hexdigest()
        identity_part = b"!" + digest[:32].encode()
    return b"{%s:%s:%s}" % (_component(tenant), _component(scope), identity_part)


def build_keys(
    prefix: Text,
    algorithm: Text,
    tenant: Text,
    scope: Text,
    identity: Text,
    windows_s: Sequence[int],
    /,
    secret: bytes | None = None,
    *,
    burst: int | None = None,
) -> list[bytes]:
    prefix_bytes = _token(prefix, "prefix", 128, _PREFIX_BYTES)
    algorithm_bytes = _token(algorithm, "algorithm", 16, _ALGORITHM_BYTES)
    parts = _tag_parts(tenant, scope, identity)
    if not isinstance(windows_s, (tuple, list)):
        raise TypeError("windows_s must be a tuple or list")
    if not 1 <= len(windows_s) <= MAX_POLICIES:
        raise ValueError("windows_s must hold 1 to 16 windows")
    for window_s in windows_s:
        if not _is_int(window_s):
            raise TypeError("windows_s items must be int")
        if not 1 <= window_s <= MAX_LONG_WINDOW_S:
            raise ValueError("windows_s items must be 1..311040000")
    if secret is not None:
        _check_secret(secret)
    ending = b""
    if burst is not None:
        if not _is_int(burst):
            raise TypeError("burst must be int or None")
        if not 1 <= burst <= MAX_LIMIT:
            raise ValueError("burst must be 1..9007199254")
        ending = b"b%d" % burst
    base = b"%s:%s:%s:" % (prefix_bytes, algorithm_bytes, _tag(parts, secret))
    return [base + b"%d" % window_s + ending for window_s in windows_s]


def key_pattern(
    prefix: Text, tenant: Text, scope: Text, identity: Text, /, secret: bytes | None = None
) -> bytes:
    prefix_bytes = _token(prefix, "prefix", 128, _PREFIX_BYTES)
    parts = _tag_parts(tenant, scope, identity)
    if secret is not None:
        _check_secret(secret)
    return b"%s:??:%s:*" % (prefix_bytes, _tag(parts, secret))


def key_slot(key: Text, /) -> int:
    data = _text_bytes(key, "key")
    start = data.find(b"{")
    if start != -1:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1 : end]
    return binascii.crc_hqx(data, 0) % 16384


def _argument_bytes(value: object) -> bytes:
    if isinstance(value, bytes):
        return bytes(value)
    if isinstance(value, str):
        return _utf8(value)
    if _is_int(value):
        return int.__repr__(value).encode()  # raises ValueError past int_max_str_digits
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, memoryview):
        if not value.c_contiguous:  # raises ValueError once released
            raise ValueError("memoryview is not C-contiguous")
        return value.tobytes()
    raise TypeError(f"cannot encode {type(value).__name__}")


def _resp(parts: list[bytes]) -> bytes:
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


def encode_command(*args: object) -> bytes:
    if not args:
        raise TypeError("encode_command() takes at least 1 argument (0 given)")
    return _resp([_argument_bytes(arg) for arg in args])


def encode_evalsha(sha: Text, keys: Sequence[object], args: Sequence[object], /) -> bytes:
    if isinstance(sha, str):
        valid = len(sha) == 40 and set(sha) <= _HEX_DIGITS
    elif isinstance(sha, bytes):
        valid = len(sha) == 40 and set(sha.decode("latin-1")) <= _HEX_DIGITS
    else:
        raise TypeError("sha must be str or bytes")
    if not valid:
        raise ValueError(f"invalid sha {sha!r}")
    if not isinstance(keys, (tuple, list)):
        raise TypeError("keys must be a tuple or list")
    if not isinstance(args, (tuple, list)):
        raise TypeError("args must be a tuple or list")
    parts = [b"EVALSHA", _argument_bytes(sha), b"%d" % len(keys)]
    parts.extend(_argument_bytes(item) for item in (*keys, *args))
    return _resp(parts)


def _deciding(allowed: int, states: list[tuple[int, int, int]]) -> int:
    if allowed:  # the fewest remaining
        urgency = [-float(remaining) for remaining, _, _ in states]
    else:  # the longest retry, -1 (permanent) counting as infinite
        urgency = [math.inf if retry == -1 else float(retry) for _, retry, _ in states]
    return urgency.index(max(urgency))  # the lowest index on ties


def decode_decision(reply: list[int], policies: int, /) -> Decision:
    if not _is_int(policies):
        raise TypeError("policies must be int")
    if not 1 <= policies <= MAX_POLICIES:
        raise ValueError("policies must be 1..16")
    if not isinstance(reply, list):
        raise ValueError("reply must be a list")
    if len(reply) != 2 + 3 * policies:
        raise ValueError("reply has the wrong length")
    if not all(_is_int(value) for value in reply):
        raise ValueError("reply must hold ints only")
    allowed, deciding = reply[0], reply[1]
    if allowed not in (0, 1):
        raise ValueError("allowed must be 0 or 1")
    if not 0 <= deciding < policies:
        raise ValueError("deciding out of range")
    states = [(reply[i], reply[i + 1], reply[i + 2]) for i in range(2, len(reply), 3)]
    for remaining_scaled, retry_ms, reset_ms in states:
        if not 0 <= remaining_scaled <= MAX_SAFE_INTEGER:
            raise ValueError("remaining_scaled out of range")
        if not -1 <= retry_ms <= MAX_SAFE_INTEGER or (allowed and retry_ms != 0):
            raise ValueError("retry_ms out of range")
        if not -1 <= reset_ms <= MAX_SAFE_INTEGER or (reset_ms == -1 and retry_ms != -1):
            raise ValueError("reset_ms out of range")
    if deciding != _deciding(allowed, states):
        raise ValueError("deciding is not the deciding policy")
    return bool(allowed), deciding, tuple(states)


def check_result(reply: list[int], plan: tuple[Any, ...], /) -> Any:
    """decode_decision, then the public result, built by its constructors."""
    if not (isinstance(plan, tuple) and len(plan) == 5):
        raise TypeError("plan must be a 5-tuple")
    check_cls, state_cls, rate, algorithm, rates = plan
    if check_cls is not CheckResult or state_cls is not PolicyState:
        raise TypeError("plan items 0 and 1 must be CheckResult and PolicyState")
    if not (isinstance(rate, str) and isinstance(algorithm, str)):
        raise TypeError("plan items 2 and 3 must be str")
    if not (isinstance(rates, tuple) and 1 <= len(rates) <= MAX_POLICIES):
        raise TypeError("plan item 4 must be a tuple of 1 to 16 rates")
    for each in rates:
        if not (
            isinstance(each, tuple) and len(each) in (2, 3) and all(type(n) is int for n in each)
        ):
            raise TypeError(
                "every rate must be a (limit, window_s) pair or a (limit, window_s, refill) "
                "triple of ints"
            )
    allowed, deciding, replies = decode_decision(reply, len(rates))
    states = tuple(
        state_cls(
            each[0],
            each[1],
            remaining_scaled // 1000,
            None if retry_ms < 0 else -(-retry_ms // 1000),
            None if reset_ms < 0 else reset_ms / 1000,
            each[2] if len(each) == 3 else None,
        )
        for each, (remaining_scaled, retry_ms, reset_ms) in zip(rates, replies)
    )
    top = states[deciding]
    return check_cls(
        allowed,
        top.limit,
        top.remaining,
        top.retry_after,
        top.reset_at,
        top.window_seconds,
        rate,
        algorithm,
        states,
        refill=top.refill,
    )


# -- MemoryStore's identity index (table_stats()'s "identities" and "unindexed") --------


def store_key_identity(key: bytes) -> Union[tuple[bytes, bytes], None]:
    """The (tenant, identity) a MemoryStore indexes ``key`` under, or None.

    Keys of the limiter's shape, ``...{<tenant>:<scope>:<identity>}...``, with
    no other brace anywhere and no other colon between the braces, are
    indexed; any other key is on the unindexed list.
    """
    if key.count(b"{") != 1 or key.count(b"}") != 1:
        return None
    open_at, close_at = key.index(b"{"), key.index(b"}")
    if close_at < open_at:
        return None
    parts = key[open_at + 1 : close_at].split(b":")
    if len(parts) != 3:
        return None
    return parts[0], parts[2]


def store_pattern_identity(pattern: bytes) -> Union[tuple[bytes, bytes], None]:
    """The (tenant, identity) every indexed key matching ``pattern`` has, or None.

    A pattern pins them when it has no ``[`` nor ``\\``, one ``{`` and one
    ``}`` after it, and between them ``<tenant>:...:<identity>`` with neither
    part holding ``*`` or ``?``: delete_matching() then looks at that
    identity's entries and the unindexed ones only.
    """
    if b"[" in pattern or b"\\" in pattern:
        return None
    if pattern.count(b"{") != 1 or pattern.count(b"}") != 1:
        return None
    open_at, close_at = pattern.index(b"{"), pattern.index(b"}")
    if close_at < open_at:
        return None
    inside = pattern[open_at + 1 : close_at]
    if inside.count(b":") < 2:
        return None
    tenant, identity = inside.split(b":")[0], inside.rsplit(b":", 1)[1]
    if any(c in part for part in (tenant, identity) for c in (b"*", b"?")):
        return None
    return tenant, identity
