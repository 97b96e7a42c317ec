"""The backend as the dashboard describes it: where it is (never with credentials), and
what Redis's INFO says of its memory and load on each primary."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Optional

from ..backends.redis_py import RedisPyClient
from ..redis import ClusterClient, RedisClient, SentinelClient

INFO_FIELDS = (
    "redis_version",
    "role",
    "used_memory",
    "used_memory_human",
    "maxmemory",
    "maxmemory_human",
    "maxmemory_policy",
    "instantaneous_ops_per_sec",
    "connected_clients",
    "uptime_in_seconds",
)
"""What the dashboard shows of INFO (sections server, clients, memory, stats)."""
INFO_TIMEOUT_S = 2.0


def describe_backend(client: Any) -> dict[str, str]:
    """The backend's kind and where it is: hosts, ports, database, service; no credentials."""
    if client is None:
        return {"kind": "memory", "where": "memory:// (this process only)"}
    if isinstance(client, ClusterClient):
        seeds = ",".join(_host_port(host, port) for host, port in client.address.seeds)
        return {"kind": "cluster", "where": f"Redis Cluster (seeds {seeds})"}
    if isinstance(client, SentinelClient):
        watched = client.address
        sentinels = ",".join(_host_port(host, port) for host, port in watched.sentinels)
        primary = client.primary_address
        now = f", primary now {_host_port(*primary)}" if primary else ""
        return {
            "kind": "sentinel",
            "where": f"Sentinel service {watched.service_name!r} ({sentinels}){now}",
        }
    if isinstance(client, RedisClient):
        address = client.address
        if address.unix_path is not None:
            return {"kind": "redis", "where": f"unix socket {address.unix_path} db {address.db}"}
        return {
            "kind": "redis",
            "where": f"{_host_port(address.host, address.port)} db {address.db}"
            + (" (TLS)" if address.tls else ""),
        }
    if isinstance(client, RedisPyClient):
        return {"kind": "redis-py", "where": "an application's redis-py client"}
    return {"kind": type(client).__name__, "where": ""}


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def redis_info(client: Any) -> list[dict[str, Any]]:
    """INFO server, clients, memory and stats of every primary (one for a single server).

    Each entry is ``{"node": name, <INFO_FIELDS>...}``, or ``{"node": ..., "error": ...}``.
    """
    command = ("INFO", "server", "clients", "memory", "stats")
    try:
        if isinstance(client, ClusterClient):
            replies: Mapping[str, Any] = await asyncio.wait_for(
                client.execute_on_primaries(*command), INFO_TIMEOUT_S
            )
            return [_fields(node, reply) for node, reply in sorted(replies.items())]
        reply = await asyncio.wait_for(client.execute(*command), INFO_TIMEOUT_S)
    except Exception as error:  # the client's own errors, or the time limit
        return [{"node": "", "error": type(error).__name__}]
    node = ""
    if isinstance(client, SentinelClient) and client.primary_address:
        node = _host_port(*client.primary_address)
    elif isinstance(client, RedisClient) and client.address.unix_path is None:
        node = _host_port(client.address.host, client.address.port)
    if isinstance(reply, Mapping) and reply and all(isinstance(v, Mapping) for v in reply.values()):
        return [
            _fields(str(name), each) for name, each in sorted(reply.items())
        ]  # redis-py cluster
    return [_fields(node, reply)]


def _fields(node: str, reply: Any) -> dict[str, Any]:
    parsed = reply if isinstance(reply, Mapping) else parse_info(reply)
    shown: dict[str, Any] = {"node": node}
    for name in INFO_FIELDS:
        if name in parsed:
            shown[name] = parsed[name]
    return shown


def parse_info(reply: Optional[Any]) -> dict[str, str]:
    """INFO's text (``name:value`` lines, ``#`` section titles) as a dict."""
    text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply or "")
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.partition(":")
            fields[name.strip()] = value.strip()
    return fields
