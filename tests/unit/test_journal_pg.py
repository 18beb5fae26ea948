"""The PostgreSQL journal's own promises (its files-shared contract is in
test_journal_writer.py): fenced leases, renewal, the migrations, the janitor. A real
server (tests/support/postgres.py), several PgJournal objects as several daemons."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import psycopg
import pytest
import trio

from serve.events import EventLog
from serve.journal import JournalBusy, JournalLimits, JournalMeta
from serve.journal.pg import PgJournal
from serve.journal.pg.committer import FENCED_SQLSTATE, PgSessionJournal
from serve.journal.pg.schema import migrate, migrations

KIB = 1024
DAY_MS = 24 * 3600 * 1000
MakePg = Callable[..., PgJournal]


def meta(sid: str = "s1") -> JournalMeta:
    return JournalMeta(session_id=sid, epoch="e", workspace="/w", acp_session_id="a-" + sid)


@pytest.fixture
async def make(pg_url: str) -> AsyncIterator[MakePg]:
    """PgJournal factory on one fresh database; each one a daemon (its own owner id)."""
    made: list[PgJournal] = []

    def factory(limits: JournalLimits | None = None, **kw: object) -> PgJournal:
        journal = PgJournal(pg_url, limits, **kw)  # type: ignore[arg-type]
        made.append(journal)
        return journal

    yield factory
    for journal in made:
        await journal.aclose()


async def write(writer: PgSessionJournal, log: EventLog, n: int) -> None:
    for i in range(n):
        log.publish("session_update", {"n": i})
    await writer.flush()


def sql(url: str, query: str, *args: object) -> list[tuple[object, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(query.encode(), args or None)
        return cur.fetchall() if cur.description else []


async def test_a_writer_with_a_stale_epoch_is_refused_by_the_database(
    make: MakePg, pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Daemon A's lease lapses (it was frozen: no renewal); daemon B takes the session over
    with a larger epoch. A's next batch is refused by the database, not by A: A stops
    writing that session and says so; the journal holds A's events, then B's, no mix."""
    a = make(lease_ttl_ms=300, renew_interval_ms=100)
    b = make(lease_ttl_ms=300, renew_interval_ms=100)
    writer_a = await a.open_writer(meta())
    log_a = EventLog("s1", sink=writer_a.sink)
    await write(writer_a, log_a, 5)
    with pytest.raises(JournalBusy, match="lease is held by"):  # A's lease is live
        await b.open_writer(meta())
    sql(pg_url, "UPDATE session_leases SET expires_at = now()")  # A frozen past its lease
    replay, writer_b = await b.reopen("s1", tail=None, meta_for=lambda r: r.meta)
    assert writer_b.epoch > writer_a.epoch and replay.last_id == 5
    log_b = EventLog("s1", next_id=replay.next_id, sink=writer_b.sink)
    await write(writer_b, log_b, 3)

    # A comes back and writes: the database refuses; A is fenced and logs it once.
    caplog.set_level(logging.ERROR)
    await write(writer_a, log_a, 4)
    assert writer_a.fenced and writer_a.statistics()["fenced"]
    assert "lease lost" in caplog.text and "stale" in caplog.text
    log_a.publish("session_update", {"late": True})  # dropped at the sink from now on
    await writer_a.flush()
    await writer_a.aclose()  # no clean marker, lease not touched
    await writer_b.aclose()
    final = await b.read("s1")
    assert [r.event_id for r in final] == list(range(1, 9)) and final.clean
    epochs = sql(pg_url, "SELECT DISTINCT lease_epoch FROM journal_events ORDER BY 1")
    assert epochs == [(writer_a.epoch,), (writer_b.epoch,)]

    # The fence is the database's: a raw insert carrying the stale epoch fails too.
    with pytest.raises(psycopg.Error) as info:
        sql(
            pg_url,
            "INSERT INTO journal_events VALUES ('s1', 9, 't', 'x', %s)",
            writer_a.epoch,
        )
    assert info.value.sqlstate == FENCED_SQLSTATE


async def test_the_owner_renews_its_leases_and_a_lost_lease_stops_its_writes(
    make: MakePg, pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    a = make(lease_ttl_ms=400, renew_interval_ms=100)
    b = make(lease_ttl_ms=400, renew_interval_ms=100)
    writer = await a.open_writer(meta())
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run_janitor)
        with trio.fail_after(10):
            while a.renewals < 6:  # several TTLs' worth of renewals  # noqa: ASYNC110
                await trio.sleep(0.05)
        with pytest.raises(JournalBusy):  # renewed: still A's after 3 TTLs
            await b.open_writer(meta())
        # Another daemon took it (its lease expired meanwhile, say A was partitioned).
        sql(pg_url, "UPDATE session_leases SET expires_at = now()")
        writer_b = await b.open_writer(meta())
        caplog.set_level(logging.ERROR)
        with trio.fail_after(10):
            while not writer.fenced:  # noqa: ASYNC110
                await trio.sleep(0.05)
        assert a.leases_lost == 1 and "lease lost" in caplog.text
        nursery.cancel_scope.cancel()
    await writer.aclose()
    await writer_b.aclose()


