"""Client identity: peer address, trusted proxies, forged headers, API keys."""

from __future__ import annotations

from typing import Any, Optional

import pytest
from fastapi import FastAPI
from http_helpers import client
from redis_servers import RedisServer

from moderato import RateLimitConfigError, RateLimiter
from moderato.integrations import ClientIdentity, RateLimitHeadersMiddleware
from moderato.web import addresses as addresses_module
from moderato.web.addresses import MAX_FORWARDED_HOPS, parse_address


def login_app(limiter: RateLimiter, key: Optional[ClientIdentity] = None) -> FastAPI:
    app = FastAPI()
    app.add_middleware(RateLimitHeadersMiddleware)

    @app.post("/login")
    @limiter.limit("2/hour", key=key)
    async def login() -> dict[str, str]:
        return {}

    return app


async def test_forged_forwarded_for_from_an_untrusted_peer_changes_nothing(
    limiter: RateLimiter,
) -> None:
    app = login_app(limiter)
    async with client(app, ip="203.0.113.50") as http:
        statuses = [
            (await http.post("/login", headers={"x-forwarded-for": forged})).status_code
            for forged in ("1.1.1.1", "2.2.2.2", "3.3.3.3, 4.4.4.4")
        ]
        forwarded = await http.post("/login", headers={"forwarded": "for=5.5.5.5"})
        real_ip = await http.post("/login", headers={"x-real-ip": "6.6.6.6"})
    assert statuses == [200, 200, 429]
    assert (forwarded.status_code, real_ip.status_code) == (429, 429)
    usage = await limiter.get_usage("203.0.113.50", "2/hour", scope="POST:/login")
    assert usage["current"] == 2


async def test_trusted_proxy_selects_the_rightmost_untrusted_hop(limiter: RateLimiter) -> None:
    identity = ClientIdentity(trusted_proxies=["10.0.0.0/8", "2001:db8:ffff::/48"])
    app = login_app(limiter, identity)
    async with client(app, ip="10.0.0.2") as http:

        async def login(forwarded_for: str) -> int:
            response = await http.post("/login", headers={"x-forwarded-for": forwarded_for})
            return response.status_code

        assert await login("198.51.100.1, 203.0.113.7") == 200
        # Another proxy in the chain is skipped; a forged left-most hop is ignored.
        assert await login("203.0.113.7, 10.9.9.9") == 200
        assert await login("1.1.1.1, 203.0.113.7") == 429
        # A different client behind the same proxy has its own quota.
        assert await login("203.0.113.8") == 200
        # Only proxies in the chain: the left-most one is the closest to a client.
        assert await login("10.1.1.1, 10.2.2.2") == 200
    for client_ip, current in (("203.0.113.7", 2), ("203.0.113.8", 1), ("10.1.1.1", 1)):
        usage = await limiter.get_usage(client_ip, "2/hour", scope="POST:/login")
        assert usage["current"] == current, client_ip
    # The proxy's own address was never charged.
    assert (await limiter.get_usage("10.0.0.2", "2/hour", scope="POST:/login"))["current"] == 0


async def test_forwarded_and_x_real_ip_are_read_when_configured(limiter: RateLimiter) -> None:
    rfc7239 = ClientIdentity(trusted_proxies=["127.0.0.1"], proxy_header="forwarded")
    real_ip = ClientIdentity(trusted_proxies=["127.0.0.1"], proxy_header="x-real-ip")
    app = FastAPI()
    app.add_middleware(RateLimitHeadersMiddleware)

    @app.get("/rfc7239")
    @limiter.limit("5/hour", key=rfc7239, scope="identity")
    async def by_forwarded() -> dict[str, str]:
        return {}

    @app.get("/real-ip")
    @limiter.limit("5/hour", key=real_ip, scope="identity")
    async def by_real_ip() -> dict[str, str]:
        return {}

    header = 'for=192.0.2.60;proto=http;by=203.0.113.43, for="[2001:db8:cafe::17]:4711"'
    async with client(app, ip="127.0.0.1") as http:
        await http.get("/rfc7239", headers={"forwarded": header})
        await http.get("/real-ip", headers={"x-real-ip": "192.0.2.99"})
        # The proxy's X-Forwarded-For is not the configured header here: ignored.
        await http.get("/real-ip", headers={"x-forwarded-for": "192.0.2.98"})
    for identity, current in (("2001:db8:cafe::17", 1), ("192.0.2.99", 1), ("127.0.0.1", 1)):
        usage = await limiter.get_usage(identity, "5/hour", scope="identity")
        assert usage["current"] == current, identity


