"""The PostgreSQL journal: the files journal's contract on one database, with fenced leases.

``--journal-url postgresql://...`` makes the daemon build a :class:`PgJournal` instead of
the files :class:`serve.journal.journal.Journal`; both are a
:class:`serve.journal.backend.JournalBackend`. docs/postgres-journal.md has the schema
(migrations/), the guarantees and the lease design; in short:

* **Connections.** One bounded ``psycopg_pool.ConnectionPool`` (``DATABASE_THREADS``
  connections), opened on first use with the migrations applied (:mod:`.schema`). The
  driver is synchronous: every call runs in a worker thread under
  :func:`serve.threads.database_limiter` (as many threads as connections), never on the
  trio thread.
* **Leases.** Opening a writer acquires the session's lease (``session_leases``): free,
  expired, or already this daemon's (``owner_id``, kept in ``<state_dir>/daemon-id`` so a
  restarted daemon takes its own sessions back at once); each acquisition takes a new epoch
  from ``lease_epoch_seq``. Another daemon's live lease: :class:`JournalBusy`. The janitor
  service renews this daemon's leases every ``renew_interval_ms`` (one ``UPDATE``, bounded
  by that interval); a lease found taken fences its writer (it stops writing, says so in
  the log). A clean close lets the lease expire at once.
* **Retention.** The janitor deletes closed sessions (no live lease) idle past
  ``retention_ms``, then, while the journal exceeds ``max_total_bytes``, closed ones oldest
  first, like the files janitor.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import trio
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool, PoolTimeout

from serve import threads
from serve.journal.format import JournalRecord
from serve.journal.pg.committer import DB_ERRORS, Connection, Cursor, PgAppender, PgSessionJournal
from serve.journal.pg.schema import migrate
from serve.journal.store import JournalMeta
from serve.journal.sweeps import SweepSchedule
from serve.journal.types import (
    FINAL_EVENTS,
    JournalBusy,
    JournalIOError,
    JournalLimits,
    JournalNotFound,
    Ownership,
    Replay,
)
from serve.journal.writer import SessionJournal
from serve.threads import DATABASE_THREADS, database_limiter

log = logging.getLogger(__name__)

#: A lease not renewed for this long is free for another daemon to take.
LEASE_TTL_MS = 20_000
#: How often the owner renews its leases (and the bound on one renewal).
RENEW_INTERVAL_MS = 5_000
#: Longest wait for a pooled connection, in seconds (then the call fails: JournalIOError).
POOL_TIMEOUT_S = 10.0
DAEMON_ID_FILE = "daemon-id"
#: Other daemons asked for their sessions by a cluster-wide list (daemons).
MAX_PEERS = 64
#: The advisory lock class of daemon liveness ("aclv"; migration 002): a live daemon holds
#: ``(LIVENESS_LOCK, hashtext(owner_id))`` on a connection of its own.
LIVENESS_LOCK = 0x61636C76
#: Tries (one every LIVENESS_RETRY_S) to take the liveness lock at start: a restarted
#: daemon's previous backend may take a moment to end.
LIVENESS_TRIES = 20
LIVENESS_RETRY_S = 0.25

_meta_decoder = msgspec.json.Decoder(JournalMeta)
_meta_encoder = msgspec.json.Encoder()


def _url_for_log(url: str) -> str:
    """The URL without its password."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "postgresql://?"
    host, db = info.get("host", ""), info.get("dbname", "")
    return f"postgresql://{host}/{db}"