async def test_a_restarted_daemon_takes_its_own_sessions_back_at_once(
    make: MakePg, tmp_path: object
) -> None:
    first = make(state_dir=tmp_path)
    writer = await first.open_writer(meta())
    epoch = writer.epoch
    # It dies without closing (its lease still live); the same daemon starts again.
    await first.release_liveness()
    again = make(state_dir=tmp_path)
    writer2 = await again.open_writer(meta())
    assert writer2.epoch > epoch and again.owner_id == first.owner_id
    await writer2.aclose()


async def test_a_dead_owners_sessions_are_taken_at_once_a_frozen_ones_after_their_lease(
    make: MakePg, pg_url: str
) -> None:
    """A live daemon holds its liveness lock: its unexpired lease is refused to others.
    When its process dies (its connection ends: here, closed) its sessions may be taken at
    once, long before the lease's 60 s; ``owner_of`` says who holds what, and where."""
    a = make(lease_ttl_ms=60_000, renew_interval_ms=10_000, address="http://127.0.0.1:1111")
    b = make(lease_ttl_ms=60_000, renew_interval_ms=10_000, address="http://127.0.0.1:2222")
    writer_a = await a.open_writer(meta())
    log_a = EventLog("s1", sink=writer_a.sink)
    await write(writer_a, log_a, 3)
    seen = await b.owner_of("s1")
    assert seen is not None and seen.alive and not seen.mine and not seen.ended
    assert (seen.owner_id, seen.address, seen.workspace) == (
        a.owner_id,
        "http://127.0.0.1:1111",
        "/w",
    )
    assert await b.owner_of("nope") is None
    with pytest.raises(JournalBusy, match=r"http://127\.0\.0\.1:1111"):
        await b.open_writer(meta())

    await a.release_liveness()  # A's process is gone: PostgreSQL ended its connection
    seen = await b.owner_of("s1")
    assert seen is not None and not seen.alive and seen.owner_id == a.owner_id
    replay, writer_b = await b.reopen("s1", tail=None, meta_for=lambda r: r.meta)
    assert writer_b.epoch > writer_a.epoch and replay.last_id == 3 and not replay.clean
    mine = await b.owner_of("s1")
    assert mine is not None and mine.alive and mine.mine and mine.address.endswith(":2222")
    log_b = EventLog("s1", next_id=replay.next_id, sink=writer_b.sink)
    log_b.publish("session_closed", {"reason": "closed"})
    await writer_b.aclose()
    ended = await a.owner_of("s1")
    assert ended is not None and ended.ended and not ended.alive


async def test_migrations_apply_once_and_record_their_version(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert migrate(conn) == [v for v, _, _ in migrations()]
        assert migrate(conn) == []
        rows = conn.execute("SELECT version, name FROM schema_version ORDER BY 1").fetchall()
    assert rows == [(1, "001_init.sql"), (2, "002_owner_liveness.sql")]


async def test_the_janitor_deletes_old_and_excess_closed_journals_never_a_leased_one(
    make: MakePg, pg_url: str
) -> None:
    limits = JournalLimits(
        max_session_bytes=64 * KIB,
        segment_bytes=16 * KIB,
        max_total_bytes=128 * KIB,
        retention_ms=DAY_MS,
    )
    journal = make(limits)
    other = make(limits)  # another daemon, holding "theirs"
    for sid in ("old", "c", "b", "a"):
        w = await journal.open_writer(meta(sid))
        log = EventLog(sid, sink=w.sink)
        for i in range(50):
            log.publish("session_update", {"pad": "x" * 1000, "i": i})
        await w.aclose()
    theirs = await other.open_writer(meta("theirs"))
    mine = await journal.open_writer(meta("mine"))
    mine_log = EventLog("mine", sink=mine.sink)
    for i in range(50):
        mine_log.publish("session_update", {"pad": "z" * 1000, "i": i})
    await mine.flush()  # open and large: counted in the total, never deleted
    sql(
        pg_url,
        "UPDATE journal_sessions SET updated_at = now() - interval '2 days'"
        " WHERE session_id IN ('old', 'theirs', 'mine')",
    )
    for age, sid in enumerate(("c", "b", "a")):
        sql(
            pg_url,
            f"UPDATE journal_sessions SET updated_at = now() - interval '{age + 1} min'"
            f" WHERE session_id = '{sid}'",
        )
    # retention: "old" (closed, 2 days); total bound: "a" then "b" (oldest closed first).
    assert await journal.sweep() == 3
    left = {m.session_id for m in await journal.list_sessions()}
    assert left == {"c", "theirs", "mine"}
    assert journal.disk_bytes <= 128 * KIB and journal.swept_journals == 3
    await theirs.aclose()
    await mine.aclose()


async def test_a_session_is_bounded_and_rotates_its_oldest_events(make: MakePg) -> None:
    journal = make(JournalLimits(max_session_bytes=64 * KIB, segment_bytes=16 * KIB))
    writer = await journal.open_writer(meta())
    log = EventLog("s1", sink=writer.sink)
    for i in range(300):
        log.publish("session_update", {"pad": "y" * 1000, "i": i})
        if i % 20 == 0:
            await writer.flush()
    await writer.aclose()
    replay = await journal.read("s1")
    ids = [r.event_id for r in replay]
    assert ids == list(range(ids[0], 301)) and ids[0] > 1  # the newest, gap-free
    assert sum(len(r.frame) + len(r.event_type) for r in replay) <= 64 * KIB
    assert writer.statistics()["rotatedSegments"] >= 1
