# Type stub of the C accelerator (csrc/); docs/internals.md is the contract.
import asyncio
import inspect
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional, TypedDict, Union, final

from typing_extensions import Unpack

_Text = Union[str, bytes]
_Arg = Union[bytes, bytearray, memoryview, str, int]

# The contract's numbers (csrc/contract.h, where each is explained).
SCALE: int
MAX_POLICIES: int
MAX_WINDOW_S: int
MAX_LONG_WINDOW_S: int
MAX_LIMIT: int
MAX_CAPACITY_SCALED: int
MAX_SAFE_INTEGER: int
MAX_STATE_TIME_MS: int
MAX_NOW_MS: int
ACCRUAL_EXACT_WINDOW_MS: int
GCRA_MAX_WINDOW_S: int
MAX_RESET_KEYS: int
BUCKET_EXPIRY_MARGIN_MS: int
DRAINED_EXPIRY_MARGIN_MS: int
LOG_TOTAL_DIGITS: int

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
    *,
    burst: Optional[int] = None,
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
def evalsha_size(keys: Sequence[_Arg], args: Sequence[_Arg], /) -> int: ...
def decode_decision(
    reply: object, policies: int, /
) -> tuple[bool, int, tuple[tuple[int, int, int], ...]]: ...

# C records (csrc/results.c) that behave as these frozen dataclasses;
# moderato.results re-exports them and documents the fields.
@dataclass(frozen=True)
class PolicyState:
    limit: int
    window_seconds: int
    remaining: Optional[int]
    retry_after: Optional[int]
    reset_at: Optional[float]
    refill: Optional[int] = None

@dataclass(frozen=True)
class CheckResult:
    allowed: bool
    limit: int
    remaining: Optional[int]
    retry_after: Optional[int]
    reset_at: Optional[float]
    window_seconds: int
    rate: str
    algorithm: str
    policies: tuple[PolicyState, ...] = ()
    bypassed: bool = False
    shadow_denied: bool = False
    refill: Optional[int] = None
    @property
    def permanent(self) -> bool: ...
    @property
    def status_code(self) -> int: ...

def check_result(
    reply: object, plan: tuple[type, type, str, str, tuple[tuple[int, ...], ...]], /
) -> CheckResult: ...

MEMORY_ALGORITHMS: tuple[str, ...]

_StoreArg = Union[int, str, bytes]
_StoredValue = Union[int, dict[str, int], list[tuple[str, int]]]
"""A counter, a hash's int fields, or a sorted set's (member, score) pairs in order."""

class MemoryStore:
    """memory://'s keys and the decision scripts' math, in process (csrc/memory.c)."""

    def __init__(
        self, max_entries: int, *, sweep_every: int = 0, sweep_entries: int = 0
    ) -> None: ...
    @property
    def max_entries(self) -> int: ...
    @property
    def evictions(self) -> int: ...
    @property
    def slot_count(self) -> int: ...
    @property
    def sweep_every(self) -> int: ...
    @property
    def sweep_entries(self) -> int: ...
    def __len__(self) -> int: ...
    def decide(
        self,
        algorithm: str,
        keys: Sequence[_Text],
        args: Sequence[_StoreArg],
        now_ms: Optional[int],
        /,
    ) -> list[int]: ...
    def reset(self, keys: Sequence[_Text], args: Sequence[_StoreArg], now_ms: int, /) -> int: ...
    def delete_matching(self, pattern: _Text, now_ms: Optional[int] = None, /) -> int: ...
    def sweep(self, now_ms: int, max_entries: int = -1, from_oldest: bool = False, /) -> int: ...
    def dump(self, now_ms: int, /) -> dict[bytes, tuple[_StoredValue, int]]: ...
    def load(self, key: _Text, value: _StoredValue, expire_at_ms: int, /) -> None: ...
    def clear(self) -> None: ...
    def table_stats(self) -> dict[str, int]: ...

class _CheckCoroutine:
    """What ReadyCheck and PendingCheck both are: a check as a coroutine, its steps
    written once (csrc/coroutine.h); stub-only, not a base class at run time."""

    def __await__(self) -> Generator[Any, None, CheckResult]: ...
    def send(self, value: None, /) -> Any: ...
    def throw(self, *args: Any) -> Any: ...
    def close(self) -> None: ...
    @property
    def _asyncio_future_blocking(self) -> None:
        """None: not a future, as asyncio.isfuture asks (without its failed hasattr)."""

class ReadyCheck(_CheckCoroutine):
    """A check decided when it was called, as a completed coroutine (csrc/fast_check.c)."""

class _LimiterFields(TypedDict):
    """The keywords every one-call check's constructor begins with (csrc/fast_common.h's
    FAST_LIMITER_ARGUMENTS; moderato/fast_check.py's limiter_fields() builds them):
    what it reads of the limiter, and the Python end of a check C took but does not
    end. Stub-only."""

    prefix: str
    secret: Optional[bytes]
    defaults: dict[str, Any]
    plans: object
    breaker: object
    failure_log: object
    global_scope: str
    finish: Callable[..., Any]

