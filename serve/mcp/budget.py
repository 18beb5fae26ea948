"""MCP client budgets: admission, the 75 % warning latch, and the status cells (sans-IO).

Theory of operation
-------------------
``--mcp-client-budget N`` caps the live MCP clients of a scope (the workspace pool, or one
session when the pool is off); ``--mcp-budget-mode`` says what happens at the cap:

======== ===================================================================
off      no accounting events, no refusals (``budgets: []`` in the snapshot)
warn     every server is admitted; crossing 75 % publishes a warning
enforce  servers beyond the budget are refused in declaration order
======== ===================================================================

:func:`admit` is the refusal rule: the first ``budget`` usable servers (in the order of the
``mcpServers`` object) are admitted, the rest refused with ``budget_exhausted``. It is a
pure function of the configuration, so the same servers are refused on every pass.

:class:`WarningLatch` is the hysteresis of ``mcp_budget_warning``: it fires once when
``reserved / budget`` rises to 75 % or more, and re-arms only after the ratio falls below
37.5 % (``REARM_FRACTION``), so a count hovering around the threshold does not flap.

:func:`budget_cell` renders the ``budgets[]`` entry of ``GET /workspace/mcp``: status
``error`` when something was refused, ``warning`` when ``liveCount >= 0.75 * budget``,
``ok`` otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import msgspec

BudgetMode = Literal["off", "warn", "enforce"]

THRESHOLD_RATIO = 0.75
REARM_FRACTION = 0.375
BUDGET_HINT = "Raise --mcp-client-budget or remove servers from mcpServers config."


class BudgetPolicy(msgspec.Struct, frozen=True):
    """``budget`` None means no cap (then the mode is ``off``)."""

    budget: int | None = None
    mode: BudgetMode = "off"

    @property
    def active(self) -> bool:
        return self.budget is not None and self.mode != "off"

    @property
    def enforcing(self) -> bool:
        return self.budget is not None and self.mode == "enforce"


class Admission(msgspec.Struct, frozen=True):
    admitted: tuple[str, ...]
    refused: tuple[str, ...]


def admit(names: Sequence[str], policy: BudgetPolicy) -> Admission:
    """Admit usable servers (given in declaration order) under ``policy``."""
    if not policy.enforcing:
        return Admission(tuple(names), ())
    assert policy.budget is not None
    return Admission(tuple(names[: policy.budget]), tuple(names[policy.budget :]))


class WarningLatch:
    """Fires once per upward crossing of 75 %; re-armed below 37.5 %."""

    __slots__ = ("armed",)

    def __init__(self) -> None:
        self.armed = True

    def observe(self, reserved: int, policy: BudgetPolicy) -> bool:
        """Record the current reserved count; True when a warning is due now."""
        if not policy.active:
            return False
        assert policy.budget is not None
        ratio = reserved / policy.budget
        if self.armed and ratio >= THRESHOLD_RATIO:
            self.armed = False
            return True
        if not self.armed and ratio < REARM_FRACTION:
            self.armed = True
        return False


def warning_event(policy: BudgetPolicy, *, live: int, reserved: int, scope: str) -> dict[str, Any]:
    """The ``mcp_budget_warning`` payload."""
    return {
        "liveCount": live,
        "reservedCount": reserved,
        "budget": policy.budget,
        "thresholdRatio": THRESHOLD_RATIO,
        "mode": policy.mode,
        "scope": scope,
    }


def refused_batch_event(
    policy: BudgetPolicy,
    refused: Sequence[tuple[str, str]],
    *,
    live: int,
    reserved: int,
    scope: str,
) -> dict[str, Any]:
    """The ``mcp_child_refused_batch`` payload; ``refused`` is ``(name, transport)`` pairs."""
    return {
        "refusedServers": [
            {"name": name, "transport": transport, "reason": "budget_exhausted"}
            for name, transport in refused
        ],
        "budget": policy.budget,
        "liveCount": live,
        "reservedCount": reserved,
        "mode": "enforce",
        "scope": scope,
    }


def budget_cell(
    policy: BudgetPolicy, *, scope: str, live: int, reserved: int, refused: int
) -> dict[str, Any] | None:
    """The ``budgets[]`` entry, or None when no budget is configured / mode is off."""
    if not policy.active:
        return None
    assert policy.budget is not None
    cell: dict[str, Any] = {"kind": "mcp_budget", "scope": scope}
    if refused > 0:
        cell.update(status="error", errorKind="budget_exhausted", hint=BUDGET_HINT)
    elif live >= THRESHOLD_RATIO * policy.budget:
        cell.update(status="warning", hint=BUDGET_HINT)
    else:
        cell["status"] = "ok"
    cell.update(
        liveCount=live,
        reservedCount=reserved,
        budget=policy.budget,
        mode=policy.mode,
        refusedCount=refused,
    )
    return cell
