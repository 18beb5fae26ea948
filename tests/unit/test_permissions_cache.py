"""``always_allow_for_session`` cache (binding, expiry with a fake clock) and in-flight sharing."""

from __future__ import annotations

import pytest

from serve.permissions.approval import (
    classify_write,
    decide,
    effect_fingerprint,
    policy_fingerprint,
)
from serve.permissions.cache import (
    ALWAYS_ALLOW_TTL_MS,
    ApprovalCache,
    CacheKey,
    DecisionKey,
    Existing,
    Full,
    InflightTable,
    Leader,
    cache_key,
)
from serve.permissions.config import ApprovalConfig, CapabilitiesConfig, load_permissions_config
from serve.permissions.grants import resolve_grants
from serve.permissions.terminal_guard import classify_terminal

WS = "/w"
GRANTS = resolve_grants(CapabilitiesConfig())
APPROVAL = ApprovalConfig()
FP = policy_fingerprint(GRANTS, APPROVAL, "default")
HOUR = 60 * 60 * 1000
WRITE = decide(classify_write(f"{WS}/a.py", [WS]), GRANTS, APPROVAL, "default")
PYTEST = decide(classify_terminal("pytest", cwd=None, workspace_roots=[WS]), GRANTS, APPROVAL,
                "default")  # fmt: skip


def test_ttl_is_eight_hours() -> None:
    assert ALWAYS_ALLOW_TTL_MS == 8 * HOUR


def test_cache_key_binds_session_principal_fingerprint_rule() -> None:
    key = cache_key("s1", "c-alice", FP, WRITE)
    assert key == CacheKey("s1", "c-alice", FP, "fs.write|mode:default|")
    cache = ApprovalCache()
    assert cache.remember(key, now_ms=0)
    assert cache.allowed(key, now_ms=1)
    # another file in the same class, same session, principal and policy: covered
    other_file = decide(classify_write(f"{WS}/b.py", [WS]), GRANTS, APPROVAL, "default")
    assert cache.allowed(cache_key("s1", "c-alice", FP, other_file), now_ms=1)
    # never for another principal, session, policy or rule
    for k in [
        cache_key("s1", "c-bob", FP, WRITE),
        cache_key("s2", "c-alice", FP, WRITE),
        cache_key("s1", "c-alice", policy_fingerprint(GRANTS, APPROVAL, "auto-edit"), WRITE),
        cache_key("s1", "c-alice", FP, PYTEST),
        None,
    ]:
        assert not cache.allowed(k, now_ms=1)


@pytest.mark.parametrize(
    ("elapsed_ms", "alive"),
    [(0, True), (HOUR, True), (8 * HOUR - 1, True), (8 * HOUR, False), (9 * HOUR, False)],
)
def test_expiry_after_eight_hours(elapsed_ms: int, alive: bool) -> None:
    cache = ApprovalCache()
    key = cache_key("s1", "c", FP, WRITE)
    cache.remember(key, now_ms=1_000)
    assert cache.allowed(key, now_ms=1_000 + elapsed_ms) == alive
    assert len(cache) == (1 if alive else 0)  # an expired entry is dropped on lookup


def test_remembering_again_refreshes_and_expire_sweeps() -> None:
    cache = ApprovalCache(ttl_ms=100)
    a = cache_key("s1", "c", FP, WRITE)
    b = cache_key("s1", "c", FP, PYTEST)
    cache.remember(a, now_ms=0)
    cache.remember(b, now_ms=50)
    cache.remember(a, now_ms=90)
    assert cache.expire(149) == 0
    assert cache.expire(150) == 1  # b
    assert cache.allowed(a, now_ms=189) and not cache.allowed(a, now_ms=190)


def test_invalidation_on_session_close_or_replace_and_principal_revoke() -> None:
    cache = ApprovalCache()
    keys = [cache_key(s, p, FP, WRITE) for s in ("s1", "s2") for p in ("a", "b")]
    for k in keys:
        cache.remember(k, now_ms=0)
    assert cache.invalidate_session("s1") == 2
    assert [cache.allowed(k, now_ms=1) for k in keys] == [False, False, True, True]
    assert cache.invalidate_principal("a") == 1
    assert [cache.allowed(k, now_ms=1) for k in keys] == [False, False, False, True]
    assert cache.invalidate_session("nope") == 0
    cache.clear()
    assert len(cache) == 0


