"""docs/sync.md: every snippet runs, and does what the page says, exactly.

The script and the Celery task run on a real redis-server (the Celery task
eagerly, with no broker); the Flask app on memory:// with a frozen clock,
so that no minute ends in the middle of the test.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from doc_snippets import snippets
from redis_servers import free_port

from moderato import RateLimitConfigError, RateLimitExceeded

PAGE = "sync.md"
NOW_MS = 1_800_000_000_000


def run(name: str) -> dict[str, Any]:
    """Execute snippet ``name`` as a module of its own; its namespace."""
    namespace: dict[str, Any] = {"__name__": f"sync_docs_{name}"}
    exec(compile(snippets(PAGE)[name], f"docs/{PAGE}:{name}", "exec"), namespace)
    return namespace


def test_the_page_has_these_snippets() -> None:
    assert list(snippets(PAGE)) == ["script", "flask", "celery"]


def test_the_script_exports_twice_a_day_per_customer(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("REDIS_URL", redis_url)
    namespace = run("script")
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == ["wrote acme.csv", "wrote globex.csv", "wrote acme.csv"]
    assert re.fullmatch(r"acme: no more exports today \(retry in \d+ s\)", lines[3]), lines[3]
    assert len(lines) == 4
    # The same quota, read back through the limiter (reopened after the with block).
    limiter = namespace["limiter"]
    scope = f"{namespace['__name__']}.export"
    assert limiter.get_usage("acme", "2/day", scope=scope)["current"] == 2
    assert limiter.get_usage("globex", "2/day", scope=scope)["current"] == 1
    limiter.close()


def test_the_flask_decorator_answers_429_with_retry_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REDIS_URL", "memory://")
    namespace = run("flask")
    namespace["limiter"].backend.clock = lambda: NOW_MS
    app = namespace["app"]
    client = app.test_client()
    answers = [client.get("/search", environ_base={"REMOTE_ADDR": "10.0.0.1"}) for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    assert [a.headers.get("X-RateLimit-Remaining") for a in answers[:3]] == ["2", "1", "0"]
    assert answers[0].headers["X-RateLimit-Limit"] == "3"
    denied = answers[3]
    assert denied.headers["Retry-After"] == "60"  # the fixed window's end, a minute away
    assert denied.get_json() == {"error": "rate limit exceeded", "retry_after": 60}
    # Another address is not affected; another view has a quota of its own.
    other = client.get("/search", environ_base={"REMOTE_ADDR": "10.0.0.2"})
    assert other.status_code == 200 and other.headers["X-RateLimit-Remaining"] == "2"
    reports = [client.post("/reports", environ_base={"REMOTE_ADDR": "10.0.0.1"}) for _ in range(3)]
    assert [r.status_code for r in reports] == [202, 202, 429]  # cost 5 of 10 an hour
    # A bad rate is refused at import, not at the first request.
    with pytest.raises(RateLimitConfigError):
        namespace["rate_limited"]("3/fortnight")


def test_the_flask_app_answers_503_when_redis_cannot_decide(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REDIS_URL", f"redis://127.0.0.1:{free_port()}")
    namespace = run("flask")
    answer = namespace["app"].test_client().get("/search")
    assert answer.status_code == 503
    assert answer.get_json() == {"error": "rate limiter unavailable"}


def test_the_celery_task_never_exceeds_the_providers_quota(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("CELERY_BROKER_URL", "memory://")
    namespace = run("celery")
    app, send_sms, limiter = namespace["app"], namespace["send_sms"], namespace["limiter"]
    app.conf.task_always_eager = True  # run in this process: no broker, no worker
    # 990 of the hour's 1,000 already spent by other workers.
    assert limiter.check(
        "sms-provider", "1000/hour", scope="sms", algorithm="token_bucket", cost=990
    )
    sent = [send_sms.apply(args=(f"+1555000{n:04d}", "hello")) for n in range(10)]
    assert [result.get() for result in sent] == [f"msg-+1555000{n:04d}" for n in range(10)]
    # The 1,001st is refused: retried (eagerly, at once: no countdown in eager mode)
    # until its retries run out, then it fails with the refusal. Nothing is charged.
    refused = send_sms.apply(args=("+15550009999", "hello"))
    assert refused.failed()
    assert isinstance(refused.result, RateLimitExceeded)
    usage = limiter.get_usage("sms-provider", "1000/hour", scope="sms", algorithm="token_bucket")
    assert usage["remaining"] == 0 and usage["current"] == 1000
    limiter.close()
