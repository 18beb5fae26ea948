"""The pure parts: roles, quotas, the tokens file, the audit log's rotation and paging."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import msgspec
import pytest
import trio

from serve.access import OPERATOR, Principal, SessionAccess, role_of
from serve.access.audit import KEEP_FILES, AuditLog
from serve.access.config import AccessConfig, may_use, role_in
from serve.access.errors import PrincipalBudgetExhausted, QuotaExceeded
from serve.access.quotas import Quotas
from serve.http.security.principals import (
    RELOAD_CHECK_S,
    TokensFile,
    bearer_credential,
    parse_tokens,
)

ALICE = Principal("alice", "jwt", ("user",), ("dev",))
BOB = Principal("bob", "jwt", ("user",), ("ops",))
ROOT = Principal("root", "token", ("admin",))


def test_roles() -> None:
    access = SessionAccess("alice", {"group:ops": "observer", "carl": "collaborator"})
    assert role_of(access, ALICE) == "owner"
    assert role_of(access, BOB) == "observer"
    assert role_of(access, ROOT) == "owner"
    assert role_of(access, OPERATOR) == "owner"
    assert role_of(access, Principal("carl", "jwt")) == "collaborator"
    assert role_of(access, Principal("dan", "jwt")) is None
    assert role_of(access, Principal("dan", "jwt", groups=("dev",)), {"dev": "observer"}) == (
        "observer"
    )


def test_workspace_rules_and_role_in() -> None:
    """A listed workspace (however its path is spelled in the config) is used only by its
    principals, groups and admins; an unlisted one by everyone; a role on a session in a
    workspace the principal may not use is none."""
    config = msgspec.convert(
        {
            "workspaces": {"/srv/a/": ["alice"], "/srv//b": ["group:ops"]},
            "sessionGroups": {"dev": "collaborator"},
        },
        AccessConfig,
    )
    assert may_use(config, ALICE, "/srv/a") and not may_use(config, BOB, "/srv/a")
    assert may_use(config, BOB, "/srv/b") and not may_use(config, ALICE, "/srv/b")
    assert may_use(config, ROOT, "/srv/b") and may_use(config, BOB, "/srv/elsewhere")
    access = SessionAccess("carl", {"bob": "observer"})
    assert role_in(config, ALICE, access, "/srv/a") == "collaborator"  # by the dev group
    assert role_in(config, BOB, access, "/srv/b") == "observer"
    assert role_in(config, BOB, access, "/srv/a") is None  # not its workspace
    assert role_in(config, ALICE, access, "/srv/b") is None


def test_prompt_quota_is_a_sliding_minute_per_principal() -> None:
    quotas = Quotas(0, 2)
    quotas.take_prompt(ALICE, now=0.0)
    quotas.take_prompt(ALICE, now=1.0)
    with pytest.raises(QuotaExceeded) as refused:
        quotas.take_prompt(ALICE, now=30.0)
    assert refused.value.retry_after_s == 30
    quotas.take_prompt(BOB, now=30.0)  # its own window
    quotas.take_prompt(ROOT, now=30.0)  # admins are exempt
    quotas.take_prompt(ALICE, now=60.5)  # the first one left the window


def test_budget_quota_sums_what_it_is_given() -> None:
    quotas = Quotas(0, 0, tokens=100, cost=1.5)
    quotas.check_budget(ALICE, 99, 1.0)
    with pytest.raises(PrincipalBudgetExhausted) as spent:
        quotas.check_budget(ALICE, 100, 0.0)
    assert spent.value.body()["dimension"] == "token"
    with pytest.raises(PrincipalBudgetExhausted):
        quotas.check_budget(ALICE, 0, 1.5)
    quotas.check_budget(ROOT, 10**9, 10**9)


def test_budget_quota_adds_what_ended_sessions_spent_within_a_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    quotas = Quotas(0, 0, tokens=100, cost=1.5)
    quotas.retired(ALICE.id, 60, 0.5)
    quotas.retired(ALICE.id, 30, 0.5)  # a second ended session adds up
    quotas.check_budget(ALICE, 9, 0.0)  # 99 tokens, 1.0 spent
    with pytest.raises(PrincipalBudgetExhausted):
        quotas.check_budget(ALICE, 10, 0.0)
    with pytest.raises(PrincipalBudgetExhausted):
        quotas.check_budget(ALICE, 0, 0.5)
    quotas.check_budget(BOB, 99, 1.0)  # its own sum
    monkeypatch.setattr("serve.access.quotas.MAX_PRINCIPALS", 2)
    quotas.retired(BOB.id, 1, 0.0)
    quotas.retired("carol", 1, 0.0)  # a third principal: the least recently charged goes
    quotas.check_budget(ALICE, 99, 1.0)
    assert not Quotas(0, 0).budgets  # without budgets nothing is kept
    unbudgeted = Quotas(0, 0)
    unbudgeted.retired(ALICE.id, 10**9, 0.0)
    assert not unbudgeted._retired


def test_tokens_file_and_credentials() -> None:
    digest = hashlib.sha256(b"secret").hexdigest()
    table = parse_tokens(
        json.dumps({"id": "1", "sha256": digest, "principal": "ci", "roles": ["admin"]}).encode()
    )
    assert table[digest] == Principal("ci", "token", ("admin",))
    for bad in (
        [{"sha256": "x", "principal": "a"}],
        [{"sha256": digest, "principal": "operator"}],
        [{"sha256": digest, "principal": "a", "roles": ["root"]}],
    ):
        with pytest.raises(ValueError):
            parse_tokens(json.dumps(bad).encode())
    assert bearer_credential(["Bearer abc"], []) == "abc"
    assert bearer_credential(["Basic abc"], []) is None
    assert bearer_credential(["Bearer a", "Bearer b"], []) is None
    assert bearer_credential([], ["  tok "]) == "tok"


async def test_audit_log_rotates_within_its_bound_and_pages(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(str(path), max_bytes=4096)
    async with trio.open_nursery() as nursery:
        await nursery.start(log.run)
        for n in range(400):
            log.record(principal=f"p{n}", outcome="denied", status=403)
            if n % 50 == 0:
                await trio.sleep(0.01)  # let the actor write batches
        with trio.fail_after(10):
            while log.written + log.dropped < 400:  # noqa: ASYNC110 (the actor's counters)
                await trio.sleep(0.01)
        page = await log.page(10, None)
        assert [e["principal"] for e in page.entries] == [f"p{n}" for n in range(399, 389, -1)]
        assert page.next_before is not None
        older = await log.page(5, page.next_before)
        assert older.entries[0]["seq"] < page.entries[-1]["seq"]
        log.close()
    assert log.dropped == 0
    sizes = [
        f.stat().st_size for f in await trio.to_thread.run_sync(lambda: list(tmp_path.iterdir()))
    ]
    assert len(sizes) == KEEP_FILES + 1  # the live file and its rotated ones, no more
    assert all(0 < size <= 4096 for size in sizes)


async def test_tokens_file_is_reloaded_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "tokens.jsonl"

    def write(*names: str, mtime: int) -> None:
        lines = [
            json.dumps({"sha256": hashlib.sha256(n.encode()).hexdigest(), "principal": n})
            for n in names
        ]
        path.write_text("\n".join(lines) + "\n")
        os.utime(path, (mtime, mtime))

    await trio.to_thread.run_sync(lambda: write("ann", mtime=1_000_000))
    tokens = TokensFile(str(path))
    assert await tokens.lookup("ann") == Principal("ann", "token")
    assert await tokens.lookup("ben") is None
    await trio.to_thread.run_sync(lambda: write("ben", mtime=2_000_000))
    await trio.sleep(RELOAD_CHECK_S)  # looked at no more often than this
    assert await tokens.lookup("ben") == Principal("ben", "token")
    assert await tokens.lookup("ann") is None  # revoked
    await trio.to_thread.run_sync(lambda: path.write_text("not json"))
    await trio.sleep(RELOAD_CHECK_S)
    assert await tokens.lookup("ben") is None  # a bad file accepts nothing (fail closed)
    assert (tokens.state, tokens.usable) == ("malformed", False)


def test_owner_records_are_bounded_by_count_and_bytes() -> None:
    from serve.access.owner_records import RECORD_OVERHEAD_BYTES, OwnerRecords
    from serve.access.roles import to_attr

    records = OwnerRecords(limit=3, max_bytes=10_000)
    for n in range(5):
        records.keep(f"s{n}", SessionAccess(f"p{n}"))
    assert [records.get(f"s{n}") for n in range(5)] == [
        None,
        None,
        SessionAccess("p2"),
        SessionAccess("p3"),
        SessionAccess("p4"),
    ]
    records.keep("s2", SessionAccess("p2", {"x": "observer"}))  # kept again: the newest
    records.keep("s5", SessionAccess("p5"))
    assert records.get("s3") is None and records.get("s2") is not None
    big = SessionAccess("owner", {f"member-{n:04d}-" + "x" * 200: "observer" for n in range(40)})
    cost = len("big") + len(to_attr(big)) + RECORD_OVERHEAD_BYTES
    records = OwnerRecords(limit=3, max_bytes=cost + RECORD_OVERHEAD_BYTES)
    records.keep("s0", SessionAccess("p0"))
    records.keep("big", big)  # the older record goes to make room
    assert records.get("big") == big and records.get("s0") is None
    assert records.bytes == cost
    records.keep("huge", SessionAccess("o", {"m" * (cost + 1): "observer"}))
    assert len(records) == 0 and records.bytes == 0  # larger than the bound: not kept
