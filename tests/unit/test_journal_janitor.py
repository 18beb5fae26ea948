"""Issue 16 item 12: the journal janitor bounds the disk (retention, total bytes), never
touching a journal that has a writer. Real files; the clock is passed in."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import trio

from serve.journal import Journal, JournalLimits, JournalMeta, SessionJournal
from serve.journal.store import LOCK_NAME, MetaFile, read_meta, write_meta

KIB = 1024
DAY_MS = 24 * 3600 * 1000


def _meta(sid: str) -> JournalMeta:
    return JournalMeta(session_id=sid, epoch="e", workspace="/w", acp_session_id="a-" + sid)


async def _write(
    journal: Journal, sid: str, events: int, frame_bytes: int, *, close: bool
) -> SessionJournal:
    writer = await journal.open_writer(_meta(sid), fresh=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for event_id in range(1, events + 1):
            writer.sink(event_id, "session_update", b"x" * frame_bytes)
        await writer.flush()
        if close:
            await writer.aclose()
        else:
            nursery.cancel_scope.cancel()
    return writer


def _age(journal: Journal, sid: str, at_ms: int) -> None:
    """Make a journal look last active at ``at_ms``."""
    directory = journal.session_dir(sid)
    meta_file = read_meta(directory)
    assert meta_file is not None
    write_meta(
        directory,
        MetaFile(meta=meta_file.meta, clean_last_id=meta_file.clean_last_id, updated_at_ms=at_ms),
    )
    for entry in os.scandir(directory):
        os.utime(entry.path, (at_ms / 1000, at_ms / 1000))


def _present(journal: Journal) -> set[str]:
    return {m.session_id for m in journal.sessions()}


async def test_closed_journals_past_the_retention_are_deleted(tmp_path: Path) -> None:
    journal = Journal(tmp_path, JournalLimits(retention_ms=DAY_MS))
    now = 1_900_000_000_000
    for sid in ("old", "recent"):
        await _write(journal, sid, 3, 100, close=True)
    open_writer = await journal.open_writer(_meta("open-old"), fresh=True)
    _age(journal, "old", now - 2 * DAY_MS)
    _age(journal, "recent", now - DAY_MS // 2)
    _age(journal, "open-old", now - 3 * DAY_MS)
    assert await trio.to_thread.run_sync(journal._sweep_sync, now) == 1
    assert _present(journal) == {"recent", "open-old"}  # a journal with a writer stays
    assert journal.swept_journals == 1 and journal.swept_bytes > 0
    await open_writer.aclose()


async def test_the_total_bound_deletes_closed_journals_oldest_first(tmp_path: Path) -> None:
    limits = JournalLimits(
        max_session_bytes=64 * KIB,
        segment_bytes=16 * KIB,
        max_total_bytes=128 * KIB,
        retention_ms=0,
    )
    journal = Journal(tmp_path, limits)
    now = 1_900_000_000_000
    for age, sid in enumerate(("c", "b", "a")):  # "a" is the oldest
        await _write(journal, sid, 50, 1000, close=True)  # ~50 KB each
        _age(journal, sid, now - (age + 1) * 60_000)
    live = await journal.open_writer(_meta("live"), fresh=True)
    _age(journal, "live", now - DAY_MS)  # older than all, but open
    await _write_more(live, 50)
    assert await trio.to_thread.run_sync(journal._sweep_sync, now) == 2
    assert _present(journal) == {"c", "live"}
    assert journal.disk_bytes <= 128 * KIB
    await live.aclose()


async def _write_more(writer: SessionJournal, events: int) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for event_id in range(1, events + 1):
            writer.sink(event_id, "session_update", b"y" * 1000)
        await writer.flush()
        nursery.cancel_scope.cancel()


async def test_a_journal_locked_by_another_process_is_never_deleted(tmp_path: Path) -> None:
    journal = Journal(tmp_path, JournalLimits(retention_ms=1))
    await _write(journal, "elsewhere", 2, 10, close=True)
    # Another process's writer holds the flock (a separate open file description).
    fd = os.open(journal.session_dir("elsewhere") / LOCK_NAME, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        assert await trio.to_thread.run_sync(journal._sweep_sync, 1_900_000_000_000) == 0
        assert _present(journal) == {"elsewhere"}
    finally:
        os.close(fd)
    assert await trio.to_thread.run_sync(journal._sweep_sync, 1_900_000_000_000) == 1
    assert _present(journal) == set()
