"""Redis URLs: ``redis://``, ``rediss://`` (TLS) and ``unix://``, parsed into a RedisAddress;
``redis+cluster://`` and ``rediss+cluster://``, parsed into a ClusterAddress;
``redis+sentinel://`` and ``rediss+sentinel://``, parsed into a SentinelAddress.

Grammar::

    redis://[user[:password]@]host[:port][/db][?db=N&client_name=NAME&...]
    rediss://...                       the same, over TLS
    unix://[user[:password]@]/path/to/redis.sock[?db=N&client_name=NAME&...]
    redis+cluster://[user[:password]@]host[:port][,host[:port]...][?client_name=NAME&...]
    rediss+cluster://...               the same, over TLS
    redis+sentinel://[user[:password]@]host[:port][,host[:port]...]/service_name[/db][?...]
    rediss+sentinel://...              the same, over TLS

Every scheme takes ``client_name`` and the connection options of
url_options.py (``socket_timeout``, ``ssl_ca_certs``, ``batch_decisions``, ...);
the single-node and Sentinel schemes take ``db`` too. ``batch_decisions=true``
turns on the asyncio clients' batched decisions (grouping.py; a Sentinel
client's primary batches too); the blocking clients never batch and refuse it.
A cluster URL lists seed nodes: any one of them that answers tells the client
the whole cluster. Redis Cluster has only database 0, so a cluster URL names no
database. A Sentinel URL lists sentinels
(port 26379 unless given) and the name of the service they watch, as limits
writes it; ``sentinel_username``, ``sentinel_password`` and ``sentinel_ssl``
set the sentinels' own credentials and TLS when they differ from the primary's.

Anything else is a ValueError whose message shows the URL with its password
masked: URLs end up in logs and tracebacks, passwords must not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, TypeVar
from urllib.parse import SplitResult, parse_qsl, quote, unquote, urlsplit

from .url_options import CONNECT_OPTIONS, REFUSED_OPTIONS, ConnectOptions, parse_connect_options

# The public names, which moderato.redis re-exports; the schemes, default ports,
# address_of() and client_name_problem() are the package's own.
__all__ = [
    "ClusterAddress",
    "RedisAddress",
    "SentinelAddress",
    "is_cluster_url",
    "is_sentinel_url",
    "mask_url",
    "parse_cluster_url",
    "parse_sentinel_url",
    "parse_url",
]

DEFAULT_PORT = 6379
_SCHEMES = ("redis", "rediss", "unix")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
DEFAULT_SENTINEL_PORT = 26379
_QUERY_OPTIONS = ("db", "client_name", *CONNECT_OPTIONS)
# The sentinels' own credentials and TLS, when they differ from the data nodes';
# whether the primary's replies wait for its replicas (see SentinelClient).
_SENTINEL_OPTIONS = ("sentinel_username", "sentinel_password", "sentinel_ssl", "wait_for_replicas")
# Redis refuses CLIENT SETNAME with spaces, newlines or other special characters:
# printable ASCII other than the blank is what it takes.
_CLIENT_NAME = re.compile(r"[!-~]+")
# Redis parses SELECT's index as a C long; larger values cannot name a database.
_MAX_DB = 2**31 - 1

# Builds the ValueError for one URL from a reason; passed to the helpers below.
_BadFactory = Callable[[str], ValueError]


@dataclass(frozen=True)
class RedisAddress:
    """Where a Redis server is and how to greet it.

    ``unix_path`` is set for a unix socket (``host`` and ``port`` are then unused);
    ``password`` never appears in ``repr()`` or ``str()``.
    """

    host: str = "localhost"
    port: int = DEFAULT_PORT
    unix_path: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False
    client_name: str | None = None
    # The URL's connection options (timeouts, TLS settings); see url_options.py.
    options: ConnectOptions = field(default=ConnectOptions(), compare=False, repr=False)

    def __str__(self) -> str:
        """The address as a URL with the password masked, for messages and logs."""
        user = _masked_user(self.username, self.password)
        if self.unix_path is not None:
            where = f"unix://{user}{self.unix_path}"
            return where if self.db == 0 else f"{where}?db={self.db}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "rediss" if self.tls else "redis"
        where = f"{scheme}://{user}{host}:{self.port}"
        return where if self.db == 0 else f"{where}/{self.db}"


@dataclass(frozen=True)
class ClusterAddress:
    """Seed nodes of a Redis Cluster and how to greet every node of it.

    The credentials, TLS and client name apply to every node, seeds and the
    nodes the cluster names alike; ``password`` never appears in ``repr()`` or
    ``str()``.
    """

    seeds: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False
    client_name: str | None = None
    options: ConnectOptions = field(default=ConnectOptions(), compare=False, repr=False)

    def node(self, host: str, port: int) -> RedisAddress:
        """The address of one node of this cluster (database 0, the cluster's credentials)."""
        return _data_node(self, host, port, 0)

    def __str__(self) -> str:
        """The address as a URL with the password masked, for messages and logs."""
        user = _masked_user(self.username, self.password)
        scheme = "rediss+cluster" if self.tls else "redis+cluster"
        return f"{scheme}://{user}{_hosts_text(self.seeds)}"


@dataclass(frozen=True)
class SentinelAddress:
    """The sentinels watching a replicated Redis, and the name of the service they watch.

    ``username``/``password``, ``tls``, ``db`` and ``client_name`` apply to the
    primary the sentinels name; the sentinels get ``sentinel_username``,
    ``sentinel_password`` and ``sentinel_tls`` (which default to the same
    credentials and TLS, as limits and most deployments use one password for both).
    ``wait_for_replicas`` (URL option, default true): the primary's replies are
    released only once its replicas acknowledged the writes before them
    (``WAIT``; see SentinelClient).
    """

    sentinels: tuple[tuple[str, int], ...]
    service_name: str
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False
    client_name: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = field(default=None, repr=False)
    sentinel_tls: bool = False
    wait_for_replicas: bool = True
    options: ConnectOptions = field(default=ConnectOptions(), compare=False, repr=False)

    def primary(self, host: str, port: int) -> RedisAddress:
        """The address of the primary the sentinels named (the data nodes' settings)."""
        return _data_node(self, host, port, self.db)

    def sentinel(self, host: str, port: int) -> RedisAddress:
        """The address of one sentinel (the sentinels' own credentials and TLS)."""
        return RedisAddress(
            host=host,
            port=port,
            username=self.sentinel_username,
            password=self.sentinel_password,
            tls=self.sentinel_tls,
            options=self.options if self.sentinel_tls == self.tls else ConnectOptions(),
        )

    def __str__(self) -> str:
        """The address as a URL with the passwords masked, for messages and logs."""
        user = _masked_user(self.username, self.password)
        scheme = "rediss+sentinel" if self.tls else "redis+sentinel"
        where = f"{scheme}://{user}{_hosts_text(self.sentinels)}/{quote(self.service_name)}"
        return where if self.db == 0 else f"{where}/{self.db}"


def _data_node(
    address: ClusterAddress | SentinelAddress, host: str, port: int, db: int
) -> RedisAddress:
    """A data node at host:port, greeted as ``address`` greets its data nodes
    (credentials, TLS, client name, connection options)."""
    return RedisAddress(
        host=host,
        port=port,
        db=db,
        username=address.username,
        password=address.password,
        tls=address.tls,
        client_name=address.client_name,
        options=address.options,
    )


def _masked_user(username: str | None, password: str | None) -> str:
    if username is None and password is None:
        return ""
    name = quote(username or "", safe="")
    return f"{name}:***@" if password is not None else f"{name}@"


def _hosts_text(hosts: tuple[tuple[str, int], ...]) -> str:
    return ",".join(f"[{host}]:{port}" if ":" in host else f"{host}:{port}" for host, port in hosts)


def _one_of(schemes: tuple[str, ...]) -> str:
    """``a://, b:// or c://``: the schemes of one tuple, for error messages."""
    names = [f"{scheme}://" for scheme in schemes]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def is_cluster_url(url: object) -> bool:
    """Whether ``url`` is a str with a cluster scheme (``redis+cluster://``, ``rediss+cluster://``)."""
    if not isinstance(url, str):
        return False
    scheme, sep, _ = url.partition("://")
    return bool(sep) and scheme.lower() in CLUSTER_SCHEMES


def is_sentinel_url(url: object) -> bool:
    """Whether ``url`` is a str with a Sentinel scheme (``redis+sentinel://``, ``rediss+sentinel://``)."""
    if not isinstance(url, str):
        return False
    scheme, sep, _ = url.partition("://")
    return bool(sep) and scheme.lower() in SENTINEL_SCHEMES


def mask_url(url: str) -> str:
    """``url`` with whatever follows the first ``:`` of its user part replaced by ``***``.

    Works on malformed URLs too (that is when it is needed most). The user part is
    taken up to the *last* ``@`` so a password holding an unescaped ``@`` is still
    masked whole; masking too much is harmless, too little is not.
    """
    start = url.find("://")
    start = 0 if start < 0 else start + 3
    at = url.rfind("@", start)
    if at < 0:
        return url
    userinfo = url[start:at]
    colon = userinfo.find(":")
    if colon < 0:
        # "redis://secret@host": some tools put a bare password there.
        return f"{url[:start]}***{url[at:]}"
    return f"{url[:start]}{userinfo[: colon + 1]}***{url[at:]}"


_Address = TypeVar("_Address", RedisAddress, ClusterAddress, SentinelAddress)


def address_of(
    address: object,
    kind: type[_Address],
    parse: Callable[[str], _Address],
    url_kind: str = "a URL str",
) -> _Address:
    """A client constructor's ``address``: a ``kind`` as is, a str parsed with ``parse``,
    anything else a TypeError naming both forms it takes."""
    if isinstance(address, kind):
        return address
    if isinstance(address, str):
        return parse(address)
    raise TypeError(
        f"address must be a {kind.__name__} or {url_kind}, got {type(address).__name__}"
    )


def parse_url(url: str) -> RedisAddress:
    """Parse a Redis URL; raise ValueError naming the (masked) URL and what is wrong."""
    _require_str(url)

    def bad(reason: str) -> ValueError:
        return ValueError(f"invalid Redis URL {mask_url(url)!r}: {reason}")

    if url != url.strip() or any(ord(ch) < 0x21 or ord(ch) == 0x7F for ch in url):
        raise bad("it contains blanks or control characters")
    try:
        parts = urlsplit(url)
    except ValueError as error:  # e.g. an unbalanced "[" in the host
        raise bad(str(error)) from None
    scheme = parts.scheme.lower()
    if scheme in CLUSTER_SCHEMES:
        raise bad(
            f"{parts.scheme}:// names a Redis Cluster, not one server; "
            "use parse_cluster_url() or ClusterClient"
        )
    if scheme in SENTINEL_SCHEMES:
        raise bad(
            f"{parts.scheme}:// names sentinels, not one server; "
            "use parse_sentinel_url() or SentinelClient"
        )
    if scheme not in _SCHEMES:
        raise bad(
            f"unsupported scheme {parts.scheme + '://' if parts.scheme else '(none)'}; "
            f"expected {_one_of(_SCHEMES)} (a cluster: {_one_of(CLUSTER_SCHEMES)}, "
            f"with parse_cluster_url(); sentinels: {_one_of(SENTINEL_SCHEMES)}, "
            "with parse_sentinel_url())"
        )
    if parts.fragment or url.endswith("#"):
        raise bad("a fragment ('#...') is not allowed (write a '#' in a password as %23)")

    username, password = _credentials(parts.netloc, bad)
    query = _query(parts.query, _QUERY_OPTIONS, scheme == "rediss", bad)
    # A unix socket (host and port unused) or a TCP server, the database also given
    # by the path there.
    host, port, unix_path, db = "localhost", DEFAULT_PORT, None, query.db
    if scheme == "unix":
        unix_path = _socket_path(parts, bad)
    else:
        host, port = _host_and_port(parts, bad)
        db = _path_db(parts.path, db, bad)
    return RedisAddress(
        host=host,
        port=port,
        unix_path=unix_path,
        db=0 if db is None else db,
        username=username,
        password=password,
        tls=scheme == "rediss",
        client_name=query.client_name,
        options=query.options,
    )


def _socket_path(parts: SplitResult, bad: _BadFactory) -> str:
    """A unix:// URL's socket path: absolute, and no host before it."""
    host_part = parts.netloc.rpartition("@")[2]
    if host_part:
        raise bad(f"a unix:// URL takes no host (got {host_part!r}); write unix:///path/to.sock")
    path = unquote(parts.path)
    if not path.startswith("/") or path == "/":
        raise bad("a unix:// URL needs an absolute socket path, e.g. unix:///run/redis.sock")
    return path


def _host_and_port(parts: SplitResult, bad: _BadFactory) -> tuple[str, int]:
    """A redis:// or rediss:// URL's host, and its port (DEFAULT_PORT if none is written)."""
    try:
        host = parts.hostname
        port = parts.port
    except ValueError as error:  # a non-numeric or out-of-range port
        raise bad(f"bad port ({error})") from None
    if not host:
        raise bad("a host is required, e.g. redis://localhost:6379")
    if port == 0:
        raise bad("port 0 cannot be connected to")
    if port is None and parts.netloc.endswith(":"):
        raise bad("an empty port after ':'")
    return host, DEFAULT_PORT if port is None else port


def _path_db(path: str, db: int | None, bad: _BadFactory) -> int | None:
    """The database a TCP URL's path names (``/2``), else ``db`` (its query's, or None);
    both given, they must agree."""
    if path in ("", "/"):
        return db
    text = path[1:]
    if not text.isdigit() or not text.isascii():
        raise bad(f"the path must be a database number, e.g. /0 (got {path!r})")
    path_db = int(text)
    if path_db > _MAX_DB:
        raise bad(f"database {path_db} is out of range (0..{_MAX_DB})")
    if db is not None and db != path_db:
        raise bad(f"the database is given twice and differs (/{path_db} and db={db})")
    return path_db


def parse_cluster_url(url: str) -> ClusterAddress:
    """Parse a ``redis+cluster://`` or ``rediss+cluster://`` URL into its seeds and options.

    Raises ValueError naming the (masked) URL and what is wrong.
    """
    _require_str(url)

    def bad(reason: str) -> ValueError:
        return ValueError(f"invalid Redis Cluster URL {mask_url(url)!r}: {reason}")

    scheme, rest, query = _split_host_list_url(url, CLUSTER_SCHEMES, bad)
    netloc, slash, path = rest.partition("/")
    if path:
        raise bad(
            f"a cluster URL names no database (got path {slash + path!r}): "
            "Redis Cluster has only database 0"
        )
    username, password = _credentials(netloc, bad)
    parsed = _query(query, _QUERY_OPTIONS, scheme == "rediss+cluster", bad)
    if parsed.db is not None:
        raise bad("a cluster URL takes no db option: Redis Cluster has only database 0")

    hosts = netloc.rpartition("@")[2]
    if not hosts:
        raise bad("at least one seed node is required, e.g. redis+cluster://10.0.0.1:7000")
    return ClusterAddress(
        seeds=_host_list(hosts, DEFAULT_PORT, "seed node", bad),
        username=username,
        password=password,
        tls=scheme == "rediss+cluster",
        client_name=parsed.client_name,
        options=parsed.options,
    )


def parse_sentinel_url(url: str) -> SentinelAddress:
    """Parse a ``redis+sentinel://`` or ``rediss+sentinel://`` URL (limits' form).

    ``redis+sentinel://[user:password@]host[:port][,host[:port]...]/service_name[/db]``;
    a sentinel's port defaults to 26379. Query options: those of a single-node
    URL, plus ``sentinel_username``, ``sentinel_password`` and ``sentinel_ssl``
    (true/false) for the sentinels themselves, and ``wait_for_replicas``
    (true/false). Raises ValueError naming the (masked) URL and what is wrong.
    """
    _require_str(url)

    def bad(reason: str) -> ValueError:
        return ValueError(f"invalid Redis Sentinel URL {mask_url(_mask_query(url))!r}: {reason}")

    scheme, rest, query = _split_host_list_url(url, SENTINEL_SCHEMES, bad)
    netloc, _, path = rest.partition("/")
    tls = scheme == "rediss+sentinel"
    username, password = _credentials(netloc, bad)
    parsed = _query(query, (*_QUERY_OPTIONS, *_SENTINEL_OPTIONS), tls, bad)

    hosts = netloc.rpartition("@")[2]
    if not hosts:
        raise bad(
            "at least one sentinel is required, e.g. redis+sentinel://10.0.0.1:26379/mymaster"
        )
    service, _, db_text = path.partition("/")
    service_name = unquote(service)
    if not service_name:
        raise bad("the service name is required: redis+sentinel://host:26379/service_name")
    if not _CLIENT_NAME.fullmatch(service_name):
        raise bad(f"service name {service_name!r} must be printable ASCII without blanks")
    db = parsed.db
    if db_text:
        if not db_text.isdigit() or not db_text.isascii() or int(db_text) > _MAX_DB:
            raise bad(
                f"the path after the service name must be a database number (got {db_text!r})"
            )
        if db is not None and db != int(db_text):
            raise bad(f"the database is given twice and differs (/{db_text} and db={db})")
        db = int(db_text)
    extra = parsed.extra
    switches = {"sentinel_ssl": tls, "wait_for_replicas": True}
    for name in switches:
        if name in extra:
            text = extra[name].lower()
            if text not in ("true", "false"):
                raise bad(f"{name} must be true or false (got {extra[name]!r})")
            switches[name] = text == "true"
    sentinel_username, sentinel_password = username, password
    if "sentinel_username" in extra or "sentinel_password" in extra:
        sentinel_username = extra.get("sentinel_username") or None
        sentinel_password = extra.get("sentinel_password") or None
        if sentinel_username is not None and sentinel_password is None:
            raise bad("sentinel_username needs sentinel_password")
    return SentinelAddress(
        sentinels=_host_list(hosts, DEFAULT_SENTINEL_PORT, "sentinel", bad),
        service_name=service_name,
        db=0 if db is None else db,
        username=username,
        password=password,
        tls=tls,
        client_name=parsed.client_name,
        sentinel_username=sentinel_username,
        sentinel_password=sentinel_password,
        sentinel_tls=switches["sentinel_ssl"],
        wait_for_replicas=switches["wait_for_replicas"],
        options=parsed.options,
    )


def _require_str(url: object) -> None:
    """The TypeError every parser raises for a URL that is not a str."""
    if not isinstance(url, str):
        raise TypeError(f"a Redis URL must be a str, got {type(url).__name__}")


def _split_host_list_url(
    url: str, schemes: tuple[str, ...], bad: _BadFactory
) -> tuple[str, str, str]:
    """(scheme, everything up to the query, the query) of a URL listing several hosts.

    Split by hand: urlsplit() refuses a bracketed IPv6 host after the first one.
    """
    if url != url.strip() or any(ord(ch) < 0x21 or ord(ch) == 0x7F for ch in url):
        raise bad("it contains blanks or control characters")
    scheme_text, sep, rest = url.partition("://")
    scheme = scheme_text.lower() if sep else ""
    if scheme not in schemes:
        raise bad(
            f"unsupported scheme {scheme_text + '://' if sep and scheme_text else '(none)'}; "
            f"expected {_one_of(schemes)}"
        )
    if "#" in rest:
        raise bad("a fragment ('#...') is not allowed (write a '#' in a password as %23)")
    rest, _, query = rest.partition("?")
    return scheme, rest, query


def _mask_query(url: str) -> str:
    """``url`` with the value of a ``sentinel_password`` query option masked."""
    return re.sub(r"(sentinel_password=)[^&#]*", r"\1***", url)


def _host_list(
    hosts: str, default_port: int, what: str, bad: _BadFactory
) -> tuple[tuple[str, int], ...]:
    """``host[:port],host[:port]...`` as (host, port) pairs, duplicates dropped."""
    pairs: list[tuple[str, int]] = []
    for entry in hosts.split(","):
        if not entry:
            raise bad(f"an empty {what} (a stray ',')")
        try:
            seed = urlsplit(f"//{entry}")
            host = seed.hostname
            port = seed.port
        except ValueError as error:
            raise bad(f"bad {what} {entry!r} ({error})") from None
        if not host:
            raise bad(f"bad {what} {entry!r}: a host is required")
        if port == 0:
            raise bad(f"bad {what} {entry!r}: port 0 cannot be connected to")
        if port is None and entry.endswith(":"):
            raise bad(f"bad {what} {entry!r}: an empty port after ':'")
        pair = (host, default_port if port is None else port)
        if pair not in pairs:
            pairs.append(pair)
    return tuple(pairs)


def _credentials(netloc: str, bad: _BadFactory) -> tuple[str | None, str | None]:
    userinfo, at, _ = netloc.rpartition("@")
    if not at:
        return None, None
    name, colon, secret = userinfo.partition(":")
    if not colon:
        raise bad(
            "it names a user but no password; write redis://user:password@host, "
            "or redis://:password@host for the default user"
        )
    username = unquote(name) or None
    password = unquote(secret)
    if username is None and not password:
        # "redis://:@host" says nothing: no AUTH at all.
        return None, None
    return username, password


@dataclass(frozen=True)
class _Query:
    db: int | None = None
    client_name: str | None = None
    options: ConnectOptions = field(default_factory=ConnectOptions)
    # Options only some schemes take (the sentinels' own), as given.
    extra: dict[str, str] = field(default_factory=dict)


def _query(query: str, accepted: tuple[str, ...], tls: bool, bad: _BadFactory) -> _Query:
    if not query:
        return _Query()
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise bad(f"malformed query {query!r}; expected name=value pairs joined by '&'") from None
    seen: dict[str, str] = {}
    for name, value in pairs:
        if name in REFUSED_OPTIONS:
            raise bad(f"option {name!r} is not supported: {REFUSED_OPTIONS[name]}")
        if name not in accepted:
            raise bad(f"unknown option {name!r}; accepted: {', '.join(accepted)}")
        if name in seen:
            raise bad(f"option {name!r} is given twice")
        seen[name] = value
    db: int | None = None
    if "db" in seen:
        text = seen["db"]
        if not text.isdigit() or not text.isascii():
            raise bad(f"db must be a non-negative integer (got {text!r})")
        db = int(text)
        if db > _MAX_DB:
            raise bad(f"database {db} is out of range (0..{_MAX_DB})")
    client_name: str | None = None
    if "client_name" in seen:
        client_name = seen["client_name"]
        problem = client_name_problem(client_name)
        if problem:
            raise bad(problem)
    options = parse_connect_options(seen, tls, bad)
    extra = {name: value for name, value in seen.items() if name in _SENTINEL_OPTIONS}
    return _Query(db, client_name, options, extra)


def client_name_problem(name: str) -> str | None:
    """Why Redis would refuse ``name`` for CLIENT SETNAME, or None if it is fine."""
    if _CLIENT_NAME.fullmatch(name):
        return None
    return f"client_name {name!r} must be non-empty printable ASCII without blanks"
