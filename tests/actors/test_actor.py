"""Actor semantics: tell/ask, errors reaching the caller, crashes, timeouts, restarts."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest
import trio

from actors import (
    Actor,
    ActorCrashed,
    ActorStopped,
    AskTimeout,
    ChildSpec,
    Crash,
    InboxFull,
    Restart,
    Supervisor,
)


class Add(msgspec.Struct, frozen=True):
    n: int


class Get(msgspec.Struct, frozen=True):
    pass


class Boom(msgspec.Struct, frozen=True):
    pass


class Die(msgspec.Struct, frozen=True):
    pass


class Sleep(msgspec.Struct, frozen=True):
    seconds: float


class DomainError(Exception):
    pass


class Counter(Actor[Add | Get | Boom | Die | Sleep]):
    def __init__(self, inbox_size: int = 8) -> None:
        super().__init__("counter", inbox_size=inbox_size)
        self.total = 0
        self.starts = 0
        self.stops = 0

    async def on_start(self) -> None:
        self.starts += 1

    async def on_stop(self) -> None:
        self.stops += 1

    async def handle(self, msg: Add | Get | Boom | Die | Sleep) -> int | None:
        match msg:
            case Add(n):
                self.total += n
                return self.total
            case Get():
                return self.total
            case Boom():
                raise DomainError("bad input")
            case Die():
                raise Crash("state corrupted")
            case Sleep(seconds):
                await trio.sleep(seconds)
                return None


async def test_tell_then_ask_sees_state(nursery: trio.Nursery) -> None:
    actor = Counter()
    await nursery.start(actor.run)
    await actor.tell(Add(2))
    actor.tell_nowait(Add(3))
    assert await actor.ask(Get()) == 5
    assert actor.statistics()["handled"] == 3


async def test_handler_error_reaches_caller_and_actor_survives(nursery: trio.Nursery) -> None:
    actor = Counter()
    await nursery.start(actor.run)
    with pytest.raises(DomainError, match="bad input"):
        await actor.ask(Boom())
    assert await actor.ask(Add(1)) == 1
    assert actor.starts == 1


async def test_crash_fails_the_asker_and_ends_run() -> None:
    actor = Counter()
    with pytest.raises(BaseExceptionGroup) as info:
        async with trio.open_nursery() as nursery:
            await nursery.start(actor.run)
            with pytest.raises(ActorCrashed) as crashed:
                await actor.ask(Die())
            assert isinstance(crashed.value.__cause__, Crash)
    assert info.group_contains(Crash)
    assert actor.stops == 1


async def test_ask_timeout(nursery: trio.Nursery, autojump_clock: trio.abc.Clock) -> None:
    actor = Counter()
    await nursery.start(actor.run)
    with pytest.raises(AskTimeout) as info:
        await actor.ask(Sleep(10), timeout_s=1)
    assert info.value.timeout_s == 1
    # The actor is still alive after the caller gave up.
    assert await actor.ask(Get(), timeout_s=math.inf) == 0


async def test_tell_nowait_on_full_inbox_raises() -> None:
    actor = Counter(inbox_size=2)
    actor.tell_nowait(Add(1))
    actor.tell_nowait(Add(1))
    with pytest.raises(InboxFull) as info:
        actor.tell_nowait(Add(1))
    assert info.value.capacity == 2
    assert actor.statistics()["queued"] == 2


async def test_close_drains_then_further_asks_fail(nursery: trio.Nursery) -> None:
    actor = Counter()
    await actor.tell(Add(4))
    done = trio.Event()

    async def run() -> None:
        await actor.run()
        done.set()

    nursery.start_soon(run)
    actor.close()
    await done.wait()
    assert actor.total == 4
    with pytest.raises(ActorStopped):
        await actor.ask(Get())
    with pytest.raises(ActorStopped):
        await actor.tell(Add(1))


async def test_a_reopened_actor_runs_again_with_a_fresh_inbox(nursery: trio.Nursery) -> None:
    actor = Counter()
    done = trio.Event()

    async def first_run() -> None:
        await actor.run()
        done.set()

    nursery.start_soon(first_run)
    await actor.tell(Add(2))
    actor.close()
    await done.wait()
    with pytest.raises(ActorStopped):  # closed: refused until it runs again
        await actor.tell(Add(100))
    actor.reopen()
    await nursery.start(actor.run)
    assert not actor.closed and actor.starts == 2
    assert await actor.ask(Add(3)) == 5  # same object, same state, a new incarnation
    actor.close()


async def test_cancelled_run_fails_inflight_ask_with_stopped(nursery: trio.Nursery) -> None:
    actor = Counter()
    scope = trio.CancelScope()

    async def run() -> None:
        with scope:
            await actor.run()

    nursery.start_soon(run)
    result: list[BaseException] = []

    async def asker() -> None:
        try:
            await actor.ask(Sleep(100))
        except ActorStopped as exc:
            result.append(exc)

    async with trio.open_nursery() as inner:
        inner.start_soon(asker)
        await trio.testing.wait_all_tasks_blocked()
        scope.cancel()
    assert len(result) == 1


async def test_supervised_actor_restarts_and_keeps_its_inbox(nursery: trio.Nursery) -> None:
    actor = Counter()
    sup = Supervisor("root", intensity=5, period_s=10)
    await nursery.start(sup.run, [ChildSpec("counter", actor.run, Restart.TRANSIENT)])
    await actor.tell(Add(1))
    with pytest.raises(ActorCrashed):
        await actor.ask(Die())
    # The same reference works against the new incarnation.
    assert await actor.ask(Add(1)) == 2
    assert actor.starts == 2
    kinds = [e.kind for e in sup.events]
    assert kinds == ["start", "crash", "restart", "start"]
    sup.shutdown()


class _Payload:
    """A message and an answer that can be weakly referenced."""


class Echo(Actor[Any]):
    def __init__(self) -> None:
        super().__init__("echo")

    async def handle(self, msg: Any) -> Any:
        return _Payload()


async def test_the_loop_keeps_no_reference_to_a_handled_message_or_its_answer() -> None:
    import gc
    import weakref

    actor = Echo()
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        msg = _Payload()
        answer = await actor.ask(msg)
        refs = [weakref.ref(msg), weakref.ref(answer)]
        del msg, answer
        gc.collect()
        # the actor is idle in its loop, waiting for the next message
        assert [r() for r in refs] == [None, None]
        actor.close()
