"""Redis URLs: ``redis://``, ``rediss://`` (TLS) and ``unix://``, parsed into a RedisAddress;
``redis+cluster://`` and ``rediss+cluster://``, parsed into a ClusterAddress.

Grammar (query options ``db`` and ``client_name`` are accepted by every
single-node scheme; cluster URLs take ``client_name`` only)::

    redis://[user[:password]@]host[:port][/db][?db=N&client_name=NAME]
    rediss://...                       the same, over TLS
    unix://[user[:password]@]/path/to/redis.sock[?db=N&client_name=NAME]
    redis+cluster://[user[:password]@]host[:port][,host[:port]...][?client_name=NAME]
    rediss+cluster://...               the same, over TLS

A cluster URL lists seed nodes: any one of them that answers tells the client
the whole cluster. Redis Cluster has only database 0, so a cluster URL names
no database.

Anything else is a ValueError whose message shows the URL with its password
masked: URLs end up in logs and tracebacks, passwords must not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import parse_qsl, quote, unquote, urlsplit

__all__ = [
    "CLUSTER_SCHEMES",
    "DEFAULT_PORT",
    "ClusterAddress",
    "RedisAddress",
    "client_name_problem",
    "is_cluster_url",
    "mask_url",
    "parse_cluster_url",
    "parse_url",
]

DEFAULT_PORT = 6379
_SCHEMES = ("redis", "rediss", "unix")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
_QUERY_OPTIONS = ("db", "client_name")
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

    def __str__(self) -> str:
        """The address as a URL with the password masked, for messages and logs."""
        user = ""
        if self.username is not None or self.password is not None:
            name = quote(self.username or "", safe="")
            user = f"{name}:***@" if self.password is not None else f"{name}@"
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

    def node(self, host: str, port: int) -> RedisAddress:
        """The address of one node of this cluster (database 0, the cluster's credentials)."""
        return RedisAddress(
            host=host,
            port=port,
            username=self.username,
            password=self.password,
            tls=self.tls,
            client_name=self.client_name,
        )

    def __str__(self) -> str:
        """The address as a URL with the password masked, for messages and logs."""
        user = ""
        if self.username is not None or self.password is not None:
            name = quote(self.username or "", safe="")
            user = f"{name}:***@" if self.password is not None else f"{name}@"
        hosts = ",".join(
            f"[{host}]:{port}" if ":" in host else f"{host}:{port}" for host, port in self.seeds
        )
        scheme = "rediss+cluster" if self.tls else "redis+cluster"
        return f"{scheme}://{user}{hosts}"


def is_cluster_url(url: object) -> bool:
    """Whether ``url`` is a str with a cluster scheme (``redis+cluster://``, ``rediss+cluster://``)."""
    if not isinstance(url, str):
        return False
    scheme, sep, _ = url.partition("://")
    return bool(sep) and scheme.lower() in CLUSTER_SCHEMES


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


def parse_url(url: str) -> RedisAddress:
    """Parse a Redis URL; raise ValueError naming the (masked) URL and what is wrong."""
    if not isinstance(url, str):
        raise TypeError(f"a Redis URL must be a str, got {type(url).__name__}")

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
    if scheme not in _SCHEMES:
        raise bad(
            f"unsupported scheme {parts.scheme + '://' if parts.scheme else '(none)'}; "
            "expected redis://, rediss:// or unix://"
        )
    if parts.fragment or url.endswith("#"):
        raise bad("a fragment ('#...') is not allowed (write a '#' in a password as %23)")

    username, password = _credentials(parts.netloc, bad)
    db_from_query, client_name = _query(parts.query, bad)

    if scheme == "unix":
        host_part = parts.netloc.rpartition("@")[2]
        if host_part:
            raise bad(
                f"a unix:// URL takes no host (got {host_part!r}); write unix:///path/to.sock"
            )
        path = unquote(parts.path)
        if not path.startswith("/") or path == "/":
            raise bad("a unix:// URL needs an absolute socket path, e.g. unix:///run/redis.sock")
        return RedisAddress(
            unix_path=path,
            db=0 if db_from_query is None else db_from_query,
            username=username,
            password=password,
            client_name=client_name,
        )

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

    db = db_from_query
    path = parts.path
    if path not in ("", "/"):
        text = path[1:]
        if not text.isdigit() or not text.isascii():
            raise bad(f"the path must be a database number, e.g. /0 (got {path!r})")
        path_db = int(text)
        if path_db > _MAX_DB:
            raise bad(f"database {path_db} is out of range (0..{_MAX_DB})")
        if db is not None and db != path_db:
            raise bad(f"the database is given twice and differs (/{path_db} and db={db})")
        db = path_db

    return RedisAddress(
        host=host,
        port=DEFAULT_PORT if port is None else port,
        db=0 if db is None else db,
        username=username,
        password=password,
        tls=scheme == "rediss",
        client_name=client_name,
    )


def parse_cluster_url(url: str) -> ClusterAddress:
    """Parse a ``redis+cluster://`` or ``rediss+cluster://`` URL into its seeds and options.

    Raises ValueError naming the (masked) URL and what is wrong.
    """
    if not isinstance(url, str):
        raise TypeError(f"a Redis URL must be a str, got {type(url).__name__}")

    def bad(reason: str) -> ValueError:
        return ValueError(f"invalid Redis Cluster URL {mask_url(url)!r}: {reason}")

    if url != url.strip() or any(ord(ch) < 0x21 or ord(ch) == 0x7F for ch in url):
        raise bad("it contains blanks or control characters")
    # Split by hand: urlsplit() refuses a bracketed IPv6 host after the first seed.
    scheme_text, sep, rest = url.partition("://")
    scheme = scheme_text.lower() if sep else ""
    if scheme not in CLUSTER_SCHEMES:
        raise bad(
            f"unsupported scheme {scheme_text + '://' if sep and scheme_text else '(none)'}; "
            "expected redis+cluster:// or rediss+cluster://"
        )
    if "#" in rest:
        raise bad("a fragment ('#...') is not allowed (write a '#' in a password as %23)")
    rest, _, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    if path:
        raise bad(
            f"a cluster URL names no database (got path {slash + path!r}): "
            "Redis Cluster has only database 0"
        )
    username, password = _credentials(netloc, bad)
    db, client_name = _query(query, bad)
    if db is not None:
        raise bad("a cluster URL takes no db option: Redis Cluster has only database 0")

    hosts = netloc.rpartition("@")[2]
    if not hosts:
        raise bad("at least one seed node is required, e.g. redis+cluster://10.0.0.1:7000")
    seeds: list[tuple[str, int]] = []
    for entry in hosts.split(","):
        if not entry:
            raise bad("an empty seed node (a stray ',')")
        try:
            seed = urlsplit(f"//{entry}")
            host = seed.hostname
            port = seed.port
        except ValueError as error:
            raise bad(f"bad seed node {entry!r} ({error})") from None
        if not host:
            raise bad(f"bad seed node {entry!r}: a host is required")
        if port == 0:
            raise bad(f"bad seed node {entry!r}: port 0 cannot be connected to")
        if port is None and entry.endswith(":"):
            raise bad(f"bad seed node {entry!r}: an empty port after ':'")
        pair = (host, DEFAULT_PORT if port is None else port)
        if pair not in seeds:
            seeds.append(pair)
    return ClusterAddress(
        seeds=tuple(seeds),
        username=username,
        password=password,
        tls=scheme == "rediss+cluster",
        client_name=client_name,
    )


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


def _query(query: str, bad: _BadFactory) -> tuple[int | None, str | None]:
    if not query:
        return None, None
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise bad(f"malformed query {query!r}; expected name=value pairs joined by '&'") from None
    seen: dict[str, str] = {}
    for name, value in pairs:
        if name not in _QUERY_OPTIONS:
            raise bad(f"unknown option {name!r}; accepted: {', '.join(_QUERY_OPTIONS)}")
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
    return db, client_name


def client_name_problem(name: str) -> str | None:
    """Why Redis would refuse ``name`` for CLIENT SETNAME, or None if it is fine."""
    if _CLIENT_NAME.fullmatch(name):
        return None
    return f"client_name {name!r} must be non-empty printable ASCII without blanks"