async def test_identity_secret_keeps_client_addresses_out_of_redis(
    redis_server: RedisServer, redis_url: str
) -> None:
    secret_limiter = RateLimiter(redis_url, key_prefix="it", identity_secret=b"s" * 32)
    app = login_app(secret_limiter)
    async with client(app, ip="203.0.113.77") as http:
        assert (await http.post("/login")).status_code == 200
    keys = redis_server.command("KEYS", "*")
    assert b"it:fw:" in keys
    assert b"203.0.113.77" not in keys and b"203.0.113%2E77" not in keys
    await secret_limiter.close()


def scope_of(peer: Optional[str], headers: dict[str, str]) -> dict[str, Any]:
    return {
        "type": "http",
        "client": (peer, 1234) if peer is not None else None,
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }


@pytest.mark.parametrize(
    ("peer", "headers", "expected"),
    [
        ("192.0.2.1", {}, "192.0.2.1"),
        (None, {}, "unknown"),
        ("::ffff:192.0.2.1", {}, "192.0.2.1"),
        ("10.0.0.1", {"x-forwarded-for": "203.0.113.9"}, "203.0.113.9"),
        ("10.0.0.1", {"x-forwarded-for": "203.0.113.9:5555"}, "203.0.113.9"),
        ("10.0.0.1", {"x-forwarded-for": "[2001:db8::5]:80"}, "2001:db8::5"),
        ("10.0.0.1", {"x-forwarded-for": "unknown"}, "unknown"),
        ("10.0.0.1", {"x-forwarded-for": " , "}, "10.0.0.1"),
        ("10.0.0.1", {}, "10.0.0.1"),
        ("192.0.2.200", {"x-forwarded-for": "203.0.113.9"}, "192.0.2.200"),
        ("10.0.0.1", {"x-api-key": "k-123"}, "apikey:k-123"),
        ("10.0.0.1", {"x-api-key": "  "}, "10.0.0.1"),
        ("10.0.0.1", {"x-api-key": "192.0.2.5"}, "apikey:192.0.2.5"),
    ],
)
def test_client_identity_rules(peer: Optional[str], headers: dict[str, str], expected: str) -> None:
    identity = ClientIdentity(trusted_proxies=["10.0.0.0/8"], api_key_header="X-API-Key")
    assert identity.identify(scope_of(peer, headers)) == expected


def test_client_identity_configuration_errors() -> None:
    with pytest.raises(RateLimitConfigError, match="not an IP address or CIDR"):
        ClientIdentity(trusted_proxies=["10.0.0.0/33"])
    with pytest.raises(RateLimitConfigError, match="proxy_header"):
        ClientIdentity(proxy_header="x-client-ip")  # type: ignore[arg-type]
    # A single string is one network, not a sequence of characters.
    assert len(ClientIdentity(trusted_proxies="10.0.0.0/8").trusted_proxies) == 1


def test_parse_address_forms() -> None:
    assert str(parse_address('"[2001:db8::1]:4711"')) == "2001:db8::1"
    assert str(parse_address("192.0.2.1:80")) == "192.0.2.1"
    assert str(parse_address("2001:DB8::1")) == "2001:db8::1"
    assert parse_address("_hidden") is None
    assert parse_address("") is None


# -- bounded work: at most MAX_FORWARDED_HOPS proxy-header elements per request


def trusted_hop(from_right: int) -> str:
    """A distinct address in 10.0.0.0/8 naming a hop's place, counted from the server."""
    return f"10.{from_right // 65536 % 256}.{from_right // 256 % 256}.{from_right % 256}"


def trusted_chain(count: int, *, client: Optional[str] = None) -> list[str]:
    """``count`` trusted hops as a proxy would list them (left-most first), behind ``client``."""
    hops = [trusted_hop(place) for place in range(count, 0, -1)]
    return [client, *hops] if client is not None else hops


