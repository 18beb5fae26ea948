"""The approval-mode table (serve/permissions/modes.py): agent ids, qwen names, refusals."""

from __future__ import annotations

import pytest

from acp.schema import SessionConfigOption, SessionMode, SessionModeState, SessionSetup
from serve.permissions.modes import (
    APPROVAL_MODES,
    AgentModes,
    UnknownApprovalMode,
    advertised_modes,
    allowed_modes,
    qwen_equivalent,
    resolve_mode,
)

AGENTS = {
    "qwen": ["plan", "default", "auto-edit", "auto", "yolo"],
    "claude": ["default", "acceptEdits", "plan", "dontAsk", "bypassPermissions"],
    "gemini": ["default", "autoEdit", "yolo", "plan"],
    "codex": ["read-only", "auto", "full-access"],
    "opencode": ["build", "plan"],
}
# The module docstring's table, row by row (None: 400).
TABLE = {
    "plan": {"qwen": "plan", "claude": "plan", "gemini": "plan", "codex": None, "opencode": "plan"},
    "default": {
        "qwen": "default",
        "claude": "default",
        "gemini": "default",
        "codex": "read-only",
        "opencode": "build",
    },
    "auto-edit": {
        "qwen": "auto-edit",
        "claude": "acceptEdits",
        "gemini": "autoEdit",
        "codex": "auto",
        "opencode": None,
    },
    "auto": {"qwen": "auto", "claude": None, "gemini": None, "codex": "auto", "opencode": None},
    "yolo": {
        "qwen": "yolo",
        "claude": "bypassPermissions",
        "gemini": "yolo",
        "codex": "full-access",
        "opencode": None,
    },
}


def acp_modes(ids: list[str], current: str | None = None) -> AgentModes:
    setup = SessionSetup(
        modes=SessionModeState(
            current_mode_id=current or ids[0],
            available_modes=[SessionMode(id=i, name=i.title()) for i in ids],
        )
    )
    return advertised_modes(setup)


def option(ids: list[str], current: str, category: str = "mode") -> SessionConfigOption:
    return SessionConfigOption(
        id=category,
        name=category.title(),
        type="select",
        category=category,
        current_value=current,
        options=[{"value": i, "name": i.title()} for i in ids],
    )


@pytest.mark.parametrize("qwen_name", APPROVAL_MODES)
@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_the_table(qwen_name: str, agent: str) -> None:
    modes = acp_modes(AGENTS[agent])
    expected = TABLE[qwen_name][agent]
    if expected is None:
        with pytest.raises(UnknownApprovalMode) as exc_info:
            resolve_mode(qwen_name, modes)
        assert exc_info.value.allowed[: len(AGENTS[agent])] == AGENTS[agent]
        assert qwen_name not in exc_info.value.allowed
    else:
        assert resolve_mode(qwen_name, modes) == expected
        assert qwen_equivalent(expected) == qwen_name or expected == "auto"


@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_the_agents_own_ids_are_taken_as_they_are(agent: str) -> None:
    modes = acp_modes(AGENTS[agent])
    for mode_id in AGENTS[agent]:
        assert resolve_mode(mode_id, modes) == mode_id


def test_refusal_lists_the_agent_ids_then_the_names_that_map() -> None:
    with pytest.raises(UnknownApprovalMode) as exc_info:
        resolve_mode("yolo", acp_modes(AGENTS["opencode"]))
    assert exc_info.value.allowed == ["build", "plan", "default"]
    assert allowed_modes(acp_modes(AGENTS["claude"])) == [
        *AGENTS["claude"],
        "auto-edit",
        "yolo",
    ]
    with pytest.raises(UnknownApprovalMode):
        resolve_mode("Default", acp_modes(AGENTS["claude"]))  # ids are case-sensitive


def test_a_mode_config_option_wins_over_acp_modes() -> None:
    setup = SessionSetup(
        modes=SessionModeState(
            current_mode_id="x", available_modes=[SessionMode(id="x", name="X")]
        ),
        config_options=[option(["build", "plan"], "plan"), option(["m1"], "m1", "model")],
    )
    modes = advertised_modes(setup)
    assert (modes.source, modes.ids, modes.current, modes.config_id) == (
        "config",
        ["build", "plan"],
        "plan",
        "mode",
    )
    # The live list (after config_option_update) replaces the set-up result's.
    live = advertised_modes(setup, [option(["build", "plan"], "build")])
    assert live.current == "build"
    # A model option alone is no mode option: the ACP modes stay.
    assert advertised_modes(setup, [option(["m1"], "m1", "model")]).ids == ["x"]


def test_grouped_option_values_are_modes_too() -> None:
    grouped = SessionConfigOption(
        id="agent",
        name="Agent",
        type="select",
        category="mode",
        current_value="build",
        options=[
            {"group": "primary", "name": "Primary", "options": [{"value": "build", "name": "B"}]}
        ],
    )
    assert advertised_modes(None, [grouped]).ids == ["build"]


def test_an_agent_without_modes_gets_only_qwen_names_forwarded() -> None:
    modes = advertised_modes(SessionSetup())
    assert modes.source == "none"
    assert resolve_mode("plan", modes) == "plan"
    with pytest.raises(UnknownApprovalMode) as exc_info:
        resolve_mode("acceptEdits", modes)
    assert exc_info.value.allowed == list(APPROVAL_MODES)


def test_qwen_equivalent_for_the_effect_gate() -> None:
    assert qwen_equivalent("acceptEdits") == "auto-edit"
    assert qwen_equivalent("bypassPermissions") == "yolo"
    assert qwen_equivalent("build") == "default"
    assert qwen_equivalent("dontAsk") == "default"  # no qwen name: the default policy
    assert qwen_equivalent(None) == "default"
    assert qwen_equivalent("plan") == "plan"
