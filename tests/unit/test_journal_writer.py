"""Session journal writers under trio, fed by a real EventLog, read back from real files."""

from __future__ import annotations

import errno
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import msgspec
import pytest
import trio
import trio.testing

from serve.events import EventLog
from serve.journal import (
    Journal,
    JournalBusy,
    JournalIOError,
    JournalLimits,
    JournalMeta,
    JournalNotFound,
    SessionJournal,
    store,
)
from serve.journal.pg import PgJournal
from serve.threads import journal_limiter
from tests.support.postgres import PostgresServer

Published = list[tuple[int, str, bytes]]
MakeJournal = Callable[..., Journal | PgJournal]


@pytest.fixture(params=["files", "postgresql"])
async def make(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MakeJournal]:
    """A factory of journal backends over one store: files under ``tmp_path``, or one
    fresh PostgreSQL database (each instance a daemon of its own: its own lease owner id).
    The contract tests below run against both."""
    made: list[PgJournal] = []
    if request.param == "files":
        yield lambda limits=None: Journal(tmp_path, limits)
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    url = server.new_database()

    def pg(limits: JournalLimits | None = None) -> PgJournal:
        journal = PgJournal(url, limits)
        made.append(journal)
        return journal

    yield pg
    for journal in made:
        await journal.aclose()


def meta(session_id: str = "sess-1", epoch: str = "epoch-1", **kw: object) -> JournalMeta:
    return JournalMeta(
        session_id=session_id,
        epoch=epoch,
        workspace="/work/space",
        acp_session_id=f"acp-{session_id}",
        created_at_ms=1_700_000_000_000,
        **kw,  # type: ignore[arg-type]
    )


def tee(log: EventLog, writer: SessionJournal, published: Published) -> None:
    """Send the log's frames to the writer and remember them for comparison."""

    def sink(event_id: int, event_type: str, frame: bytes) -> None:
        published.append((event_id, event_type, frame))
        writer.sink(event_id, event_type, frame)

    log.sink = sink


async def progress(done: Callable[[], bool]) -> None:
    """Wait for work done in a worker thread (polling; the caller bounds it with fail_after)."""
    while not done():  # noqa: ASYNC110
        await trio.sleep(0.01)


TYPES = ("session_update", "turn_complete", "permission_request", "prompt_queued")


async def publish(log: EventLog, n: int, *, start: int = 0, yield_every: int = 100) -> None:
    for i in range(start, start + n):
        data = {"n": i, "text": "chunk " * (i % 7), "uni": "é✓"}
        log.publish(TYPES[i % len(TYPES)], data, prompt_id=f"p{i // 50}")
        if i % yield_every == 0:
            await trio.lowlevel.checkpoint()


async def test_round_trip_of_10k_frames_restores_an_eventlog_with_the_same_ids_and_epoch(
    make: MakeJournal,
) -> None:
    journal = make()
    m = meta()
    published: Published = []
    writer = await journal.open_writer(m)
    log = EventLog(m.session_id, epoch=m.epoch)
    tee(log, writer, published)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        await publish(log, 10_000)
        await writer.aclose()
    assert writer.statistics()["eventsWritten"] == 10_000

    replay = await make().read(m.session_id)
    assert replay.meta == m and replay.clean and replay.problems == ()
    assert (replay.count, replay.first_id, replay.last_id, replay.next_id) == (
        10_000,
        1,
        10_000,
        10_001,
    )
    assert [tuple(r) for r in replay] == published

    # Rebuild the log the way the daemon will: same epoch, ids continue, replay works.
    tail = await make().read(m.session_id, tail=8000)
    assert len(tail.records) == 8000 and tail.records[0].event_id == 2001
    restored = EventLog(m.session_id, epoch=tail.meta.epoch)
    for event_id, _type, frame in tail:
        restored.restore(event_id, frame)
    assert restored.next_id == 10_001 and restored.first_id == 2001
    sub = restored.subscribe(last_event_id=9_990, epoch=m.epoch)
    chunk = sub.take_nowait()
    assert chunk is not None
    assert chunk.startswith(b"".join(f for _, _, f in published[9_990:]))
    assert b"replay_complete" in chunk and b"state_resync_required" not in chunk

    # The journal continues with the restored log.
    again = make()
    writer2 = await again.open_writer(msgspec.structs.replace(m, origin="load"))
    assert writer2.next_id == 10_001
    tee(restored, writer2, published)
    assert restored.publish("turn_complete", {"after": "restart"}) == 10_001
    await writer2.aclose()
    final = await again.read(m.session_id)
    assert final.clean and final.meta.origin == "load"
    assert [tuple(r) for r in final] == published


