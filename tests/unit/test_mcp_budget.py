"""Budget admission, the 75 %/37.5 % warning latch, and the budget cell."""

from __future__ import annotations

import pytest

from serve.mcp.budget import (
    BudgetPolicy,
    WarningLatch,
    admit,
    budget_cell,
    refused_batch_event,
    warning_event,
)

NAMES = ("a", "b", "c", "d")


@pytest.mark.parametrize(
    ("policy", "admitted", "refused"),
    [
        (BudgetPolicy(None, "off"), NAMES, ()),
        (BudgetPolicy(2, "off"), NAMES, ()),
        (BudgetPolicy(2, "warn"), NAMES, ()),
        (BudgetPolicy(2, "enforce"), ("a", "b"), ("c", "d")),
        (BudgetPolicy(4, "enforce"), NAMES, ()),
        (BudgetPolicy(9, "enforce"), NAMES, ()),
        (BudgetPolicy(1, "enforce"), ("a",), ("b", "c", "d")),
    ],
)
def test_admission_follows_declaration_order(
    policy: BudgetPolicy, admitted: tuple[str, ...], refused: tuple[str, ...]
) -> None:
    result = admit(NAMES, policy)
    assert result.admitted == admitted
    assert result.refused == refused


@pytest.mark.parametrize(
    ("budget", "counts", "fires"),
    [
        # budget 8: 75 % = 6, re-arm below 3.
        (8, [1, 2, 5, 6], [False, False, False, True]),
        (8, [6, 7, 8, 6, 7], [True, False, False, False, False]),  # once per crossing
        (8, [6, 4, 3, 6], [True, False, False, False]),  # 3/8 = 37.5 % is not below
        (8, [6, 2, 6], [True, False, True]),  # re-armed below 37.5 %
        (8, [6, 0, 1, 7], [True, False, False, True]),
        (4, [3, 1, 3], [True, False, True]),
        (2, [1, 2, 0, 2], [False, True, False, True]),
    ],
)
def test_warning_latch_hysteresis(budget: int, counts: list[int], fires: list[bool]) -> None:
    latch = WarningLatch()
    policy = BudgetPolicy(budget, "warn")
    assert [latch.observe(n, policy) for n in counts] == fires


@pytest.mark.parametrize("policy", [BudgetPolicy(None, "warn"), BudgetPolicy(2, "off")])
def test_latch_is_silent_without_an_active_budget(policy: BudgetPolicy) -> None:
    latch = WarningLatch()
    assert [latch.observe(n, policy) for n in (0, 5, 0, 5)] == [False] * 4


def test_latch_fires_in_enforce_mode_too() -> None:
    assert WarningLatch().observe(3, BudgetPolicy(4, "enforce"))


@pytest.mark.parametrize(
    ("policy", "live", "refused", "status"),
    [
        (BudgetPolicy(4, "warn"), 2, 0, "ok"),
        (BudgetPolicy(4, "warn"), 3, 0, "warning"),
        (BudgetPolicy(4, "enforce"), 4, 1, "error"),
        (BudgetPolicy(4, "enforce"), 0, 2, "error"),
    ],
)
def test_budget_cell_status(policy: BudgetPolicy, live: int, refused: int, status: str) -> None:
    cell = budget_cell(policy, scope="workspace", live=live, reserved=live, refused=refused)
    assert cell is not None
    assert cell["status"] == status
    assert cell["kind"] == "mcp_budget"
    assert cell["scope"] == "workspace"
    assert (cell["liveCount"], cell["budget"], cell["refusedCount"]) == (live, 4, refused)
    assert ("errorKind" in cell) == (status == "error")


@pytest.mark.parametrize("policy", [BudgetPolicy(None, "off"), BudgetPolicy(3, "off")])
def test_no_cell_when_off(policy: BudgetPolicy) -> None:
    assert budget_cell(policy, scope="session", live=1, reserved=1, refused=0) is None


def test_event_payloads() -> None:
    policy = BudgetPolicy(4, "enforce")
    assert warning_event(policy, live=2, reserved=3, scope="workspace") == {
        "liveCount": 2,
        "reservedCount": 3,
        "budget": 4,
        "thresholdRatio": 0.75,
        "mode": "enforce",
        "scope": "workspace",
    }
    batch = refused_batch_event(policy, [("e", "stdio")], live=4, reserved=4, scope="session")
    assert batch["refusedServers"] == [
        {"name": "e", "transport": "stdio", "reason": "budget_exhausted"}
    ]
    assert batch["mode"] == "enforce"
