"""The Outbox: ordered, bounded, never-blocking mail from one actor to others."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from actors import Actor, ActorError, InboxFull
from actors.outbox import Outbox


class Recorder(Actor[int]):
    """Records every message; each handling waits until ``gate`` is set."""

    def __init__(self, inbox_size: int) -> None:
        super().__init__("recorder", inbox_size=inbox_size)
        self.seen: list[int] = []
        self.gate = trio.Event()

    async def handle(self, msg: int) -> int:
        await self.gate.wait()
        self.seen.append(msg)
        return msg * 10


async def test_post_never_blocks_keeps_order_through_a_spill_and_reports_handling() -> None:
    dest = Recorder(inbox_size=2)
    outbox = Outbox("test", limit=100)
    async with trio.open_nursery() as nursery:
        outbox.bind(nursery)
        await nursery.start(dest.run)
        replies = [outbox.post(dest, n) for n in range(20)]  # inbox 2: 18 spill, none waits
        assert outbox.spilled() > 0 and not any(r.done for r in replies)
        dest.gate.set()
        assert [await r.wait() for r in replies] == [n * 10 for n in range(20)]
        assert dest.seen == list(range(20))
        assert outbox.spilled() == 0 and outbox.dropped == 0
        dest.close()


async def test_a_full_spill_drops_with_a_failed_reply_and_a_stopped_destination_fails() -> None:
    dest = Recorder(inbox_size=1)
    outbox = Outbox("test", limit=2)
    async with trio.open_nursery() as nursery:
        outbox.bind(nursery)
        await nursery.start(dest.run)
        first = outbox.post(dest, 1)  # handled (waits on the gate)
        await trio.testing.wait_all_tasks_blocked()
        kept = [outbox.post(dest, n) for n in (2, 3, 4)]  # one in the inbox, two spilled
        dropped = outbox.post(dest, 5)
        assert dropped.done and outbox.dropped == 1
        with pytest.raises(InboxFull):
            await dropped.wait()
        dest.gate.set()
        assert await first.wait() == 10 and [await r.wait() for r in kept] == [20, 30, 40]
        assert dest.seen == [1, 2, 3, 4]
        dest.close()
    with pytest.raises(ActorError):
        await outbox.post(dest, 6).wait()  # stopped: fails at once, never hangs