async def test_flush_makes_everything_published_before_it_durable(make: MakeJournal) -> None:
    journal = make()
    writer = await journal.open_writer(meta())
    log = EventLog("sess-1", epoch="epoch-1", sink=writer.sink)
    await publish(log, 500)
    await writer.flush()  # no flusher task running: flush() alone does the write
    # Another Journal object (as another process would) sees all of it, read-only.
    seen = await make().read("sess-1")
    assert seen.count == 500 and seen.last_id == 500 and not seen.clean
    await publish(log, 500, start=500)
    await writer.flush()
    assert (await make().read("sess-1")).last_id == 1000
    await writer.aclose()


async def test_clean_marker_only_after_aclose(make: MakeJournal) -> None:
    journal = make()
    writer = await journal.open_writer(meta())
    log = EventLog("sess-1", epoch="epoch-1", sink=writer.sink)
    await publish(log, 20)
    await writer.flush()
    assert not (await journal.read("sess-1")).clean  # open (or crashed): not clean
    await writer.aclose()
    assert (await journal.read("sess-1")).clean
    # Reopening clears the marker before anything can be published.
    writer = await journal.open_writer(meta())
    assert not (await make().read("sess-1")).clean
    await writer.aclose()  # no events this time: still clean, same last id
    replay = await journal.read("sess-1")
    assert replay.clean and replay.last_id == 20


async def test_cancelling_the_flusher_flushes_but_does_not_mark_clean(make: MakeJournal) -> None:
    journal = make(JournalLimits(flush_interval_ms=60_000))
    writer = await journal.open_writer(meta())
    log = EventLog("sess-1", epoch="epoch-1", sink=writer.sink)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        await publish(log, 50)
        nursery.cancel_scope.cancel()
    replay = await make().read("sess-1")
    assert replay.last_id == 50 and not replay.clean
    await writer.aclose()


async def test_a_flush_cancelled_while_every_journal_thread_is_busy_keeps_its_events(
    tmp_path: Path,
) -> None:
    """A daemon stopping while other journals hold every worker thread: the flusher is
    cancelled waiting for one. The batch it took stays buffered, and the close writes it
    (it was lost: a session's last turn missing from its journal after a clean stop)."""
    journal = Journal(tmp_path, JournalLimits(flush_interval_ms=0))
    writer = await journal.open_writer(meta())
    log = EventLog("sess-1", epoch="epoch-1", sink=writer.sink)
    limiter = journal_limiter()
    holders = [object() for _ in range(int(limiter.total_tokens))]
    for holder in holders:  # every journal thread busy elsewhere
        limiter.acquire_on_behalf_of_nowait(holder)
    stopping = trio.CancelScope()

    async def flusher(task_status: trio.TaskStatus[None]) -> None:
        with stopping:
            await writer.run(task_status=task_status)

    async with trio.open_nursery() as nursery:
        await nursery.start(flusher)
        await publish(log, 20)
        with trio.fail_after(5):
            await progress(lambda: writer.statistics()["bufferedEvents"] == 0)  # taken...
        assert writer.statistics()["eventsWritten"] == 0  # ...and waiting for a thread
        stopping.cancel()  # the daemon stops
        await trio.testing.wait_all_tasks_blocked()  # the cancel taken, the close waiting
        for holder in holders:  # the other journals' writes end
            limiter.release_on_behalf_of(holder)
    await writer.aclose()
    replay = Journal(tmp_path).load("sess-1")
    assert replay.last_id == 20 and replay.clean


async def test_concurrent_sessions_stay_separate(make: MakeJournal) -> None:
    journal = make(JournalLimits(segment_bytes=64 * 1024))
    sessions = [f"s{i}" for i in range(8)] + ["weird/../id", "ünïcode id"]
    published: dict[str, Published] = {sid: [] for sid in sessions}
    writers = {sid: await journal.open_writer(meta(sid, epoch=f"e-{sid}")) for sid in sessions}

    async def session(sid: str, nursery: trio.Nursery) -> None:
        log = EventLog(sid, epoch=f"e-{sid}")
        tee(log, writers[sid], published[sid])
        await nursery.start(writers[sid].run)
        await publish(log, 1500 + sessions.index(sid) * 100, yield_every=7)
        await writers[sid].aclose()

    async with trio.open_nursery() as nursery:
        for sid in sessions:
            nursery.start_soon(session, sid, nursery)
    listed = await journal.list_sessions()
    assert sorted(m.session_id for m in listed) == sorted(sessions)
    for sid in sessions:
        replay = await journal.read(sid)
        assert replay.clean and replay.meta.epoch == f"e-{sid}"
        assert [tuple(r) for r in replay] == published[sid]
        assert replay.count == 1500 + sessions.index(sid) * 100
    stats = journal.statistics()
    assert stats["openWriters"] == 0
    assert stats["eventsWritten"] == sum(len(p) for p in published.values())