def test_never_cached_for_secret_bind_or_anonymous_or_non_prompt() -> None:
    exact = load_permissions_config(
        "capabilities: {defaults: {terminal.exec: null, secret.bind:GH_TOKEN: null}}"
    ).capabilities
    secret = decide(
        classify_terminal("gh pr list", cwd=None, workspace_roots=[WS], secrets=["GH_TOKEN"]),
        resolve_grants(exact),
        APPROVAL,
        "default",
    )
    assert secret.verdict == "prompt"
    assert cache_key("s1", "c", FP, secret) is None
    cache = ApprovalCache()
    # even a hand-built key for a secret rule is refused
    assert not cache.remember(CacheKey("s1", "c", FP, secret.cache_rule), now_ms=0)
    assert not cache.remember(CacheKey("s1", "c", FP, "secret.bind:GH_TOKEN|x|"), now_ms=0)
    assert cache_key("s1", None, FP, WRITE) is None
    assert cache_key("s1", "", FP, WRITE) is None
    assert not cache.remember(None, now_ms=0)
    auto = decide(classify_write(f"{WS}/a.py", [WS]), GRANTS, APPROVAL, "auto-edit")
    assert auto.verdict == "auto" and cache_key("s1", "c", FP, auto) is None
    assert len(cache) == 0


def test_cache_is_bounded_oldest_first() -> None:
    cache = ApprovalCache(max_entries=2)
    keys = [CacheKey("s", "c", FP, f"r{i}") for i in range(3)]
    for i, k in enumerate(keys):
        cache.remember(k, now_ms=i)
    assert len(cache) == 2
    assert [cache.allowed(k, now_ms=5) for k in keys] == [False, True, True]
    with pytest.raises(ValueError):
        ApprovalCache(ttl_ms=0)


# -- in-flight sharing -----------------------------------------------------------------------


def dkey(path: str, principal: str | None = "c") -> DecisionKey:
    effect = classify_write(f"{WS}/{path}", [WS])
    return DecisionKey("s1", principal, FP, effect_fingerprint(effect))


def test_concurrent_identical_requests_share_one_decision() -> None:
    table: InflightTable[DecisionKey, str] = InflightTable()
    k = dkey("a.py")
    assert table.lookup_or_join(k, "w1") == Leader(k)
    assert dkey("a.py") == k and hash(dkey("a.py")) == hash(k)
    assert table.lookup_or_join(dkey("a.py"), "w2") == Existing(k, 1)
    assert table.lookup_or_join(k, "w3") == Existing(k, 2)
    # a different target, or another principal, is a separate decision
    assert isinstance(table.lookup_or_join(dkey("b.py"), "x1"), Leader)
    assert isinstance(table.lookup_or_join(dkey("a.py", "other"), "y1"), Leader)
    assert k in table and len(table) == 3
    assert table.finish(k) == ["w1", "w2", "w3"]
    assert k not in table
    assert table.finish(k) == []
    # after finishing, the next identical request leads a fresh decision
    assert table.lookup_or_join(k, "w4") == Leader(k)


def test_inflight_bounds() -> None:
    table: InflightTable[str, int] = InflightTable(max_keys=1, max_waiters=2)
    assert isinstance(table.lookup_or_join("a", 1), Leader)
    assert isinstance(table.lookup_or_join("a", 2), Existing)
    assert table.lookup_or_join("a", 3) == Full("a", "too_many_waiters")
    assert table.lookup_or_join("b", 1) == Full("b", "too_many_keys")
    assert table.finish("a") == [1, 2]


def test_inflight_leave_hands_leadership_on() -> None:
    table: InflightTable[str, str] = InflightTable()
    table.lookup_or_join("k", "lead")
    table.lookup_or_join("k", "w")
    table.leave("k", "lead")
    assert table.leader_of("k") == "w"
    table.leave("k", "ghost")  # unknown waiter: no-op
    table.leave("k", "w")
    assert "k" not in table and table.leader_of("k") is None
    table.leave("k", "w")  # unknown key: no-op
