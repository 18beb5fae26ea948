"""The pool's warm policy (serve/agents/warm.py) and the shared-child exit charge
(serve/agents/exit_charge.py): pure logic, no processes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from serve.agents.adaptive import QUIET_S
from serve.agents.child import AgentChild
from serve.agents.exit_charge import MAX_CHARGED, ExitCharges
from serve.agents.warm import WarmPolicy


def child(*, sessions: int = 0, used: bool = False, stopping: bool = False) -> AgentChild:
    slots: dict[int, Any] = {i: f"s{i}" for i in range(sessions)}
    fake = SimpleNamespace(
        slots=slots, used=used, stopping=stopping, conn=SimpleNamespace(closed=False)
    )
    return cast(AgentChild, fake)


def test_packed_pool_keeps_its_first_child_ahead_but_no_spare_for_a_full_one() -> None:
    policy = WarmPolicy(1, 4, per_agent=12)
    assert policy.floor(others=0) == 1  # no child yet: the first create must not wait
    assert policy.floor(others=1) == 0  # a child exists: its free slots are the capacity
    # The last session of a second child left: stop it, the first child has room.
    assert not policy.keeps_empty(rooms_besides=1, others=1, now=0.0)
    # A full first child beside it: the emptied child is stopped too (no spare by default).
    assert not policy.keeps_empty(rooms_besides=0, others=1, now=0.0)
    # The only child emptied: it stays (it is the pool's one child with room).
    assert policy.keeps_empty(rooms_besides=0, others=0, now=0.0)


def test_packed_spare_keeps_a_child_with_room_when_every_other_is_full() -> None:
    policy = WarmPolicy(1, 4, per_agent=12, packed_spare=True)
    assert policy.floor(others=1) == 1
    assert policy.keeps_empty(rooms_besides=0, others=1, now=0.0)
    assert not policy.keeps_empty(rooms_besides=1, others=1, now=0.0)
    assert policy.maximum == 1  # packed: not adaptive, whatever --warm-agents-max says
    assert not policy.adaptive


def test_zero_warm_agents_keeps_nothing_ahead_in_either_mode() -> None:
    for per_agent in (1, 12):
        policy = WarmPolicy(0, 0, per_agent=per_agent, packed_spare=True)
        assert policy.floor(others=0) == 0 and policy.wanted(0.0, others=0) == 0


def test_isolation_follows_the_arrivals_and_retires_the_newest_idle_spares_when_quiet() -> None:
    policy = WarmPolicy(1, 4, per_agent=1)
    assert policy.adaptive
    for _ in range(4):
        policy.sizer.spawned(2.0)
    for t in range(8):  # a burst of arrivals
        policy.sizer.arrival(t * 0.1)
    assert policy.wanted(0.8, others=3) > 1
    busy, old_idle, used, new_idle = child(sessions=1), child(), child(used=True), child()
    children = [busy, old_idle, used, new_idle]
    assert policy.retire(0.8, spare=3, children=children) == []  # arrivals not paused
    later = 0.7 + max(QUIET_S, 30.0) + 1  # past the quiet time and the rate's window
    assert policy.wanted(later, others=3) == 1
    # Two spares, one wanted: the newest idle one goes; busy and used ones never.
    assert policy.retire(later, spare=2, children=children) == [new_idle]
    assert policy.retire(later, spare=3, children=children) == [new_idle, old_idle]


def test_a_shared_childs_exit_is_charged_once_for_all_its_sessions() -> None:
    charges = ExitCharges()
    # Intensity 2 in 60 s: two crashed children may restart, the third may not.
    assert charges.charge("agent-1", 2, 60.0, now=0.0)
    assert charges.charge("agent-1", 2, 60.0, now=0.1)  # its other sessions: same answer
    assert charges.charge("agent-2", 2, 60.0, now=1.0)
    assert not charges.charge("agent-3", 2, 60.0, now=2.0)
    assert not charges.charge("agent-3", 2, 60.0, now=2.5)
    assert charges.charge("agent-4", 2, 60.0, now=61.5)  # the window moved on


def test_the_remembered_answers_are_bounded() -> None:
    charges = ExitCharges()
    for i in range(MAX_CHARGED + 10):
        charges.charge(f"agent-{i}", 10_000, 60.0, now=float(i))
    assert len(charges._answers) == MAX_CHARGED
