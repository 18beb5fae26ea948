"""A daemon frozen in the middle of a journal batch (SIGSTOP, or a network cut that leaves its
connection open) holds its transaction, and with it the lock the fence takes on the
session's lease. Another daemon's takeover must not wait for it past the lease: PostgreSQL
ends the frozen owner's idle transaction (found by the chaos test, tests/cluster)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import psycopg
import pytest
import trio

from serve.journal import JournalBusy, JournalMeta
from serve.journal.pg import PgJournal


@pytest.fixture
async def two(pg_url: str) -> AsyncIterator[tuple[PgJournal, PgJournal]]:
    a = PgJournal(pg_url, lease_ttl_ms=1000, renew_interval_ms=250)
    b = PgJournal(pg_url, lease_ttl_ms=1000, renew_interval_ms=250)
    yield a, b
    await a.aclose()
    await b.aclose()


async def test_a_takeover_does_not_wait_for_a_frozen_owners_open_batch(
    two: tuple[PgJournal, PgJournal],
) -> None:
    a, b = two
    meta = JournalMeta(session_id="s1", epoch="e", workspace="/w", acp_session_id="a-s1")
    writer = await a.open_writer(meta)
    # A's flusher froze inside a batch: the fenced first statement ran, no commit came.
    conn = a.pool.getconn()
    conn.autocommit = False
    conn.execute(
        "UPDATE journal_sessions SET lease_epoch = %s WHERE session_id = %s",
        (writer.epoch, "s1"),
    )
    began = trio.current_time()
    async with trio.open_nursery() as nursery:

        async def thaw_at_last() -> None:  # the old code waits for A as long as it is frozen
            await trio.sleep(8)
            conn.close()

        nursery.start_soon(thaw_at_last)
        # B takes the session once A's lease (1 s, not renewed meanwhile) expires.
        while True:
            try:
                _replay, taken = await b.reopen("s1", tail=None, meta_for=lambda r: r.meta)
                break
            except JournalBusy:  # until the lease expires
                await trio.sleep(0.1)
        took = trio.current_time() - began
        nursery.cancel_scope.cancel()
    assert taken.epoch > writer.epoch
    assert took < 4, f"the takeover waited {took:.1f} s for the frozen owner's transaction"
    # A's transaction was ended by the database: its commit fails, nothing of it stays.
    with pytest.raises(psycopg.Error):
        conn.commit()
    conn.close()
    a.pool.putconn(conn)
