"""``ExtSupport``: which vendor methods an agent kind answers (table-driven, pure)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from serve.workspaces.state import agent_ext
from serve.workspaces.state.agent_ext import ExtSupport, agent_kind, any_live_supports

QWEN = "qwen-code@0.24.4"


@pytest.mark.parametrize(
    ("observations", "kind", "method", "verdict"),
    [
        # the known-agent table
        ([], QWEN, agent_ext.STATS, True),
        ([], "qwen-code", agent_ext.BRANCH, True),
        ([], QWEN, "qwen/status/session/unheard_of", None),
        ([], "scripted@1", agent_ext.STATS, None),
        ([], None, agent_ext.STATS, None),
        # observations win over the table and are per kind
        ([(QWEN, agent_ext.LSP, False)], QWEN, agent_ext.LSP, False),
        ([(QWEN, agent_ext.LSP, False)], "qwen-code@0.25.0", agent_ext.LSP, True),
        ([(QWEN, agent_ext.LSP, False)], QWEN, agent_ext.HOOKS, True),
        ([("scripted@1", agent_ext.STATS, False)], "scripted@1", agent_ext.STATS, False),
        ([("other@2", agent_ext.STATS, True)], "other@2", agent_ext.STATS, True),
        (
            [("other@2", agent_ext.STATS, False), ("other@2", agent_ext.STATS, True)],
            "other@2",
            agent_ext.STATS,
            True,
        ),
        # nothing is recorded for an agent without a handshake, or absurd method names
        ([(None, agent_ext.STATS, False)], None, agent_ext.STATS, None),
        ([("x@1", "m" * 300, True)], "x@1", "m" * 300, None),
    ],
)
def test_verdicts(
    observations: list[tuple[str | None, str, bool]], kind: str | None, method: str, verdict: Any
) -> None:
    support = ExtSupport()
    for k, m, supported in observations:
        support.observe(k, m, supported)
    assert support.verdict(kind, method) is verdict


def test_kinds_are_bounded_least_recently_observed_first() -> None:
    support = ExtSupport(max_kinds=2)
    support.observe("a@1", "m", False)
    support.observe("b@1", "m", False)
    support.observe("a@1", "n", False)  # a is now the most recent
    support.observe("c@1", "m", False)
    assert set(support.snapshot()) == {"a@1", "c@1"}
    assert support.verdict("b@1", "m") is None and len(support) == 3


def session(name: str | None, version: str | None = "1") -> Any:
    if name is None:
        return SimpleNamespace(conn=None)
    info = SimpleNamespace(agent_info=SimpleNamespace(name=name, version=version))
    return SimpleNamespace(conn=SimpleNamespace(info=info))


def test_agent_kind() -> None:
    assert agent_kind(session("qwen-code", "0.24.4")) == QWEN
    assert agent_kind(session("scripted", None)) == "scripted"
    assert agent_kind(session(None)) is None


class FakeDaemon:
    def __init__(self, live: list[Any]) -> None:
        self.registry = SimpleNamespace(live=lambda: list(live))


def test_tags_follow_the_live_sessions() -> None:
    live: list[Any] = []
    daemon = FakeDaemon(live)
    assert not any_live_supports(daemon, agent_ext.STATS)  # no live session, no tag
    live.append(session("scripted"))
    assert not any_live_supports(daemon, agent_ext.STATS)  # unknown agent, no tag
    agent_ext.support_for(daemon).observe("scripted@1", agent_ext.STATS, True)
    assert any_live_supports(daemon, agent_ext.STATS)  # it answered: tag
    live.append(session("qwen-code", "0.24.4"))
    assert any_live_supports(daemon, agent_ext.BRANCH)
    live.clear()
    assert not any_live_supports(daemon, agent_ext.BRANCH)
