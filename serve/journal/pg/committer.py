"""One session's writer on PostgreSQL: the files writer's hot path, batches as transactions.

:class:`PgSessionJournal` is a :class:`serve.journal.writer.SessionJournal` (the same sink,
flusher, overload shedding, flush and close semantics) whose batches go to
:class:`PgAppender` instead of segment files, whose meta goes to ``journal_sessions`` and
whose blocking steps run under the database limiter (:func:`serve.threads.database_limiter`).

A batch is one transaction: the fence (an ``UPDATE`` of the session row with the writer's
lease epoch, checked by its trigger under the lease's lock), the runs' rows (one ``INSERT``
per run, each row carrying the epoch) and the session row (``next_id``, counts) commit
together or not at all, so the ids in the table are always one gap-free run. A run that
does not continue the journal (events the sink shed) deletes the older events first, in
the same transaction, exactly like the files appender's reset. Past ``max_session_bytes``
the oldest events go, down to ``max_session_bytes - segment_bytes`` (the files journal
drops a segment at a time).

Fencing: the database refuses a row whose epoch is not the session's current lease epoch
(``journal_fence`` in migrations/001_init.sql). A refused batch (SQLSTATE ``AS001``) means
another daemon took the session over: the writer is *fenced* from then on: it says so
once in the log, drops what it buffered and every later event, and its close writes no
clean marker. A lost connection is an ``OSError`` to the flusher (the batch is retried).
"""

from __future__ import annotations

import logging
import struct
from typing import TYPE_CHECKING, Any

import msgspec
import psycopg
import trio
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool, PoolTimeout

from serve.journal.store import JournalMeta, MetaFile, Run
from serve.journal.writer import SessionJournal, WriterHome
from serve.threads import database_limiter

if TYPE_CHECKING:
    from pathlib import Path

log = logging.getLogger(__name__)

#: SQLSTATE the fence raises (a stale lease epoch).
FENCED_SQLSTATE = "AS001"
_HEAD = struct.Struct("<IQH")  # the record head (serve.journal.format): length, id, type length
_meta_encoder = msgspec.json.Encoder()
#: The driver's connection and cursor as the journal uses them (rows as tuples).
Connection = psycopg.Connection[TupleRow]
Cursor = psycopg.Cursor[TupleRow]


#: The driver's errors that mean "the database cannot be reached or failed".
DB_ERRORS: tuple[type[Exception], ...] = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    PoolTimeout,
)


def is_fenced(exc: BaseException) -> bool:
    return isinstance(exc, psycopg.Error) and exc.sqlstate == FENCED_SQLSTATE


class PgAppender:
    """Appends a writer's runs to ``journal_events`` (blocking; one call at a time)."""

    def __init__(
        self,
        pool: ConnectionPool[Connection],
        session_id: str,
        epoch: int,
        *,
        next_id: int | None,
        count: int,
        total_bytes: int,
        max_bytes: int,
        segment_bytes: int,
    ) -> None:
        self.pool = pool
        self.session_id = session_id
        self.epoch = epoch
        self.next_id = next_id
        self.count = count
        self.disk_bytes = total_bytes  # type + frame bytes kept in the table
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.fenced = False
        self.bytes_written = 0
        self.records_written = 0
        self.fsyncs = 0  # transactions committed
        self.resets = 0
        self.rotated_segments = 0  # rotations (oldest events deleted)

    @property
    def last_id(self) -> int | None:
        return None if self.next_id is None or self.count == 0 else self.next_id - 1

    def append(self, runs: list[Run]) -> int:
        """Write ``runs`` in one transaction. ``OSError``: the database failed (retry);
        a stale epoch fences this appender (the batch is dropped, 0 returned)."""
        if self.fenced:
            return 0
        next_id, count, total = self.next_id, self.count, self.disk_bytes
        written = resets = 0
        rotated = False
        sid, epoch = self.session_id, self.epoch
        try:
            with self.pool.connection() as conn, conn.transaction():
                with conn.cursor() as cur:
                    # The fence first (the session row's trigger locks the lease and
                    # checks the epoch), before a stale writer's rows could collide with
                    # the new owner's ids; the events' own trigger checks them again.
                    cur.execute(
                        "UPDATE journal_sessions SET lease_epoch = %s WHERE session_id = %s",
                        (epoch, sid),
                    )
                    for run in runs:
                        if not run.count:
                            continue
                        if next_id is not None and run.first_id != next_id:
                            cur.execute("DELETE FROM journal_events WHERE session_id = %s", (sid,))
                            count = total = 0
                            resets += 1
                        ids, types, frames = _columns(run)
                        cur.execute(
                            "INSERT INTO journal_events"
                            " (session_id, event_id, event_type, frame, lease_epoch)"
                            " SELECT %s, i, t, f, %s"
                            " FROM unnest(%s::bigint[], %s::text[], %s::bytea[]) AS u(i, t, f)",
                            (sid, epoch, ids, types, frames),
                        )
                        size = sum(map(len, types)) + sum(map(len, frames))
                        written += size
                        total += size
                        count += run.count
                        next_id = run.first_id + run.count
                    if self.max_bytes and total > self.max_bytes:
                        count, total = _rotate(cur, sid, self.max_bytes - self.segment_bytes)
                        rotated = True
                    cur.execute(
                        "UPDATE journal_sessions SET next_id = %s, event_count = %s,"
                        " total_bytes = %s, clean_last_id = NULL, updated_at = now(),"
                        " lease_epoch = %s WHERE session_id = %s",
                        (next_id, count, total, epoch, sid),
                    )
        except psycopg.Error as exc:
            if is_fenced(exc):
                self.fence(str(exc.diag.message_primary or exc))
                return 0
            raise OSError(f"database: {exc}") from exc
        except PoolTimeout as exc:
            raise OSError(f"database: {exc}") from exc
        self.next_id, self.count, self.disk_bytes = next_id, count, total
        self.records_written += sum(r.count for r in runs)
        self.bytes_written += written
        self.fsyncs += 1
        self.resets += resets
        self.rotated_segments += int(rotated)
        return written

    def fence(self, why: str) -> None:
        if not self.fenced:
            self.fenced = True
            log.error(
                "journal of session %s: lease lost (%s); this daemon stops writing it",
                self.session_id,
                why,
            )

    def store_meta(self, meta_file: MetaFile) -> None:
        """Replace the session row's meta (and the clean marker); fenced like the events."""
        if self.fenced:
            return
        try:
            with self.pool.connection() as conn:
                conn.execute(
                    "UPDATE journal_sessions SET meta = %s::jsonb, clean_last_id = %s,"
                    " updated_at = now(), lease_epoch = %s WHERE session_id = %s",
                    (
                        _meta_encoder.encode(meta_file.meta).decode(),
                        meta_file.clean_last_id,
                        self.epoch,
                        self.session_id,
                    ),
                )
        except psycopg.Error as exc:
            if is_fenced(exc):
                self.fence(str(exc.diag.message_primary or exc))
                return
            raise OSError(f"database: {exc}") from exc
        except PoolTimeout as exc:
            raise OSError(f"database: {exc}") from exc

    def release_lease(self) -> None:
        """Let the lease expire now (ours only: the epoch must still be current)."""
        if self.fenced:
            return
        try:
            with self.pool.connection() as conn:
                conn.execute(
                    "UPDATE session_leases SET expires_at = now()"
                    " WHERE session_id = %s AND epoch = %s",
                    (self.session_id, self.epoch),
                )
        except (psycopg.Error, PoolTimeout) as exc:
            log.warning("journal of session %s: lease not released: %s", self.session_id, exc)

    def close(self) -> None:
        """Nothing to close: connections go back to the pool after each call."""