class CountingParser:
    """Counts the addresses the identity parses (the per-hop work)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        monkeypatch.setattr(addresses_module, "parse_address", self)

    def __call__(self, text: str) -> Any:
        self.calls += 1
        return parse_address(text)


@pytest.mark.parametrize(
    ("hops", "expected", "parsed"),
    [
        # 20,000 trusted hops: the 32nd from the right, a trusted proxy, after 32 parses.
        (trusted_chain(20_000), "10.0.0.32", 32),
        # Exactly the cap, all trusted: the left-most, as for any all-trusted chain.
        (trusted_chain(MAX_FORWARDED_HOPS), "10.0.0.32", 32),
        # An untrusted client within the cap is found.
        (trusted_chain(31, client="203.0.113.5"), "203.0.113.5", 32),
        # One hop beyond the cap is never read.
        (trusted_chain(32, client="203.0.113.5"), "10.0.0.32", 32),
        (trusted_chain(20_000, client="203.0.113.5"), "10.0.0.32", 32),
        # Short chains are read as before.
        (trusted_chain(3, client="203.0.113.5"), "203.0.113.5", 4),
    ],
)
@pytest.mark.parametrize("header", ["x-forwarded-for", "forwarded"])
def test_the_hops_examined_are_capped(
    monkeypatch: pytest.MonkeyPatch, header: str, hops: list[str], expected: str, parsed: int
) -> None:
    assert MAX_FORWARDED_HOPS == 32
    identity = ClientIdentity(trusted_proxies=["10.0.0.0/8"], proxy_header=header)  # type: ignore[arg-type]
    elements = [f"for={hop};proto=https" for hop in hops] if header == "forwarded" else hops
    parser = CountingParser(monkeypatch)
    scope = scope_of("10.0.0.1", {header: ", ".join(elements)})
    assert identity.identify(scope) == expected
    assert parser.calls == parsed


def test_the_cap_counts_hops_across_header_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    identity = ClientIdentity(trusted_proxies=["10.0.0.0/8"])
    chain = trusted_chain(40, client="203.0.113.5")
    parser = CountingParser(monkeypatch)
    scope = {
        "type": "http",
        "client": ("10.0.0.1", 1234),
        # Earlier lines hold hops further from the server: 41..21, then 20..1.
        "headers": [
            (b"x-forwarded-for", ", ".join(chain[:21]).encode()),
            (b"x-forwarded-for", ", ".join(chain[21:]).encode()),
        ],
    }
    assert identity.identify(scope) == "10.0.0.32"
    assert parser.calls == 32


def test_a_chain_past_the_cap_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    identity = ClientIdentity(trusted_proxies=["10.0.0.0/8"])
    scope = scope_of("10.0.0.1", {"x-forwarded-for": ", ".join(trusted_chain(33))})
    at_cap = scope_of("10.0.0.1", {"x-forwarded-for": ", ".join(trusted_chain(32))})
    with caplog.at_level("WARNING", logger="moderato"):
        assert identity.identify(at_cap) == "10.0.0.32"
        assert caplog.records == []
        assert [identity.identify(scope) for _ in range(3)] == ["10.0.0.32"] * 3
    assert len(caplog.records) == 1
    assert "more than 32 hops" in caplog.records[0].getMessage()
    assert "(10.0.0.32)" in caplog.records[0].getMessage()


async def test_requests_past_the_cap_share_the_last_proxy_read_quota(
    limiter: RateLimiter,
) -> None:
    """Over HTTP on a real server: five 20,000-hop requests, each forging another
    client beyond the cap, are one identity (the 32nd hop): 3 admitted of 3/hour."""
    app = FastAPI()

    @app.get("/")
    @limiter.limit("3/hour", key=ClientIdentity(trusted_proxies=["10.0.0.0/8"]), scope="cap")
    async def home() -> dict[str, str]:
        return {}

    async with client(app, ip="10.0.0.1") as http:
        statuses = []
        for forged in range(5):
            hops = trusted_chain(20_000, client=f"198.51.100.{forged}")
            response = await http.get("/", headers={"x-forwarded-for": ", ".join(hops)})
            statuses.append(response.status_code)
    assert statuses == [200, 200, 200, 429, 429]
    assert (await limiter.get_usage("10.0.0.32", "3/hour", scope="cap"))["current"] == 3
    for forged in range(5):
        usage = await limiter.get_usage(f"198.51.100.{forged}", "3/hour", scope="cap")
        assert usage["current"] == 0