async def test_overload_sheds_and_the_journal_restarts_after_the_gap(make: MakeJournal) -> None:
    limits = JournalLimits(max_buffer_bytes=64 * 1024, flush_batch_bytes=16 * 1024)
    journal = make(limits)
    writer = await journal.open_writer(meta())
    log = EventLog("sess-1", epoch="epoch-1", sink=writer.sink)
    await publish(log, 1000)  # ~200 KiB with nobody flushing
    stats = writer.statistics()
    assert writer.degraded and writer.shedding and stats["droppedEvents"] > 0
    assert stats["bufferedBytes"] <= 64 * 1024
    accepted = 1000 - stats["droppedEvents"]
    await writer.flush()
    assert not writer.shedding and writer.degraded  # degraded is sticky
    assert (await make().read("sess-1")).last_id == accepted
    await publish(log, 10, start=1000)
    await writer.aclose()
    replay = await journal.read("sess-1")
    # One gap-free run: the events after the gap only; the log's last id is on disk.
    assert [r.event_id for r in replay] == list(range(1001, 1011))
    assert replay.clean and writer.statistics()["resets"] == 1
    assert journal.statistics()["droppedEvents"] == stats["droppedEvents"]


async def test_an_event_larger_than_the_buffer_bound_is_kept_when_the_buffer_is_empty(
    make: MakeJournal,
) -> None:
    limits = JournalLimits(max_buffer_bytes=64 * 1024, flush_batch_bytes=16 * 1024)
    journal = make(limits)
    writer = await journal.open_writer(meta())
    published: Published = []
    log = EventLog("sess-1", epoch="epoch-1")
    tee(log, writer, published)
    log.publish("tool_call_update", {"content": "z" * 200_000})  # empty buffer: kept
    log.publish("session_update", {"small": 1})  # fits beside it? no: over the bound
    assert writer.dropped_events == 1 and writer.shedding
    await writer.flush()
    log.publish("session_update", {"small": 2})
    await writer.aclose()
    replay = await journal.read("sess-1")
    assert [tuple(r) for r in replay] == published[2:]  # the gap reset the journal
    # Without the second event in between, the big one stays in the journal.
    writer = await journal.open_writer(meta("sess-2"))
    published = []
    log = EventLog("sess-2")
    tee(log, writer, published)
    log.publish("tool_call_update", {"content": "z" * 200_000})
    await writer.flush()
    log.publish("session_update", {"small": 1})
    await writer.aclose()
    replay = await journal.read("sess-2")
    assert [tuple(r) for r in replay] == published and not writer.degraded


async def test_closing_while_shedding_is_not_clean(make: MakeJournal) -> None:
    limits = JournalLimits(max_buffer_bytes=32 * 1024, flush_batch_bytes=8 * 1024)
    journal = make(limits)
    writer = await journal.open_writer(meta())
    log = EventLog("sess-1", epoch="epoch-1", sink=writer.sink)
    await publish(log, 500)
    await writer.aclose()
    replay = await journal.read("sess-1")
    assert replay.last_id is not None and replay.last_id < 500 and not replay.clean
    assert [r.event_id for r in replay] == list(range(1, replay.last_id + 1))


async def test_a_failed_write_is_retried_without_loss_or_duplicates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = Journal(tmp_path, JournalLimits(retry_interval_ms=5))
    writer = await journal.open_writer(meta())
    published: Published = []
    log = EventLog("sess-1", epoch="epoch-1")
    tee(log, writer, published)
    await publish(log, 100)
    await writer.flush()
    failures = {"left": 3}
    real = store._datasync

    def flaky(fd: int) -> None:
        if failures["left"]:
            failures["left"] -= 1
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(store, "_datasync", flaky)
    await publish(log, 100, start=100)
    with pytest.raises(JournalIOError) as info:
        await writer.flush()
    assert info.value.session_id == "sess-1" and isinstance(info.value.__cause__, OSError)
    assert writer.degraded and writer.write_errors == 1
    # The flusher task keeps retrying while more events arrive.
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            await publish(log, 100, start=200)
            await progress(
                lambda: writer.next_id == 301 and not writer.statistics()["bufferedEvents"]
            )
            nursery.cancel_scope.cancel()
    assert writer.write_errors >= 2 and writer.statistics()["eventsWritten"] == 300
    await writer.aclose()
    replay = await journal.read("sess-1")
    assert [tuple(r) for r in replay] == published and replay.problems == ()


async def test_one_writer_per_session(make: MakeJournal) -> None:
    journal = make()
    writer = await journal.open_writer(meta())
    with pytest.raises(JournalBusy):
        await journal.open_writer(meta())
    with pytest.raises(JournalBusy):  # another daemon on the same state directory
        await make().open_writer(meta())
    await writer.aclose()
    if not isinstance(journal, Journal):
        return
    # An flock held elsewhere (another process) also refuses the writer.
    fd = store.try_lock(journal.session_dir("sess-1"))
    assert fd is not None
    try:
        with pytest.raises(JournalBusy):
            await journal.open_writer(meta())
    finally:
        store.release_lock(fd)
    writer = await journal.open_writer(meta())
    await writer.aclose()