def _columns(run: Run) -> tuple[list[int], list[str], list[bytes]]:
    """A run's records as columns (ids, types, frames), read back from the record heads
    (``serve.journal.format``: length, id, type length, then the type)."""
    parts = run.parts
    ids: list[int] = []
    types: list[str] = []
    frames: list[bytes] = []
    for i in range(0, len(parts), 3):
        head = parts[i]
        _length, event_id, type_len = _HEAD.unpack_from(head, 0)
        ids.append(event_id)
        types.append(bytes(head[_HEAD.size : _HEAD.size + type_len]).decode("utf-8"))
        frames.append(bytes(parts[i + 1]))
    return ids, types, frames


def _rotate(cur: Cursor, sid: str, keep_bytes: int) -> tuple[int, int]:
    """Delete the oldest events until at most ``keep_bytes`` remain (the newest one always
    stays); (events, bytes) left."""
    cur.execute(
        "DELETE FROM journal_events WHERE session_id = %(sid)s AND event_id < ("
        " SELECT coalesce(min(event_id), 0) FROM ("
        "  SELECT event_id, sum(length(frame) + length(event_type))"
        "   OVER (ORDER BY event_id DESC) AS kept"
        "  FROM journal_events WHERE session_id = %(sid)s) t"
        " WHERE kept <= %(keep)s OR event_id = ("
        "  SELECT max(event_id) FROM journal_events WHERE session_id = %(sid)s))",
        {"sid": sid, "keep": max(keep_bytes, 0)},
    )
    row = cur.execute(
        "SELECT count(*), coalesce(sum(length(frame) + length(event_type)), 0)"
        " FROM journal_events WHERE session_id = %s",
        (sid,),
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


class PgSessionJournal(SessionJournal):
    """A :class:`SessionJournal` writing to PostgreSQL under a lease (module docstring)."""

    def __init__(
        self, journal: WriterHome, meta: JournalMeta, label: Path, appender: PgAppender
    ) -> None:
        super().__init__(journal, meta, label, appender, None)
        self.pg = appender

    @property
    def epoch(self) -> int:
        """This writer's lease epoch."""
        return self.pg.epoch

    @property
    def fenced(self) -> bool:
        return self.pg.fenced

    def sink(self, event_id: int, event_type: str, frame: bytes) -> None:
        if self.pg.fenced:
            self.dropped_events += 1
            return
        super().sink(event_id, event_type, frame)

    def lease_lost(self, why: str) -> None:
        """The renewer found the lease taken (trio thread): stop writing."""
        self.pg.fence(why)

    def _limiter(self) -> trio.CapacityLimiter:
        return database_limiter()

    def _store_meta(self, meta_file: MetaFile) -> None:
        self.pg.store_meta(meta_file)

    def _release(self) -> None:
        self.pg.release_lease()

    def statistics(self) -> dict[str, Any]:
        stats = super().statistics()
        stats["leaseEpoch"] = self.pg.epoch
        stats["fenced"] = self.pg.fenced
        return stats