class PgJournal:
    """The daemon's journal on PostgreSQL. See the module docstring."""

    def __init__(
        self,
        url: str,
        limits: JournalLimits | None = None,
        *,
        state_dir: str | os.PathLike[str] | None = None,
        owner_id: str | None = None,
        address: str | Callable[[], str] = "",
        lease_ttl_ms: int = LEASE_TTL_MS,
        renew_interval_ms: int = RENEW_INTERVAL_MS,
        pool_size: int = DATABASE_THREADS,
    ) -> None:
        if not 0 < renew_interval_ms < lease_ttl_ms:
            raise ValueError("need 0 < renew_interval_ms < lease_ttl_ms")
        self.url = url
        self.limits = limits or JournalLimits()
        self.state_dir = Path(state_dir) if state_dir is not None else None
        self.owner_id = owner_id
        #: How other daemons reach this one (``owner_address``): the daemon's URL, known
        #: once it listens (a function of the runtime's), written on acquire and renewal.
        self._address = address
        self.lease_ttl_ms = lease_ttl_ms
        self.renew_interval_ms = renew_interval_ms
        self.pool_size = min(pool_size, DATABASE_THREADS)
        self._pool: ConnectionPool[Connection] | None = None
        #: The connection holding this daemon's liveness lock (worker threads only).
        self._alive_conn: Connection | None = None
        self._ready = trio.Lock()
        self._closed = False
        self._writers: dict[str, PgSessionJournal | None] = {}
        self.bytes_written = 0
        self.events_written = 0
        self.dropped_events = 0
        self.gil_naps = 0
        self.next_gil_nap = 0.0
        self.swept_journals = 0
        self.swept_bytes = 0
        self.disk_bytes = 0
        self.renewals = 0
        self.leases_lost = 0
        self._sweeps = SweepSchedule()

    # ---- connections ---------------------------------------------------------------------

    async def start(self) -> None:
        """Open the pool and apply the migrations (once; the first caller does it)."""
        async with self._ready:
            if self._closed:
                raise JournalIOError("*", "the journal is closed")
            if self._pool is None:
                self._pool = await threads.run_sync(database_limiter(), self._start_sync)

    def _start_sync(self) -> ConnectionPool[Connection]:
        if self.owner_id is None:
            self.owner_id = _daemon_id(self.state_dir)
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                applied = migrate(conn)
            pool: ConnectionPool[Connection] = ConnectionPool(
                self.url,
                min_size=1,
                max_size=self.pool_size,
                timeout=POOL_TIMEOUT_S,
                kwargs={"autocommit": True},
                configure=self._configure,
                open=False,
                name="acp-serve-journal",
            )
            pool.open(wait=True, timeout=POOL_TIMEOUT_S)
            self._hold_liveness()
        except (psycopg.Error, PoolTimeout) as exc:
            raise JournalIOError("*", f"database {_url_for_log(self.url)}: {exc}") from exc
        if applied:
            log.info("journal database %s: migrations %s applied", _url_for_log(self.url), applied)
        return pool

    def _configure(self, conn: Connection) -> None:
        """Every pooled connection (worker thread): a transaction left open longer than a
        renewal interval is ended by the server. A daemon frozen (or cut off) inside a
        batch holds the lock the fence takes on the session's lease; without this another
        daemon's takeover would wait for it for as long as it stays frozen."""
        conn.execute(
            "SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
            (str(self.renew_interval_ms),),
        )

    def _hold_liveness(self) -> None:
        """Take this daemon's liveness lock on a connection of its own (worker thread).
        Held, other daemons see this one alive (``journal_owner_alive``); when this
        process dies PostgreSQL ends the connection and they may take its sessions at once."""
        old, self._alive_conn = self._alive_conn, None
        if old is not None:
            old.close()
        conn = psycopg.connect(self.url, autocommit=True)
        for _ in range(LIVENESS_TRIES):
            row = conn.execute(
                "SELECT pg_try_advisory_lock(%s, hashtext(%s))", (LIVENESS_LOCK, self.owner_id)
            ).fetchone()
            if row is not None and row[0]:
                self._alive_conn = conn
                return
            time.sleep(LIVENESS_RETRY_S)
        conn.close()
        log.error(
            "journal owner id %s: another live daemon holds its liveness lock (two daemons on "
            "one --state-dir?); other daemons may take this one's sessions",
            self.owner_id,
        )

    def _check_liveness(self) -> None:
        """Keep the liveness lock (worker thread, every renewal): a connection that was lost
        (the database restarted, a network cut) is made again and the lock taken again."""
        conn = self._alive_conn
        try:
            if conn is not None and not conn.closed:
                conn.execute("SELECT 1")
                return
        except psycopg.Error:
            log.warning("journal liveness connection lost: taking the lock again")
        self._hold_liveness()

    async def _call[*Ts, T](self, sid: str, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        """``fn(*args)`` in a worker thread, the driver's errors as :class:`JournalIOError`."""
        await self.start()

        def guarded() -> T:
            try:
                return fn(*args)
            except psycopg.Error as exc:
                raise JournalIOError(sid, f"database: {exc}") from exc
            except DB_ERRORS as exc:
                raise JournalIOError(sid, f"database: {exc}") from exc

        return await threads.run_sync(database_limiter(), guarded)

    @property
    def address(self) -> str:
        return self._address if isinstance(self._address, str) else self._address()

    @property
    def pool(self) -> ConnectionPool[Connection]:
        assert self._pool is not None, "PgJournal.start() first"
        return self._pool

    # ---- writing -------------------------------------------------------------------------

    @property
    def writers(self) -> list[PgSessionJournal]:
        return [w for w in self._writers.values() if w is not None]

    def writer_closed(self, writer: SessionJournal) -> None:
        if self._writers.get(writer.session_id) is writer:
            del self._writers[writer.session_id]
        self.request_sweep()

    async def open_writer(self, meta: JournalMeta, *, fresh: bool = False) -> PgSessionJournal:
        writer, _ = await self._start_writer(meta.session_id, self._open_sync, meta, fresh)
        return writer

    async def reopen(
        self, session_id: str, *, tail: int | None, meta_for: Callable[[Replay], JournalMeta]
    ) -> tuple[Replay, PgSessionJournal]:
        writer, replay = await self._start_writer(
            session_id, self._reopen_sync, session_id, tail, meta_for
        )
        return replay, writer

    async def _start_writer[*Ts, T](
        self, sid: str, open_sync: Callable[[*Ts], tuple[JournalMeta, PgAppender, T]], *args: *Ts
    ) -> tuple[PgSessionJournal, T]:
        if sid in self._writers:
            raise JournalBusy(sid, "a writer is already open in this daemon")
        self._writers[sid] = None
        try:
            meta, appender, extra = await self._call(sid, open_sync, *args)
        except BaseException:
            del self._writers[sid]
            raise
        writer = PgSessionJournal(self, meta, Path(f"postgresql:{sid}"), appender)
        self._writers[sid] = writer
        return writer, extra

    def _acquire(self, cur: Cursor, sid: str) -> int:
        """Take ``sid``'s lease (free, expired or ours) with a new epoch, or JournalBusy."""
        row = cur.execute(
            "INSERT INTO session_leases AS l"
            " (session_id, owner_id, epoch, expires_at, owner_address)"
            " VALUES (%s, %s, nextval('lease_epoch_seq'),"
            "  now() + %s * interval '1 millisecond', %s)"
            " ON CONFLICT (session_id) DO UPDATE SET owner_id = EXCLUDED.owner_id,"
            "  epoch = EXCLUDED.epoch, expires_at = EXCLUDED.expires_at,"
            "  owner_address = EXCLUDED.owner_address, acquired_at = now()"
            " WHERE l.expires_at <= now() OR l.owner_id = EXCLUDED.owner_id"
            "  OR NOT journal_owner_alive(l.owner_id)"
            " RETURNING epoch",
            (sid, self.owner_id, self.lease_ttl_ms, self.address),
        ).fetchone()
        if row is None:
            holder = cur.execute(
                "SELECT owner_id, owner_address FROM session_leases WHERE session_id = %s",
                (sid,),
            ).fetchone()
            who = f"{holder[0]} at {holder[1] or '?'}" if holder else "another daemon"
            raise JournalBusy(sid, f"its lease is held by {who}")
        return int(row[0])

    def _open_sync(self, meta: JournalMeta, fresh: bool) -> tuple[JournalMeta, PgAppender, None]:
        sid = meta.session_id
        with self.pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            epoch = self._acquire(cur, sid)
            if fresh:
                cur.execute("DELETE FROM journal_events WHERE session_id = %s", (sid,))
            row = cur.execute(
                "INSERT INTO journal_sessions AS s"
                " (session_id, meta, created_at_ms, lease_epoch) VALUES (%s, %s::jsonb, %s, %s)"
                " ON CONFLICT (session_id) DO UPDATE SET meta = EXCLUDED.meta,"
                "  clean_last_id = NULL, updated_at = now(), lease_epoch = EXCLUDED.lease_epoch,"
                "  next_id = CASE WHEN %s THEN NULL ELSE s.next_id END,"
                "  event_count = CASE WHEN %s THEN 0 ELSE s.event_count END,"
                "  total_bytes = CASE WHEN %s THEN 0 ELSE s.total_bytes END"
                " RETURNING next_id, event_count, total_bytes",
                (sid, _encode(meta), meta.created_at_ms, epoch, fresh, fresh, fresh),
            ).fetchone()
            assert row is not None
        return meta, self._appender(sid, epoch, row), None

    def _reopen_sync(
        self, sid: str, tail: int | None, meta_for: Callable[[Replay], JournalMeta]
    ) -> tuple[JournalMeta, PgAppender, Replay]:
        with self.pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            if _session_row(cur, sid) is None:
                raise JournalNotFound(sid, "no journal")
            epoch = self._acquire(cur, sid)
            replay = _read(cur, sid, tail)
            meta = meta_for(replay)
            row = cur.execute(
                "UPDATE journal_sessions SET meta = %s::jsonb, clean_last_id = NULL,"
                " updated_at = now(), lease_epoch = %s WHERE session_id = %s"
                " RETURNING next_id, event_count, total_bytes",
                (_encode(meta), epoch, sid),
            ).fetchone()
            assert row is not None
        return meta, self._appender(sid, epoch, row), replay

    def _appender(self, sid: str, epoch: int, row: TupleRow) -> PgAppender:
        next_id, count, total = row
        return PgAppender(
            self.pool,
            sid,
            epoch,
            next_id=None if next_id is None else int(next_id),
            count=int(count),
            total_bytes=int(total),
            max_bytes=self.limits.max_session_bytes,
            segment_bytes=self.limits.segment_bytes,
        )

    # ---- reading -------------------------------------------------------------------------

    async def read(self, session_id: str, *, tail: int | None = None) -> Replay:
        return await self._call(session_id, self._read_sync, session_id, tail)

    def _read_sync(self, sid: str, tail: int | None) -> Replay:
        with self.pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            return _read(cur, sid, tail)

    async def list_sessions(self) -> list[JournalMeta]:
        return await self._call("*", self._list_sync)

    def _list_sync(self) -> list[JournalMeta]:
        with self.pool.connection() as conn:
            rows = conn.execute(
                "SELECT meta::text FROM journal_sessions ORDER BY created_at_ms, session_id"
            ).fetchall()
        return [_meta_decoder.decode(str(r[0])) for r in rows]

    async def owner_of(self, session_id: str) -> Ownership | None:
        """Who holds ``session_id`` and whether it may be taken (None: no journal of it)."""
        return await self._call(session_id, self._owner_sync, session_id)

    def _owner_sync(self, sid: str) -> Ownership | None:
        with self.pool.connection() as conn:
            row = conn.execute(
                "SELECT l.owner_id, l.owner_address,"
                " coalesce(l.expires_at > now() AND journal_owner_alive(l.owner_id), false),"
                " (SELECT e.event_type FROM journal_events e WHERE e.session_id = s.session_id"
                "  ORDER BY e.event_id DESC LIMIT 1),"
                " s.meta->>'workspace',"
                " coalesce(extract(epoch FROM l.expires_at - now()) * 1000, 0)"
                " FROM journal_sessions s LEFT JOIN session_leases l USING (session_id)"
                " WHERE s.session_id = %s",
                (sid,),
            ).fetchone()
        if row is None:
            return None
        owner = None if row[0] is None else str(row[0])
        return Ownership(
            session_id=sid,
            owner_id=owner,
            address=str(row[1] or ""),
            alive=bool(row[2]),
            mine=owner is not None and owner == self.owner_id,
            ended=row[3] in FINAL_EVENTS,
            workspace=str(row[4] or ""),
            lease_left_ms=max(int(row[5] or 0), 0),
        )

    async def peers(self) -> list[str]:
        """The addresses of the other live daemons that own sessions (at most
        :data:`MAX_PEERS`)."""
        return await self._call("*", self._peers_sync)

    def _peers_sync(self) -> list[str]:
        with self.pool.connection() as conn:
            rows = conn.execute(
                "SELECT DISTINCT owner_address FROM session_leases"
                " WHERE expires_at > now() AND owner_id <> %s AND owner_address <> ''"
                " AND journal_owner_alive(owner_id) ORDER BY 1 LIMIT %s",
                (self.owner_id or "", MAX_PEERS),
            ).fetchall()
        return [str(r[0]) for r in rows]

    async def delete(self, session_id: str) -> bool:
        writer = self._writers.get(session_id)
        if writer is not None:
            await writer.aclose(discard=True)
        return await self._call(session_id, self._delete_sync, session_id)

    def _delete_sync(self, sid: str) -> bool:
        with self.pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            holder = cur.execute(
                "SELECT owner_id FROM session_leases WHERE session_id = %s"
                " AND expires_at > now() FOR UPDATE",
                (sid,),
            ).fetchone()
            if holder is not None and holder[0] != self.owner_id:
                raise JournalBusy(sid, f"its lease is held by {holder[0]}")
            cur.execute("DELETE FROM session_leases WHERE session_id = %s", (sid,))
            cur.execute("DELETE FROM journal_sessions WHERE session_id = %s", (sid,))
            return bool(cur.rowcount > 0)

    # ---- the service: lease renewal and the janitor ----------------------------------------

    def request_sweep(self) -> None:
        self._sweeps.request()

    async def run_janitor(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Renew the leases (every ``renew_interval_ms``) and sweep (at start, every
        ``sweep_interval_ms``, after a close), in one nursery, until cancelled. A database
        that cannot be reached at start is retried every ``RENEW_INTERVAL_MS`` (logged), not
        raised: the service's supervisor would only restart it to fail again."""
        task_status.started()
        while True:
            try:
                await self.start()
                break
            except JournalIOError as exc:
                if self._closed:
                    return
                log.warning("journal database unreachable (retrying): %s", exc)
                await trio.sleep(self.renew_interval_ms / 1000)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.run_renewer)
            await self._sweeps.run(self.sweep, self.limits.sweep_interval_ms / 1000)

    async def run_renewer(self) -> None:
        interval = self.renew_interval_ms / 1000
        while True:
            await trio.sleep(interval)
            with trio.move_on_after(interval) as scope:
                try:
                    await self.keep_alive()
                    await self.renew()
                except JournalIOError as exc:
                    log.warning("journal leases not renewed: %s", exc)
            if scope.cancelled_caught:
                log.warning("journal leases not renewed within %.1f s", interval)

    async def renew(self) -> int:
        """Extend every open writer's lease; fence the writers whose lease was taken.
        Returns how many were renewed."""
        self._tell_lost()
        writers = {w.session_id: w for w in self.writers if not w.closed and not w.fenced}
        if not writers:
            return 0
        pairs = [(sid, w.epoch) for sid, w in writers.items()]
        kept = await self._call("*", self._renew_sync, pairs)
        self.renewals += 1
        for sid, writer in writers.items():
            if sid not in kept and not writer.closed:
                self.leases_lost += 1
                writer.lease_lost("not renewed: another daemon holds it")
        self._tell_lost()
        return len(kept)

    def _tell_lost(self) -> None:
        """Tell each fenced writer's session, once delivered, that its lease is lost."""
        for writer in self.writers:
            told = writer.on_lease_lost
            if writer.fenced and told is not None and told():
                writer.on_lease_lost = None

    async def keep_alive(self) -> None:
        """Check (and if lost, take again) this daemon's liveness lock."""
        await self._call("*", self._check_liveness)

    def _renew_sync(self, pairs: list[tuple[str, int]]) -> set[str]:
        with self.pool.connection() as conn:
            rows = conn.execute(
                "UPDATE session_leases AS l SET expires_at = now() + %s * interval '1 millisecond',"
                " owner_address = %s"
                " FROM unnest(%s::text[], %s::bigint[]) AS o(session_id, epoch)"
                " WHERE l.session_id = o.session_id AND l.epoch = o.epoch AND l.owner_id = %s"
                " RETURNING l.session_id",
                (
                    self.lease_ttl_ms,
                    self.address,
                    [p[0] for p in pairs],
                    [p[1] for p in pairs],
                    self.owner_id,
                ),
            ).fetchall()
        return {str(r[0]) for r in rows}

    async def sweep(self) -> int:
        return await self._call("*", self._sweep_sync)

    def _sweep_sync(self) -> int:
        limits = self.limits
        mine = list(self._writers)
        closed = (
            " NOT EXISTS (SELECT 1 FROM session_leases l WHERE l.session_id = s.session_id"
            " AND l.expires_at > now()) AND NOT s.session_id = ANY(%(mine)s)"
        )
        removed: list[tuple[str, int]] = []
        with self.pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            if limits.retention_ms:
                cur.execute(
                    "DELETE FROM journal_sessions s WHERE s.updated_at < now() - "
                    " %(ms)s * interval '1 millisecond' AND" + closed + " RETURNING"
                    " s.session_id, s.total_bytes",
                    {"ms": limits.retention_ms, "mine": mine},
                )
                removed += [(str(r[0]), int(r[1])) for r in cur.fetchall()]
            sums = cur.execute("SELECT coalesce(sum(total_bytes), 0) FROM journal_sessions")
            total = int(next(iter(sums))[0])
            if limits.max_total_bytes and total > limits.max_total_bytes:
                rows = cur.execute(
                    "SELECT s.session_id, s.total_bytes FROM journal_sessions s WHERE"
                    + closed
                    + " ORDER BY s.updated_at",
                    {"mine": mine},
                ).fetchall()
                for sid, size in rows:
                    if total <= limits.max_total_bytes:
                        break
                    cur.execute("DELETE FROM journal_sessions WHERE session_id = %s", (sid,))
                    total -= int(size)
                    removed.append((str(sid), int(size)))
            for sid, _size in removed:
                cur.execute(
                    "DELETE FROM session_leases WHERE session_id = %s AND expires_at <= now()",
                    (sid,),
                )
        for sid, size in removed:
            self.swept_journals += 1
            self.swept_bytes += size
            log.info("journal of %s deleted (retention or total bound, %d bytes)", sid, size)
        self.disk_bytes = total
        return len(removed)

    async def flush(self) -> None:
        for writer in self.writers:
            if not writer.closed:
                await writer.flush()

    async def aclose(self) -> None:
        for writer in self.writers:
            await writer.aclose()
        self._closed = True
        pool, self._pool = self._pool, None
        with trio.CancelScope(shield=True):
            if pool is not None:
                await threads.run_sync(database_limiter(), pool.close)
            await self.release_liveness()

    async def release_liveness(self) -> None:
        """Close the liveness connection: other daemons see this one dead from now on
        (its close; the tests' stand-in for a SIGKILL)."""
        alive, self._alive_conn = self._alive_conn, None
        if alive is not None:
            await threads.run_sync(database_limiter(), alive.close)

    def statistics(self) -> dict[str, Any]:
        writers = self.writers
        return {
            "backend": "postgresql",
            "database": _url_for_log(self.url),
            "ownerId": self.owner_id,
            "openWriters": len(writers),
            "bytesWritten": self.bytes_written,
            "eventsWritten": self.events_written,
            "droppedEvents": self.dropped_events,
            "gilNaps": self.gil_naps,
            "diskBytes": self.disk_bytes,
            "sweptJournals": self.swept_journals,
            "sweptBytes": self.swept_bytes,
            "leaseRenewals": self.renewals,
            "leasesLost": self.leases_lost,
            "degradedSessions": sorted(w.session_id for w in writers if w.degraded),
            "fencedSessions": sorted(w.session_id for w in writers if w.fenced),
        }


def _encode(meta: JournalMeta) -> str:
    return _meta_encoder.encode(meta).decode()


def _session_row(cur: Cursor, sid: str) -> TupleRow | None:
    return cur.execute(
        "SELECT meta::text, clean_last_id, next_id FROM journal_sessions WHERE session_id = %s",
        (sid,),
    ).fetchone()


def _read(cur: Cursor, sid: str, tail: int | None) -> Replay:
    """A session's journal as a :class:`Replay` (the database never holds a torn tail)."""
    row = _session_row(cur, sid)
    if row is None:
        raise JournalNotFound(sid, "no journal")
    try:
        meta = _meta_decoder.decode(str(row[0]))
    except msgspec.DecodeError as exc:
        raise JournalNotFound(sid, f"unreadable meta: {exc}") from exc
    clean_last_id = row[1]
    stats = cur.execute(
        "SELECT count(*), min(event_id), max(event_id) FROM journal_events WHERE session_id = %s",
        (sid,),
    ).fetchone()
    assert stats is not None
    count, first, last = int(stats[0]), stats[1], stats[2]
    limit = count if tail is None else max(tail, 0)
    rows = cur.execute(
        "SELECT event_id, event_type, frame FROM journal_events WHERE session_id = %s"
        " ORDER BY event_id DESC LIMIT %s",
        (sid, limit),
    ).fetchall()
    records = [JournalRecord(int(r[0]), str(r[1]), bytes(r[2])) for r in reversed(rows)]
    last_id = None if last is None else int(last)
    return Replay(
        meta=meta,
        records=records,
        count=count,
        first_id=None if first is None else int(first),
        last_id=last_id,
        next_id=(last_id + 1) if last_id is not None else 1,
        clean=clean_last_id is not None and int(clean_last_id) == (last_id or 0),
        cut_bytes=0,
        problems=(),
    )


def _daemon_id(state_dir: Path | None) -> str:
    """This daemon's lease owner id: ``<state_dir>/daemon-id`` (made once), so a restarted
    daemon owns what it owned; a fresh random id without a state directory."""
    if state_dir is None:
        return uuid.uuid4().hex
    path = state_dir / DAEMON_ID_FILE
    try:
        return path.read_text().strip() or _write_id(path)
    except FileNotFoundError:
        return _write_id(path)


def _write_id(path: Path) -> str:
    value = uuid.uuid4().hex
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(value + "\n")
    os.replace(tmp, path)
    return value
