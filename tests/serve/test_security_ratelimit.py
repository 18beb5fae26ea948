"""Rate limiting on the real daemon: tiers, keys, exemptions, 401-before-429, counters.

One daemon with tiny budgets (read 3, mutation 2, prompt 1 per minute), a token and one
allowed origin. Buckets are keyed by the client's address, never by ``X-Qwen-Client-Id``
(issue 22 item 17), so every test calls from its own loopback address (127.0.0.N, all
routed to the daemon's 127.0.0.1): tests do not share buckets and need no clock.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from tests.support.daemon import DaemonProcess, spawn_daemon

TOKEN = "rl-Token-9c1e"  # also a syntactically valid client id (see the redaction test)
AUTH = {"Authorization": f"Bearer {TOKEN}"}
WINDOW_MS = 60_000
LIMITS = {"read": 3, "mutation": 2, "prompt": 1}


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    d = spawn_daemon(
        [
            "--rate-limit",
            "--rate-limit-read",
            str(LIMITS["read"]),
            "--rate-limit-mutation",
            str(LIMITS["mutation"]),
            "--rate-limit-window-ms",
            str(WINDOW_MS),
            "--allow-origin",
            "http://app.example.com",
        ],
        env={"QWEN_SERVER_TOKEN": TOKEN, "QWEN_SERVE_RATE_LIMIT_PROMPT": "1"},
    )
    try:
        yield d
    finally:
        d.stop()


@contextmanager
def calling_from(daemon: DaemonProcess, n: int) -> Iterator[httpx.Client]:
    """A client whose requests come from 127.0.0.``n`` (another key per address)."""
    transport = httpx.HTTPTransport(local_address=f"127.0.0.{n}")
    with httpx.Client(base_url=daemon.url, timeout=30, transport=transport) as client:
        yield client


_addresses = itertools.count(11)


@pytest.fixture
def http(daemon: DaemonProcess) -> Iterator[httpx.Client]:
    """Each test calls from an address of its own."""
    with calling_from(daemon, next(_addresses)) as client:
        yield client


def as_client(client_id: str) -> dict[str, str]:
    return {**AUTH, "X-Qwen-Client-Id": client_id}


def assert_429(response: httpx.Response, tier: str) -> None:
    assert response.status_code == 429, response.text
    body = response.json()
    assert set(body) == {"error", "code", "tier", "retryAfterMs"}
    assert body["error"] == "Rate limit exceeded"
    assert body["code"] == "rate_limit_exceeded"
    assert body["tier"] == tier
    per_token_ms = WINDOW_MS // LIMITS[tier]
    assert 0 < body["retryAfterMs"] <= per_token_ms
    assert int(response.headers["retry-after"]) == -(-body["retryAfterMs"] // 1000)
    assert response.headers["x-ratelimit-limit"] == str(LIMITS[tier])
    assert response.headers["x-ratelimit-remaining"] == "0"
    reset = int(response.headers["x-ratelimit-reset"])
    assert time.time() - 5 <= reset <= time.time() + per_token_ms / 1000 + 5


def test_read_tier_budget_then_429(http: httpx.Client) -> None:
    who = as_client("reader-1")
    for _ in range(LIMITS["read"]):
        assert http.get("/capabilities", headers=who).status_code == 200
    assert_429(http.get("/capabilities", headers=who), "read")
    assert_429(http.get("/no/such/route", headers=who), "read")  # every GET is a read


def test_401_comes_before_429_and_costs_nothing(http: httpx.Client) -> None:
    who = {"X-Qwen-Client-Id": "anon-2"}
    for _ in range(10):
        response = http.get("/capabilities", headers=who)
        assert response.status_code == 401 and response.json() == {"error": "Unauthorized"}
    # The refused requests did not spend the budget of that key.
    for _ in range(LIMITS["read"]):
        assert http.get("/capabilities", headers={**AUTH, **who}).status_code == 200
    assert_429(http.get("/capabilities", headers={**AUTH, **who}), "read")
    # And once limited, a request without the token still gets 401, not 429.
    assert http.get("/capabilities", headers=who).status_code == 401


def test_tiers_and_addresses_are_separate_buckets(
    daemon: DaemonProcess, http: httpx.Client
) -> None:
    a, b = as_client("tier-a"), as_client("tier-b")
    for _ in range(LIMITS["read"]):
        http.get("/capabilities", headers=a)
    assert_429(http.get("/capabilities", headers=a), "read")
    # Mutations of the same key have their own budget (the route answers 400 here).
    for _ in range(LIMITS["mutation"]):
        response = http.post("/session", json={"sessionScope": "bogus"}, headers=a)
        assert response.status_code == 400
    assert_429(http.post("/session", json={"sessionScope": "bogus"}, headers=a), "mutation")
    # Prompts too.
    response = http.post("/session/nope/prompt", json={}, headers=a)
    assert response.status_code in (400, 404)
    assert_429(http.post("/session/nope/prompt", json={}, headers=a), "prompt")
    # Another client id is the same key: a fresh id per request is no way around the limit.
    assert_429(http.get("/capabilities", headers=b), "read")
    # Another address is another key.
    with calling_from(daemon, 250) as elsewhere:
        assert elsewhere.get("/capabilities", headers=b).status_code == 200


def test_exempt_traffic_is_never_limited(http: httpx.Client) -> None:
    who = as_client("exempt-3")
    for _ in range(3 * LIMITS["read"]):
        assert http.get("/health", headers=who).status_code == 200
        assert http.head("/health", headers=who).status_code == 200
        assert http.post("/session/nope/heartbeat", headers=who).status_code == 404
        assert http.get("/session/nope/events", headers=who).status_code == 404
        assert http.options("/capabilities", headers=who).status_code != 429
    assert http.get("/capabilities", headers=who).status_code == 200  # budget intact


def test_429_carries_cors_headers_for_allowed_origins(http: httpx.Client) -> None:
    who = {**as_client("browser-4"), "Origin": "http://app.example.com"}
    for _ in range(LIMITS["read"]):
        http.get("/capabilities", headers=who)
    response = http.get("/capabilities", headers=who)
    assert_429(response, "read")
    assert response.headers["access-control-allow-origin"] == "http://app.example.com"
    assert response.headers["access-control-expose-headers"] == (
        "Retry-After, X-Qwen-Event-Epoch, X-Qwen-SSE-Stream-Id"
    )


def test_hits_are_counted_in_status_and_the_tag_is_advertised(
    daemon: DaemonProcess, http: httpx.Client
) -> None:
    who = as_client("counter-5")
    for _ in range(LIMITS["read"] + 2):
        http.get("/capabilities", headers=who)
    with calling_from(daemon, 251) as other:
        status = other.get("/daemon/status", headers=who)
        assert status.status_code == 200, status.text
        rate = status.json()["runtime"]["rateLimit"]
        assert rate["enabled"] is True
        assert rate["hits"]["read"] >= 2
        assert set(rate["hits"]) == {"prompt", "mutation", "read"}
        features = other.get("/capabilities", headers=who).json()["features"]
        assert "rate_limit" in features


def test_rate_limit_log_lines_never_contain_the_token(
    daemon: DaemonProcess, http: httpx.Client
) -> None:
    """The line names the key (the address), never the client id (here equal to the token)."""
    who = as_client(TOKEN)
    for _ in range(LIMITS["read"] + 1):
        http.get("/capabilities", headers=who)
    stderr = daemon.stderr()  # the line is written before the 429 is sent
    assert "rate limit exceeded: key=127.0.0." in stderr
    assert TOKEN not in stderr
