"""Supervisor semantics: restart types, intensity, isolation, ordered bounded shutdown."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing

from actors import ChildSpec, EventKind, Restart, Supervisor, SupervisorGaveUp


class Script:
    """A child target whose lives follow a script: 'crash', 'exit' or 'block'."""

    def __init__(self, *lives: str, ready_value: Any = None) -> None:
        self.lives = list(lives)
        self.runs = 0
        self.ready_value = ready_value
        self.cancelled = 0

    async def __call__(self, *, task_status: trio.TaskStatus[Any]) -> None:
        self.runs += 1
        life = self.lives.pop(0) if self.lives else "block"
        task_status.started(self.ready_value)
        await trio.lowlevel.checkpoint()
        if life == "crash":
            raise RuntimeError(f"crash #{self.runs}")
        if life == "exit":
            return
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            self.cancelled += 1
            raise


def kinds(sup: Supervisor, child: str) -> list[str]:
    return [str(e.kind) for e in sup.events if e.child == child]


@pytest.mark.parametrize(
    ("restart", "life", "expected_runs"),
    [
        (Restart.PERMANENT, "crash", 2),
        (Restart.PERMANENT, "exit", 2),
        (Restart.TRANSIENT, "crash", 2),
        (Restart.TRANSIENT, "exit", 1),
        (Restart.TEMPORARY, "crash", 1),
        (Restart.TEMPORARY, "exit", 1),
    ],
)
async def test_restart_types(
    nursery: trio.Nursery, restart: Restart, life: str, expected_runs: int
) -> None:
    sup = Supervisor("root", intensity=10, period_s=10)
    await nursery.start(sup.run)
    target = Script(life)
    await sup.start_child(ChildSpec("c", target, restart))
    await trio.testing.wait_all_tasks_blocked()
    assert target.runs == expected_runs
    assert sup.has_child("c") == (expected_runs == 2)
    sup.shutdown()


async def test_readiness_value_is_returned(nursery: trio.Nursery) -> None:
    sup = Supervisor("root")
    await nursery.start(sup.run)
    assert await sup.start_child(ChildSpec("c", Script(ready_value=42))) == 42
    sup.shutdown()


async def test_failed_first_start_goes_to_the_caller_and_is_not_restarted(
    nursery: trio.Nursery,
) -> None:
    sup = Supervisor("root")
    await nursery.start(sup.run)

    async def broken(*, task_status: trio.TaskStatus[None]) -> None:
        raise OSError("spawn failed")

    with pytest.raises(OSError, match="spawn failed"):
        await sup.start_child(ChildSpec("c", broken))
    assert not sup.has_child("c")
    # The name is free again.
    await sup.start_child(ChildSpec("c", Script()))
    sup.shutdown()


async def test_crash_never_cancels_a_sibling(nursery: trio.Nursery) -> None:
    sup = Supervisor("root", intensity=10, period_s=10)
    await nursery.start(sup.run)
    sibling = Script()
    await sup.start_child(ChildSpec("sibling", sibling))
    await sup.start_child(ChildSpec("crasher", Script("crash", "crash"), Restart.TRANSIENT))
    await trio.testing.wait_all_tasks_blocked()
    assert sibling.runs == 1 and sibling.cancelled == 0
    assert kinds(sup, "crasher").count("crash") == 2
    sup.shutdown()


async def test_intensity_exceeded_gives_up_and_escalates(autojump_clock: trio.abc.Clock) -> None:
    sibling = Script()
    sup = Supervisor("inner", intensity=2, period_s=5)
    with pytest.raises(SupervisorGaveUp) as info:
        await sup.run(
            [
                ChildSpec("sibling", sibling),
                ChildSpec("looper", Script("crash", "crash", "crash", "crash"), Restart.PERMANENT),
            ]
        )
    assert info.value.child == "looper"
    assert kinds(sup, "looper")[-1] == EventKind.GIVE_UP
    # The sibling was stopped in order (cancelled after its grace), not left running.
    assert sibling.cancelled == 1
    assert kinds(sup, "sibling") == ["start", "stop"]


async def test_restarts_outside_the_period_do_not_count(autojump_clock: trio.abc.Clock) -> None:
    sup = Supervisor("root", intensity=1, period_s=5)
    lives = ["crash"] * 4

    async def slow_crasher(*, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        await trio.sleep(10)
        if lives:
            lives.pop()
            raise RuntimeError("late crash")
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        await sup.start_child(ChildSpec("c", slow_crasher))
        await trio.sleep(60)
        assert lives == []
        assert kinds(sup, "c").count("restart") == 4
        sup.shutdown()


async def test_a_gave_up_child_supervisor_is_a_crash_for_its_parent(
    autojump_clock: trio.abc.Clock,
) -> None:
    parent = Supervisor("parent", intensity=10, period_s=10)
    child_sup = Supervisor("session-1", intensity=1, period_s=5)
    async with trio.open_nursery() as nursery:
        await nursery.start(parent.run)

        async def run_child_sup(*, task_status: trio.TaskStatus[Supervisor]) -> None:
            await child_sup.run(
                [ChildSpec("agent", Script("crash", "crash", "crash"), Restart.TRANSIENT)],
                task_status=task_status,
            )

        await parent.start_child(ChildSpec("session-1", run_child_sup, Restart.TEMPORARY))
        await trio.sleep(1)
        assert kinds(parent, "session-1") == ["start", "crash"]
        assert "SupervisorGaveUp" in parent.events[-1].reason
        parent.shutdown()


async def test_ordered_shutdown_with_stop_hook_and_grace(autojump_clock: trio.abc.Clock) -> None:
    order: list[str] = []

    def polite(name: str) -> tuple[Any, Any]:
        stop = trio.Event()

        async def target(*, task_status: trio.TaskStatus[None]) -> None:
            task_status.started()
            await stop.wait()
            order.append(name)

        return target, stop.set

    stubborn_cancelled: list[float] = []

    async def stubborn(*, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            stubborn_cancelled.append(trio.current_time())
            order.append("stubborn")
            raise

    a, stop_a = polite("a")
    b, stop_b = polite("b")
    sup = Supervisor("root")
    async with trio.open_nursery() as nursery:
        await nursery.start(
            sup.run,
            [
                ChildSpec("a", a, stop=stop_a),
                ChildSpec("stubborn", stubborn, shutdown_grace_s=2.0),
                ChildSpec("b", b, stop=stop_b),
            ],
        )
        t0 = trio.current_time()
        sup.shutdown()
    # Reverse start order; the stubborn child was cancelled only after its grace.
    assert order == ["b", "stubborn", "a"]
    assert stubborn_cancelled[0] - t0 == pytest.approx(2.0)
    assert [e.kind for e in sup.events if e.kind == "stop"] == ["stop"] * 3


async def test_stop_child_is_not_restarted(nursery: trio.Nursery) -> None:
    sup = Supervisor("root")
    await nursery.start(sup.run)
    target = Script()
    await sup.start_child(ChildSpec("c", target, Restart.PERMANENT, shutdown_grace_s=0))
    await sup.stop_child("c")
    assert target.runs == 1
    assert not sup.has_child("c")
    sup.shutdown()


async def test_backoff_delays_restarts(autojump_clock: trio.abc.Clock) -> None:
    sup = Supervisor("root", intensity=10, period_s=100)
    starts: list[float] = []

    async def crasher(*, task_status: trio.TaskStatus[None]) -> None:
        starts.append(trio.current_time())
        task_status.started()
        if len(starts) < 4:
            raise RuntimeError("x")
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        await sup.start_child(ChildSpec("c", crasher, backoff_s=1.0, max_backoff_s=3.0))
        await trio.sleep(30)
        gaps = [b - a for a, b in itertools.pairwise(starts)]
        # 1 s, 2 s, then capped at 3 s, each with at most 20 % jitter.
        for gap, base in zip(gaps, [1.0, 2.0, 3.0], strict=True):
            assert 0.8 * base <= gap <= 1.2 * base
        sup.shutdown()


async def test_history_is_bounded(nursery: trio.Nursery) -> None:
    sup = Supervisor("root", intensity=1000, period_s=1, history=5)
    await nursery.start(sup.run)
    await sup.start_child(ChildSpec("c", Script(*["crash"] * 20), Restart.TRANSIENT))
    await trio.testing.wait_all_tasks_blocked()
    assert len(sup.events) == 5
    sup.shutdown()


def test_restart_window_counts_within_the_period() -> None:
    from actors import RestartWindow

    window = RestartWindow(intensity=2, period_s=10)
    assert window.allows(0.0)
    assert window.count(0.0) and window.count(1.0)
    assert not window.allows(2.0)
    assert not window.count(2.0)  # the third restart within 10 s exceeds it
    assert window.allows(12.5)  # the first two have aged out


async def _fails_while_cancelled(*, task_status: trio.TaskStatus[None]) -> None:
    """A child with two tasks: when cancelled, one ends Cancelled and the other raises, so
    the child ends with a mixed group (Cancelled + RuntimeError)."""

    async def cleanup_fails() -> None:
        try:
            await trio.sleep_forever()
        finally:
            raise RuntimeError("cleanup failed")

    async with trio.open_nursery() as inner:
        inner.start_soon(trio.sleep_forever)
        inner.start_soon(cleanup_fails)
        task_status.started()


async def test_a_child_failing_while_cancelled_never_escapes_one_for_one(
    nursery: trio.Nursery,
) -> None:
    sup = Supervisor("root", intensity=10, period_s=10)
    await nursery.start(sup.run)
    sibling = Script("block")
    await sup.start_child(ChildSpec("sibling", sibling))
    await sup.start_child(ChildSpec("mixed", _fails_while_cancelled, shutdown_grace_s=0))
    await sup.stop_child("mixed", grace_s=0)
    assert sup.running and not sup.has_child("mixed")
    assert kinds(sup, "mixed") == ["start", "crash", "stop"]  # the failure is visible
    assert [e.reason for e in sup.events if e.kind is EventKind.CRASH] == [
        "RuntimeError: cleanup failed (while stopping)"
    ]
    assert sibling.cancelled == 0 and sup.has_child("sibling")
    sup.shutdown()
    await sup.finished.wait()
    assert sibling.cancelled == 1


async def test_a_child_failing_during_shutdown_lets_the_others_stop_in_order(
    autojump_clock: trio.abc.Clock,
) -> None:
    sup = Supervisor("root", intensity=10, period_s=10)
    first = Script("block")
    async with trio.open_nursery() as nursery:
        await nursery.start(
            sup.run,
            [
                ChildSpec("first", first),
                ChildSpec("mixed", _fails_while_cancelled, shutdown_grace_s=0),
            ],
        )
        sup.shutdown()
    assert sup.finished.is_set() and first.cancelled == 1
    assert kinds(sup, "mixed")[-1] == "stop" and kinds(sup, "first")[-1] == "stop"


async def test_on_give_up_runs_before_the_children_are_stopped(
    autojump_clock: trio.abc.Clock,
) -> None:
    seen: list[tuple[str, bool]] = []
    sup = Supervisor("root", intensity=1, period_s=10)

    async def on_give_up(exc: SupervisorGaveUp) -> None:
        seen.append((exc.child, sup.has_child("bystander")))

    sup.on_give_up = on_give_up
    with pytest.raises(SupervisorGaveUp):
        await sup.run(
            [ChildSpec("bystander", Script("block")), ChildSpec("flaky", Script(*["crash"] * 5))]
        )
    assert seen == [("flaky", True)]  # the bystander was still there