async def test_open_writer_repairs_a_torn_tail_and_continues(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    writer = await journal.open_writer(meta())
    log = EventLog("sess-1", epoch="epoch-1", sink=writer.sink)
    await publish(log, 100)
    await writer.aclose()
    [segment] = store.list_segments(journal.session_dir("sess-1"))
    with segment.path.open("r+b") as f:
        f.truncate(segment.size - 10)  # tear the last record
    writer = await journal.open_writer(meta(epoch="epoch-2"))
    assert writer.next_id == 100
    replay_before = Journal(tmp_path).load("sess-1")
    assert replay_before.last_id == 99 and not replay_before.clean
    log = EventLog("sess-1", epoch="epoch-2", next_id=100, sink=writer.sink)
    await publish(log, 5)
    await writer.aclose()
    replay = await journal.read("sess-1")
    assert [r.event_id for r in replay] == list(range(1, 105)) and replay.clean
    assert replay.meta.epoch == "epoch-2"


async def test_fresh_writer_discards_old_events(make: MakeJournal) -> None:
    journal = make()
    writer = await journal.open_writer(meta())
    await publish(EventLog("sess-1", sink=writer.sink), 30)
    await writer.aclose()
    writer = await journal.open_writer(meta(epoch="new"), fresh=True)
    assert writer.next_id is None
    await publish(EventLog("sess-1", sink=writer.sink), 3)
    await writer.aclose()
    replay = await journal.read("sess-1")
    assert [r.event_id for r in replay] == [1, 2, 3] and replay.meta.epoch == "new"


async def test_update_meta(make: MakeJournal) -> None:
    journal = make()
    writer = await journal.open_writer(meta())
    new = msgspec.structs.replace(writer.meta, acp_session_id="acp-2", origin="resume")
    await writer.update_meta(new)
    assert (await journal.read("sess-1")).meta == new
    with pytest.raises(ValueError):
        await writer.update_meta(meta("other"))
    await writer.aclose()
    assert (await journal.read("sess-1")).meta == new


async def test_delete_closes_the_writer_and_removes_the_journal(make: MakeJournal) -> None:
    journal = make()
    writer = await journal.open_writer(meta())
    log = EventLog("sess-1", sink=writer.sink)
    await publish(log, 10)
    assert await journal.delete("sess-1")
    assert writer.closed
    log.publish("late", {})  # ignored, no error
    assert writer.ignored_after_close == 1
    assert not isinstance(journal, Journal) or not journal.session_dir("sess-1").exists()
    assert await journal.list_sessions() == []
    with pytest.raises(JournalNotFound):
        await journal.read("sess-1")
    assert not await journal.delete("sess-1")


async def test_list_sessions_skips_what_is_not_a_journal(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    assert await journal.list_sessions() == []  # no directory yet
    for sid in ("b", "a"):
        writer = await journal.open_writer(meta(sid))
        await writer.aclose()
    (journal.root / "junk").mkdir()
    (journal.root / "bad-meta").mkdir()
    (journal.root / "bad-meta" / "meta.json").write_text("{not json")
    (journal.root / "stray-file").write_text("x")
    # A directory whose meta names another session (copied by hand) is not that session.
    (journal.root / "impostor").mkdir()
    (journal.root / "impostor" / "meta.json").write_bytes(
        (journal.session_dir("a") / "meta.json").read_bytes()
    )
    assert [m.session_id for m in await journal.list_sessions()] == ["a", "b"]
    with pytest.raises(JournalNotFound):
        await journal.read("bad-meta")
    with pytest.raises(JournalNotFound):
        await journal.read("impostor")


async def test_statistics_report_progress(make: MakeJournal) -> None:
    journal = make()
    writer = await journal.open_writer(meta())
    await publish(EventLog("sess-1", sink=writer.sink), 10)
    stats = writer.statistics()
    assert stats["bufferedEvents"] == 10 and stats["bufferedBytes"] > 0
    await writer.flush()
    stats = writer.statistics()
    assert stats["bufferedEvents"] == 0 and stats["eventsWritten"] == 10
    assert stats["bytesWritten"] == stats["diskBytes"] and stats["lastId"] == 10
    assert json.loads(json.dumps(journal.statistics()))["openWriters"] == 1
    await writer.aclose()


@pytest.mark.parametrize(
    "kw",
    [
        {"segment_bytes": 2, "max_session_bytes": 1},
        {"segment_bytes": 0},
        {"flush_batch_bytes": 10, "max_buffer_bytes": 5},
        {"flush_interval_ms": -1},
    ],
)
def test_limits_are_validated(kw: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        JournalLimits(**kw)
