"""Issue 16 item 9: slow blocking work of one kind cannot starve journal flushes.

Real worker threads that really block (a threading.Event, a FIFO nobody writes), real
journal files in tmp_path. More blocked calls than trio's default limiter holds (40) are
started first; the journal must still open, write and fsync."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import trio
import trio.testing

from acp.handler import BaseClientHandler
from acp.schema import ReadTextFileParams
from serve.http.routes import files as file_routes
from serve.journal import Journal, JournalMeta

BLOCKED_CALLS = 48


async def _journal_round_trip(tmp_path: Path) -> int:
    journal = Journal(tmp_path / "state")
    meta = JournalMeta(session_id="s1", epoch="e1", workspace="/w", acp_session_id="a1")
    writer = await journal.open_writer(meta, fresh=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for event_id in range(1, 11):
            writer.sink(event_id, "session_update", b"id: %d\ndata: {}\n\n" % event_id)
        await writer.flush()
        await writer.aclose()
    return (await journal.read("s1")).count


async def test_slow_file_routes_cannot_starve_journal_flushes(tmp_path: Path) -> None:
    release = threading.Event()
    async with trio.open_nursery() as nursery:
        for _ in range(BLOCKED_CALLS):
            nursery.start_soon(file_routes._run, lambda: release.wait(60))
        await trio.testing.wait_all_tasks_blocked()
        try:
            with trio.move_on_after(20) as hang:  # a hang detector, not a timing assertion
                assert await _journal_round_trip(tmp_path) == 10
            assert not hang.cancelled_caught, "the journal waited behind the file routes"
        finally:
            release.set()


async def test_agent_reads_of_a_fifo_cannot_starve_journal_flushes(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    handler = BaseClientHandler()
    done = 0

    async def read() -> None:
        nonlocal done
        await handler.read_text_file(ReadTextFileParams(session_id="s", path=str(fifo)))
        done += 1

    async with trio.open_nursery() as nursery:
        for _ in range(BLOCKED_CALLS):
            nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        try:
            with trio.move_on_after(20) as hang:
                assert await _journal_round_trip(tmp_path) == 10
            assert not hang.cancelled_caught, "the journal waited behind blocked fs reads"
        finally:
            # Let every reader through: each open for writing releases the blocked opens.
            while done < BLOCKED_CALLS:
                with contextlib.suppress(OSError):
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                await trio.sleep(0.01)