class FastCheck:
    """What a memory:// limiter's one-call checks read (moderato/fast_check.py)."""

    def __init__(
        self,
        *,
        backend: object,
        store: MemoryStore,
        wall_clock: Callable[[], int],
        shadowed: Callable[..., CheckResult],
        **head: Unpack[_LimiterFields],
    ) -> None: ...
    @property
    def compiled_count(self) -> int: ...

class RedisFastCheck:
    """What a blocking limiter's one-call checks over one Redis server read
    (moderato/fast_redis.py)."""

    def __init__(
        self,
        *,
        client: object,
        load_script: Callable[[str], Any],
        rest: Callable[..., Any],
        idle_check_after_s: float,
        **head: Unpack[_LimiterFields],
    ) -> None: ...
    @property
    def compiled_count(self) -> int: ...

class AsyncRedisFastCheck:
    """What an asyncio limiter's one-call checks over one Redis server read
    (moderato/fast_aredis.py); its finish is that module's _settle."""

    def __init__(
        self,
        *,
        client: object,
        load_script: Callable[[str], Any],
        get_running_loop: Callable[[], Any],
        cache: object,
        **head: Unpack[_LimiterFields],
    ) -> None: ...
    @property
    def compiled_count(self) -> int: ...

class PendingCheck(_CheckCoroutine):
    """A check over Redis sent when it was called, as a coroutine (csrc/fast_aredis.c)."""

class HeaderSenders:
    """Makes the headers middleware's send wrappers (csrc/fast_route.c)."""

    def __init__(
        self,
        *,
        headers_done: str,
        decisions: str,
        fallback: Callable[[list[CheckResult], Any], list[tuple[bytes, bytes]]],
    ) -> None: ...
    def __call__(self, scope: Any, send: Callable[[Any], Any], style: Any, /) -> HeaderSender: ...

class HeaderSender:
    """One request's send, the decision headers added to its response start."""

    @property
    def started(self) -> bool: ...
    def __call__(self, message: Any, /) -> Any: ...

class RouteArguments:
    """A one-limit route's check arguments from its facts (csrc/fast_route.c)."""

    def __init__(
        self,
        *,
        decided: str,
        indexes: dict[int, Any],
        learn_route: Callable[[Any], Any],
        unknown: object,
        default_identity: object,
        client_identity: type,
        parsed_peer: Callable[[str], tuple[Any, str]],
        unknown_client: str,
    ) -> None: ...
    def __call__(
        self, rule: Any, scope: Any, /
    ) -> Optional[tuple[Union[str, bytes], str, int, Optional[str], str]]: ...

class Grouping:
    """grouping.group_checks' steps in C (csrc/grouping.c): called with a single
    server's connection, it joins that connection's turn."""

    def __init__(
        self,
        forms: dict[str, Any],
        parts: dict[str, tuple[int, int]],
        max_policies: int,
        max_bytes: int,
        retrieve: Callable[[Any], None],
        copy: Callable[[Any], Any],
        connection_error: type[BaseException],
        reply_error: type[BaseException],
    ) -> None: ...
    def __call__(self, connection: Any, /) -> None: ...

@final
class BatchedReply:
    """A batched call's slot in a connection's _pending (made by Grouping)."""

    _parts: list[Any]
    def done(self) -> bool: ...
    def set_result(self, reply: Any, /) -> None: ...
    def set_exception(self, error: BaseException, /) -> None: ...

class ConnectionCore:
    """The per-command path of moderato's asyncio Redis connection
    (csrc/connection_core.c); moderato/redis/connection.py's RedisConnection
    is its subclass and sets every attribute in its ``__init__``."""

    _loop: Any
    _pending: Any
    _write_buffer: list[bytes]
    _scripts: Any
    _batches: Any
    _reader: Any
    _read_buffer: bytearray
    _read_view: memoryview
    _transport: Any
    _timer: Any
    _future_type: Any
    _reply_error: Any
    _call_soon: Callable[..., Any]
    _call_at: Callable[..., Any]
    _loop_time: Optional[Callable[[], float]]
    _batch_deadline: float
    _command_timeout_s: float
    _held: int
    _batched_total: int
    _state: int
    usable: bool
    batch_open: bool
    _flush_due: bool
    def send_script(
        self, payload: bytes | None, script: Any, keys: Any, args: Any, /
    ) -> asyncio.Future[Any]: ...
    def _queue(self, future: Any, payload: bytes, /) -> None: ...
    def _schedule_flush(self) -> None: ...
    def _flush(self) -> None: ...
    def get_buffer(self, sizehint: int, /) -> memoryview: ...
    def buffer_updated(self, nbytes: int, /) -> None: ...

class FastMethod:
    """check_with_info (with then: check) as a method descriptor: the commonest check in one
    C call, any other the Python method's."""

    def __init__(
        self,
        function: Callable[..., Any],
        *,
        blocking: bool = False,
        then: Optional[Callable[[Any], Any]] = None,
        name: Optional[str] = None,
        doc: Optional[str] = None,
        signature: Optional[inspect.Signature] = None,
    ) -> None: ...
    def __call__(self, *args: Any, **keywords: Any) -> Any: ...
    def __get__(self, instance: object, owner: Optional[type] = None) -> Any: ...
