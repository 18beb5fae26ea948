"""Rate limiter: classification, keys, exact token-bucket arithmetic on a fake clock."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import msgspec
import pytest

from serve.ratelimit import (
    LOG_EVERY_REJECTIONS,
    SWEEP_EVERY_REQUESTS,
    InvalidRateLimitConfig,
    RateLimitConfig,
    RateLimiter,
    Tier,
    classify,
    client_key,
    rate_limit_config_from,
)


class FakeClock:
    def __init__(self, start: int = 1_000_000) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


WALL_START = 1_700_000_000_000


def make(
    *, prompt: int = 10, mutation: int = 30, read: int = 120, window_ms: int = 60_000, **kw: int
) -> tuple[RateLimiter, FakeClock, FakeClock]:
    clock, wall = FakeClock(), FakeClock(WALL_START)
    config = RateLimitConfig(
        enabled=True, prompt=prompt, mutation=mutation, read=read, window_ms=window_ms
    )
    return RateLimiter(config, clock=clock, wall_clock=wall, **kw), clock, wall


# --------------------------------------------------------------------------- classify

CLASSIFY_CASES = [
    # exempt
    ("OPTIONS", "/session/abc/prompt", None),
    ("OPTIONS", "/anything", None),
    ("GET", "/health", None),
    ("HEAD", "/health", None),
    ("GET", "/health/", None),
    ("POST", "/health", Tier.MUTATION),
    ("POST", "/session/abc/heartbeat", None),
    ("POST", "/session/abc/heartbeat/", None),
    ("GET", "/session/abc/heartbeat", Tier.READ),
    ("GET", "/session/abc/events", None),
    ("GET", "/session/abc/events/", None),
    ("POST", "/session/abc/events", Tier.MUTATION),
    ("HEAD", "/session/abc/events", Tier.READ),
    ("GET", "/acp", None),
    ("POST", "/acp", None),
    ("DELETE", "/acp/", None),
    ("POST", "/acp/anything/below", None),
    ("POST", "/acpx", Tier.MUTATION),
    ("POST", "/workspaces/w1/acp", Tier.MUTATION),  # only with workspace_acp
    # prompt
    ("POST", "/session/abc/prompt", Tier.PROMPT),
    ("POST", "/session/abc/prompt/", Tier.PROMPT),
    ("POST", "/session/abc/prompt//", Tier.PROMPT),
    ("GET", "/session/abc/prompt", Tier.READ),
    ("POST", "/session//prompt", Tier.MUTATION),  # empty id segment is not a session
    ("POST", "/session/a/b/prompt", Tier.MUTATION),
    ("POST", "/sessions/abc/prompt", Tier.MUTATION),
    # read
    ("GET", "/capabilities", Tier.READ),
    ("HEAD", "/capabilities", Tier.READ),
    ("GET", "/", Tier.READ),
    ("POST", "/sessions/catalog", Tier.READ),
    ("POST", "/sessions/catalog/", Tier.READ),
    ("GET", "/daemon/status", Tier.READ),
    # mutation
    ("POST", "/session", Tier.MUTATION),
    ("DELETE", "/session/abc", Tier.MUTATION),
    ("PATCH", "/session/abc/metadata", Tier.MUTATION),
    ("PUT", "/x", Tier.MUTATION),
    ("POST", "/file/write", Tier.MUTATION),
    ("get", "/capabilities", Tier.MUTATION),  # methods are case-sensitive
    ("options", "/x", Tier.MUTATION),
    ("POST", "/sessions/catalogue", Tier.MUTATION),
]


@pytest.mark.parametrize(("method", "path", "tier"), CLASSIFY_CASES)
def test_classify(method: str, path: str, tier: Tier | None) -> None:
    assert classify(method, path) is tier


@pytest.mark.parametrize(
    ("method", "path", "tier"),
    [
        ("POST", "/workspaces/w1/acp", None),
        ("GET", "/workspaces/w1/acp/", None),
        ("POST", "/workspaces/w1/acp/x", None),
        ("POST", "/workspaces//acp", Tier.MUTATION),
        ("POST", "/workspaces/w1/acpx", Tier.MUTATION),
    ],
)
def test_classify_workspace_acp(method: str, path: str, tier: Tier | None) -> None:
    assert classify(method, path, workspace_acp=True) is tier


# --------------------------------------------------------------------------- client keys

KEY_CASES = [
    ("127.0.0.1", "127.0.0.1"),
    ("10.1.2.3", "10.1.2.3"),
    ("::ffff:10.1.2.3", "10.1.2.3"),
    ("::FFFF:10.1.2.3", "10.1.2.3"),
    ("2001:db8::1", "2001:db8::1"),
    (None, "unknown"),
]


@pytest.mark.parametrize(("ip", "key"), KEY_CASES)
def test_client_key(ip: str | None, key: str) -> None:
    """The key is the address alone: no client-chosen header can mint a fresh bucket."""
    assert client_key(peer_ip=ip) == key


# --------------------------------------------------------------------------- config


def test_config_defaults() -> None:
    config = RateLimitConfig()
    assert (config.enabled, config.prompt, config.mutation, config.read, config.window_ms) == (
        False,
        10,
        30,
        120,
        60_000,
    )
    assert [config.limit(t) for t in Tier] == [10, 30, 120]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"prompt": 0},
        {"mutation": -1},
        {"read": 0},
        {"prompt": True},
        {"window_ms": 999},
        {"window_ms": 0},
    ],
)
def test_config_rejects(kwargs: dict[str, int]) -> None:
    with pytest.raises(InvalidRateLimitConfig):
        RateLimitConfig(**kwargs)  # type: ignore[arg-type]


def test_config_accepts_minimum_window() -> None:
    assert RateLimitConfig(window_ms=1000).window_ms == 1000


@pytest.mark.parametrize(
    ("env", "flags", "expected"),
    [
        ({}, {}, RateLimitConfig()),
        ({"QWEN_SERVE_RATE_LIMIT": "1"}, {}, RateLimitConfig(enabled=True)),
        ({"QWEN_SERVE_RATE_LIMIT": "true"}, {}, RateLimitConfig(enabled=True)),
        ({"QWEN_SERVE_RATE_LIMIT": "TRUE"}, {}, RateLimitConfig(enabled=True)),
        ({"QWEN_SERVE_RATE_LIMIT": "0"}, {}, RateLimitConfig()),
        ({"QWEN_SERVE_RATE_LIMIT": "yes"}, {}, RateLimitConfig()),
        ({"QWEN_SERVE_RATE_LIMIT": "1"}, {"enabled": False}, RateLimitConfig()),
        ({}, {"enabled": True}, RateLimitConfig(enabled=True)),
        (
            {
                "QWEN_SERVE_RATE_LIMIT_PROMPT": "5",
                "QWEN_SERVE_RATE_LIMIT_MUTATION": " 7 ",
                "QWEN_SERVE_RATE_LIMIT_READ": "9",
                "QWEN_SERVE_RATE_LIMIT_WINDOW_MS": "1000",
            },
            {},
            RateLimitConfig(prompt=5, mutation=7, read=9, window_ms=1000),
        ),
        (
            {"QWEN_SERVE_RATE_LIMIT_PROMPT": "5", "QWEN_SERVE_RATE_LIMIT_WINDOW_MS": "5000"},
            {"prompt": 3, "window_ms": 2000},
            RateLimitConfig(prompt=3, window_ms=2000),
        ),
        ({"QWEN_SERVE_RATE_LIMIT_READ": ""}, {}, RateLimitConfig()),
    ],
)
def test_config_from_env_and_flags(
    env: dict[str, str], flags: dict[str, int | bool], expected: RateLimitConfig
) -> None:
    assert rate_limit_config_from(env, **flags) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("env", "flags", "named"),
    [
        ({"QWEN_SERVE_RATE_LIMIT_PROMPT": "0"}, {}, 'QWEN_SERVE_RATE_LIMIT_PROMPT="0"'),
        ({"QWEN_SERVE_RATE_LIMIT_READ": "ten"}, {}, 'QWEN_SERVE_RATE_LIMIT_READ="ten"'),
        ({"QWEN_SERVE_RATE_LIMIT_MUTATION": "1.5"}, {}, "QWEN_SERVE_RATE_LIMIT_MUTATION"),
        ({"QWEN_SERVE_RATE_LIMIT_MUTATION": "-3"}, {}, "QWEN_SERVE_RATE_LIMIT_MUTATION"),
        ({"QWEN_SERVE_RATE_LIMIT_WINDOW_MS": "999"}, {}, "QWEN_SERVE_RATE_LIMIT_WINDOW_MS"),
        ({"QWEN_SERVE_RATE_LIMIT_PROMPT": "٣"}, {}, "QWEN_SERVE_RATE_LIMIT_PROMPT"),
        ({}, {"prompt": 0}, "prompt"),
        ({}, {"window_ms": 500}, "window"),
    ],
)
def test_config_from_rejects_naming_the_value(
    env: dict[str, str], flags: dict[str, int], named: str
) -> None:
    with pytest.raises(InvalidRateLimitConfig, match=None) as info:
        rate_limit_config_from(env, **flags)  # type: ignore[arg-type]
    assert named in str(info.value)


# --------------------------------------------------------------------------- buckets


def test_new_bucket_starts_full_then_refuses() -> None:
    limiter, _, _ = make(prompt=10)
    decisions = [limiter.check("k", Tier.PROMPT) for _ in range(11)]
    assert [d.allowed for d in decisions] == [True] * 10 + [False]
    assert [d.remaining for d in decisions[:10]] == list(range(9, -1, -1))
    refused = decisions[-1]
    assert refused.reason == "limited"
    # retryAfterMs = ceil((1 - 0) / (10 / 60000)) = 6000
    assert refused.retry_after_ms == 6000
    assert refused.limit == 10


def test_continuous_refill_exact_boundaries() -> None:
    limiter, clock, _ = make(prompt=10)  # one token per 6000 ms
    for _ in range(10):
        assert limiter.check("k", Tier.PROMPT).allowed
    clock.advance(3000)  # half a token
    half = limiter.check("k", Tier.PROMPT)
    assert not half.allowed and half.retry_after_ms == 3000
    clock.advance(2999)
    almost = limiter.check("k", Tier.PROMPT)
    assert not almost.allowed and almost.retry_after_ms == 1
    clock.advance(1)
    assert limiter.check("k", Tier.PROMPT).allowed
    refused = limiter.check("k", Tier.PROMPT)
    assert not refused.allowed and refused.retry_after_ms == 6000


def test_retry_after_rounds_up_for_uneven_rates() -> None:
    limiter, clock, _ = make(mutation=7, window_ms=1000)  # 7 tokens per 1000 ms
    for _ in range(7):
        assert limiter.check("k", Tier.MUTATION).allowed
    refused = limiter.check("k", Tier.MUTATION)
    assert refused.retry_after_ms == math.ceil(1000 / 7)  # 143
    clock.advance(142)
    assert not limiter.check("k", Tier.MUTATION).allowed
    clock.advance(1)
    assert limiter.check("k", Tier.MUTATION).allowed


def test_refill_is_capped_at_capacity() -> None:
    limiter, clock, _ = make(prompt=3, window_ms=1000)
    for _ in range(3):
        limiter.check("k", Tier.PROMPT)
    clock.advance(10 * 60_000)
    assert [limiter.check("k", Tier.PROMPT).allowed for _ in range(4)] == [True] * 3 + [False]


def test_clock_going_backwards_refills_nothing() -> None:
    limiter, clock, _ = make(prompt=1, window_ms=1000)
    assert limiter.check("k", Tier.PROMPT).allowed
    clock.advance(-5000)
    refused = limiter.check("k", Tier.PROMPT)
    assert not refused.allowed and refused.retry_after_ms == 1000
    clock.advance(5000 + 999)  # back to 999 ms after the last real refill point
    assert not limiter.check("k", Tier.PROMPT).allowed
    clock.advance(1)
    assert limiter.check("k", Tier.PROMPT).allowed


def test_buckets_are_per_key_and_per_tier() -> None:
    limiter, _, _ = make(prompt=1, mutation=1, read=1)
    assert limiter.check("a", Tier.PROMPT).allowed
    assert not limiter.check("a", Tier.PROMPT).allowed
    assert limiter.check("a", Tier.MUTATION).allowed
    assert limiter.check("a", Tier.READ).allowed
    assert limiter.check("b", Tier.PROMPT).allowed


def test_disabled_and_exempt_and_draining_pass_uncounted() -> None:
    off = RateLimiter(RateLimitConfig(prompt=1))
    assert all(off.check("k", Tier.PROMPT).allowed for _ in range(5))
    assert off.check("k", Tier.PROMPT).reason == "disabled"
    limiter, _, _ = make(prompt=1)
    assert limiter.check("k", None).reason == "exempt"
    limiter.set_draining(True)
    assert [limiter.check("k", Tier.PROMPT).reason for _ in range(3)] == ["draining"] * 3
    limiter.set_draining(False)
    assert limiter.check("k", Tier.PROMPT).allowed
    assert not limiter.check("k", Tier.PROMPT).allowed
    assert limiter.statistics().requests == 2


def test_hits_counted_per_tier() -> None:
    limiter, _, _ = make(prompt=1, mutation=2, read=1)
    for _ in range(3):
        limiter.check("k", Tier.PROMPT)
    for _ in range(5):
        limiter.check("k", Tier.MUTATION)
    limiter.check("k", Tier.READ)
    limiter.check("k", None)
    assert limiter.hits() == {"prompt": 2, "mutation": 3, "read": 0}
    assert limiter.statistics().hits == limiter.hits()


def test_rejection_headers_and_body() -> None:
    limiter, _, wall = make(prompt=10)
    wall.now = 1_700_000_000_500
    for _ in range(10):
        limiter.check("k", Tier.PROMPT)
    refused = limiter.check("k", Tier.PROMPT)
    assert dict(refused.headers()) == {
        "Retry-After": "6",
        "X-RateLimit-Limit": "10",
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": str(math.ceil((1_700_000_000_500 + 6000) / 1000)),
    }
    body = refused.body()
    assert body is not None
    assert body.encode() == (
        b'{"error":"Rate limit exceeded","code":"rate_limit_exceeded",'
        b'"tier":"prompt","retryAfterMs":6000}'
    )
    assert msgspec.to_builtins(body) == {
        "error": "Rate limit exceeded",
        "code": "rate_limit_exceeded",
        "tier": "prompt",
        "retryAfterMs": 6000,
    }
    allowed = make()[0].check("k", Tier.READ)
    assert allowed.headers() == () and allowed.body() is None


@pytest.mark.parametrize(
    ("retry_ms", "retry_after"), [(1, "1"), (999, "1"), (1000, "1"), (1001, "2"), (6000, "6")]
)
def test_retry_after_header_rounds_up(retry_ms: int, retry_after: str) -> None:
    limiter, clock, _ = make(prompt=1, window_ms=6000)
    limiter.check("k", Tier.PROMPT)
    clock.advance(6000 - retry_ms)
    refused = limiter.check("k", Tier.PROMPT)
    assert refused.retry_after_ms == retry_ms
    assert dict(refused.headers())["Retry-After"] == retry_after


def test_rejection_log_sampling() -> None:
    limiter, _, _ = make(prompt=1)
    limiter.check("k", Tier.PROMPT)
    flags = [limiter.check("k", Tier.PROMPT).log for _ in range(2 * LOG_EVERY_REJECTIONS + 1)]
    assert [i for i, f in enumerate(flags) if f] == [0, LOG_EVERY_REJECTIONS, 200]
    # another bucket has its own counter
    limiter.check("other", Tier.PROMPT)
    assert limiter.check("other", Tier.PROMPT).log


def test_key_table_is_bounded_and_fails_open() -> None:
    limiter, _, _ = make(prompt=1, max_keys=3)
    for key in ("a", "b", "c"):
        assert limiter.check(key, Tier.PROMPT).allowed
    first = limiter.check("d", Tier.PROMPT)
    assert first.allowed and first.reason == "table_full" and first.log
    again = limiter.check("d", Tier.PROMPT)
    assert again.allowed and again.reason == "table_full" and not again.log
    # existing keys are still limited
    assert not limiter.check("a", Tier.PROMPT).allowed
    stats = limiter.statistics()
    assert (stats.keys, stats.max_keys, stats.fail_open) == (3, 3, 2)


def test_default_key_cap_is_ten_thousand() -> None:
    limiter, _, _ = make(read=1)
    for i in range(10_000):
        limiter.check(f"k{i}", Tier.READ)
    assert limiter.statistics().keys == 10_000
    assert limiter.check("one-more", Tier.READ).reason == "table_full"


def test_sweep_drops_buckets_idle_for_two_windows() -> None:
    limiter, clock, _ = make(prompt=1, window_ms=1000, max_keys=2)
    limiter.check("old", Tier.PROMPT)
    clock.advance(1500)
    limiter.check("recent", Tier.PROMPT)
    clock.advance(499)
    assert limiter.sweep() == 0
    clock.advance(1)  # "old" untouched for exactly 2000 ms
    assert limiter.sweep() == 1
    assert limiter.statistics().keys == 1
    assert limiter.check("new", Tier.PROMPT).reason == "ok"  # room again


def test_refused_requests_keep_a_bucket_fresh() -> None:
    limiter, clock, _ = make(prompt=1, window_ms=1000)
    limiter.check("k", Tier.PROMPT)
    clock.advance(1999)
    limiter.check("k", Tier.PROMPT)  # touch (allowed again after refill)
    clock.advance(1999)
    assert limiter.sweep() == 0


def test_automatic_sweep_every_thousand_requests() -> None:
    limiter, clock, _ = make(read=SWEEP_EVERY_REQUESTS * 2, window_ms=1000)
    limiter.check("stale", Tier.READ)
    clock.advance(2000)
    for _ in range(SWEEP_EVERY_REQUESTS - 2):
        limiter.check("busy", Tier.READ)
    assert limiter.statistics().keys == 2
    limiter.check("busy", Tier.READ)  # the 1000th counted request sweeps
    assert limiter.statistics().keys == 1


def test_check_request_combines_classify_and_key() -> None:
    limiter, _, _ = make(prompt=1)
    args = {"peer_ip": "127.0.0.1"}
    assert limiter.check_request("POST", "/session/s/prompt", **args).allowed  # type: ignore[arg-type]
    refused = limiter.check_request("POST", "/session/other/prompt/", **args)  # type: ignore[arg-type]
    assert not refused.allowed and refused.tier is Tier.PROMPT
    assert limiter.check_request("GET", "/health", **args).reason == "exempt"  # type: ignore[arg-type]
    other = {"peer_ip": "127.0.0.2"}
    assert limiter.check_request("POST", "/session/s/prompt", **other).allowed  # type: ignore[arg-type]


def test_matches_exact_rational_model() -> None:
    """A seeded random schedule agrees with a Fraction-based reference bucket."""
    rng = random.Random(20240505)
    for _ in range(20):
        limit = rng.randint(1, 50)
        window = rng.randint(1000, 90_000)
        limiter, clock, _ = make(mutation=limit, window_ms=window)
        tokens, last = Fraction(limit), clock.now
        rate = Fraction(limit, window)
        for _ in range(300):
            clock.advance(rng.choice([0, 0, 1, rng.randint(0, window // limit + 2)]))
            tokens = min(Fraction(limit), tokens + (clock.now - last) * rate)
            last = clock.now
            decision = limiter.check("k", Tier.MUTATION)
            if tokens >= 1:
                tokens -= 1
                assert decision.allowed and decision.remaining == math.floor(tokens)
            else:
                assert not decision.allowed
                assert decision.retry_after_ms == math.ceil((1 - tokens) / rate)
