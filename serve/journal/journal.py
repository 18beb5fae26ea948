"""The journal's trio layer: the daemon-wide :class:`Journal` and per-session writers.

Ownership
---------
The daemon owns one :class:`Journal` (a directory, limits, totals). Each live session owns
one :class:`SessionJournal` from :meth:`Journal.open_writer`: its ``sink`` goes to the
session's ``EventLog``, its ``run`` flusher task lives in the session actor's nursery,
and the actor calls ``aclose()`` when the session ends or the daemon drains. A writer
holds an exclusive ``flock`` on its session directory, so a second writer (this process
or another daemon on the same state directory) gets :class:`JournalBusy`.

Hot path
--------
``sink(event_id, event_type, frame)`` runs on the trio thread for every published event:
it encodes the record around the frame (a 14-byte head and a CRC32, ~0.5-1 µs; the frame
bytes are shared with the ring, not copied; the CRC of a frame of 64 KiB or more is left
to the writer thread, where ``zlib`` releases the GIL), appends the three parts to a list
and sets an event; no I/O. The ``run`` task wakes on the first buffered event, waits up to
``flush_interval_ms`` (less when ``flush_batch_bytes`` are buffered), swaps the buffer
and hands it to one worker thread (``trio.to_thread.run_sync``) which writes it with
``writev`` (no joined copy), ``fdatasync``s it, then rotates. The sink keeps filling a
fresh buffer while the thread writes; batches grow by themselves when the disk is slow.

The GIL: a Python worker thread facing a busy trio thread can be starved of the GIL
indefinitely (the trio thread releases and retakes it around every ``epoll_wait``,
which keeps restarting the waiter's 5 ms switch timer). So the worker is made to need
the GIL as rarely as possible (encoding is done in the sink; a batch is one ``join``,
one ``write``, one ``fdatasync``), and while a write is in flight with another batch
already buffered, ``run``'s companion task hands the GIL over by sleeping the trio
thread for 50 µs at most every 0.5 ms daemon-wide (see :meth:`SessionJournal._hand_over_gil`).
Measured on a saturated loop (``scripts/bench_journal.py``): without the hand-over most
of a 200k-event flood was shed; with it, none, at ~270k durable events/s.

Overload and disk failure
-------------------------
The buffer (buffered + in flight) is bounded by ``max_buffer_bytes`` (plus one event
larger than that, accepted only into an empty buffer, up to the format's 64 MiB record
limit; its frame bytes are the ring's anyway). The sink cannot
block (it would stall every session and the HTTP front on one slow disk), so past the
bound it *sheds*: events are dropped, ``degraded`` is set (sticky) and ``dropped_events``
counts them, until the flusher has emptied the buffer. The next accepted event does not
continue the journal, so the appender resets it: the journal restarts at that id and
stays one gap-free run (the history before the gap is gone; a client reconnecting into
it after a restart gets ``state_resync_required``). A failed write (``OSError``) puts the
batch back, counts ``write_errors``, sets ``degraded``, and is retried every
``retry_interval_ms``; the appender first re-derives its state from disk.

Shutdown and cancellation
-------------------------
``flush()`` returns once every event accepted before the call is written and fsynced
(or raises :class:`JournalIOError`). ``aclose()`` flushes (shielded), closes the segment,
writes the clean marker (``clean_last_id``) when the journal holds every event this writer
saw, and releases the lock; it never raises for I/O errors (they are logged). Cancelling
``run`` flushes what is buffered (shielded) but writes no clean marker: only ``aclose``
does. A clean marker is the only proof that no published id is missing from disk; see
:attr:`Replay.clean`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import trio

from serve import threads
from serve.journal.format import (
    DEFER_CRC_BYTES,
    MAX_RECORD_BYTES,
    RECORD_OVERHEAD_BYTES,
    JournalRecord,
    record_parts,
    record_parts_deferred,
)
from serve.journal.store import (
    JOURNAL_DIR,
    Appender,
    JournalMeta,
    MetaFile,
    Run,
    ScanResult,
    ensure_dir,
    fsync_dir,
    list_segments,
    now_ms,
    read_meta,
    release_lock,
    safe_name,
    scan,
    try_lock,
    write_meta,
)
from serve.threads import journal_limiter

log = logging.getLogger(__name__)

KIB = 1024
MIB = 1024 * KIB
#: How long the trio thread sleeps to hand the GIL to a starved writer thread, and how often
#: at most (daemon-wide); see SessionJournal._hand_over_gil.
GIL_NAP_S = 0.00005
GIL_NAP_PERIOD_S = 0.0005
#: Bytes charged per buffered event on top of its frame and type: the record's head and
#: CRC plus Python object overhead (3 list slots, two small bytes objects).
ENTRY_COST_BYTES = RECORD_OVERHEAD_BYTES + 96
#: Shortest pause between two sweeps of the janitor, in seconds.
SWEEP_MIN_GAP_S = 1.0


class JournalError(Exception):
    """Base of the journal's errors; ``session_id`` names the journal concerned."""

    def __init__(self, session_id: str, message: str) -> None:
        super().__init__(f"journal of session {session_id!r}: {message}")
        self.session_id = session_id


class JournalNotFound(JournalError):
    """No journal (or no readable ``meta.json``) for this session id."""


class JournalBusy(JournalError):
    """A writer already holds this session's journal (this process or another)."""


class JournalIOError(JournalError):
    """The file system refused an operation; the ``OSError`` is chained."""


class JournalLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Bounds of every session journal; units in the names."""

    max_session_bytes: int = 16 * MIB  # segments on disk per session (oldest dropped)
    segment_bytes: int = 2 * MIB  # a segment is sealed past this size
    flush_interval_ms: int = 50  # longest an accepted event waits before its write
    flush_batch_bytes: int = 256 * KIB  # buffered bytes that trigger a write at once
    max_buffer_bytes: int = 8 * MIB  # buffered + in flight; past it the sink sheds
    retry_interval_ms: int = 1000  # pause after a failed write
    retention_ms: int = 7 * 24 * 3600 * 1000  # closed journals idle this long go (0: kept)
    max_total_bytes: int = 1024 * MIB  # every journal on disk; closed ones go first (0: off)
    sweep_interval_ms: int = 60_000  # how often the janitor looks (and after a close)

    def __post_init__(self) -> None:
        if self.retention_ms < 0 or self.sweep_interval_ms <= 0:
            raise ValueError("journal limits: need retention_ms >= 0, sweep_interval_ms > 0")
        if self.max_total_bytes and self.max_total_bytes < self.max_session_bytes:
            raise ValueError("journal limits: max_total_bytes must be 0 or >= max_session_bytes")
        if not 0 < self.segment_bytes <= self.max_session_bytes:
            raise ValueError("journal limits: need 0 < segment_bytes <= max_session_bytes")
        if self.flush_interval_ms < 0 or self.retry_interval_ms < 0:
            raise ValueError("journal limits: intervals must be >= 0")
        if not 0 < self.flush_batch_bytes <= self.max_buffer_bytes:
            raise ValueError("journal limits: need 0 < flush_batch_bytes <= max_buffer_bytes")


class Replay(msgspec.Struct, frozen=True, kw_only=True):
    """A session's journal as read back: meta, the kept records, and how trustworthy."""

    meta: JournalMeta
    records: list[JournalRecord]  # the last ``tail`` valid records, in id order
    count: int  # valid records on disk (>= len(records))
    first_id: int | None  # oldest valid id on disk
    last_id: int | None  # newest valid id on disk
    next_id: int  # id the next event should carry to continue the journal
    #: The writer closed cleanly and nothing was cut: no id a client saw is missing, so
    #: the log may keep ``meta.epoch``. When False, ids after ``last_id`` may have been
    #: delivered before the crash: give the restored log a new epoch.
    clean: bool
    cut_bytes: int  # bytes of corrupt or torn data cut (or that would be, if read-only)
    problems: tuple[str, ...]  # what was cut and why (for the log)

    def __iter__(self) -> Iterator[JournalRecord]:
        return iter(self.records)


class SessionJournal:
    """One session's journal writer. See the module docstring."""

    def __init__(
        self,
        journal: Journal,
        meta: JournalMeta,
        directory: Path,
        appender: Appender,
        lock_fd: int,
    ) -> None:
        limits = journal.limits
        self.journal = journal
        self.meta = meta
        self.session_id = meta.session_id
        self.directory = directory
        self._appender = appender
        self._lock_fd: int | None = lock_fd
        self._max_buffer = limits.max_buffer_bytes
        self._batch_bytes = limits.flush_batch_bytes
        self._interval_s = limits.flush_interval_ms / 1000
        self._retry_s = limits.retry_interval_ms / 1000
        self._runs: list[Run] = []  # buffered records; a new run at every id discontinuity
        self._run: Run | None = None  # the last of _runs, the one being extended
        self._buffered_bytes = 0
        self._inflight_bytes = 0
        self._data = trio.Event()
        self._urgent = trio.Event()
        self._behind = trio.Event()  # a batch is buffered while a write is in flight
        self._io_lock = trio.Lock()
        self._closed = False
        self._shedding = False
        self._last_seen_id: int | None = None
        self.degraded = False
        self.accepted_events = 0
        self.dropped_events = 0
        self.ignored_after_close = 0
        self.write_errors = 0
        self.last_error: str | None = None
        self.bytes_written = 0
        self.events_written = 0

    # ---- hot path (trio thread) ----------------------------------------------------------

    def sink(self, event_id: int, event_type: str, frame: bytes) -> None:
        """``EventLog`` sink: buffer one published frame. O(1), never blocks or raises."""
        if self._closed:
            self.ignored_after_close += 1
            return
        self._last_seen_id = event_id
        cost = len(frame) + len(event_type) + ENTRY_COST_BYTES
        if self._shedding or (
            self._buffered_bytes + self._inflight_bytes + cost > self._max_buffer
            # An event bigger than the bound still goes into an empty buffer.
            and (self._buffered_bytes or cost > MAX_RECORD_BYTES)
        ):
            self._shed()
            return
        run = self._run
        if run is None or event_id != run.first_id + run.count:
            run = self._run = Run(event_id)
            self._runs.append(run)
        crc: bytes | bytearray
        if len(frame) < DEFER_CRC_BYTES:
            head, _, crc = record_parts(event_id, event_type, frame)
            run.parts += (head, frame, crc)  # Run.add, inlined: this is the hot path
        else:  # the writer thread computes the CRC of a large frame
            head, _, placeholder = record_parts_deferred(event_id, event_type, frame)
            run.parts += (head, frame, placeholder)
            run.deferred.append((head, frame, placeholder))
            crc = placeholder
        run.count += 1
        run.nbytes += len(head) + len(frame) + len(crc)
        self._buffered_bytes += cost
        self.accepted_events += 1
        if not self._data.is_set():  # Event.set() is costly even when already set
            self._data.set()
        if self._buffered_bytes >= self._batch_bytes:
            if not self._urgent.is_set():
                self._urgent.set()
            if self._inflight_bytes and not self._behind.is_set():
                self._behind.set()

    def _shed(self) -> None:
        self.dropped_events += 1
        self.journal.dropped_events += 1
        if not self._shedding:
            self._shedding = True
            self.degraded = True
            self._urgent.set()
            log.warning(
                "journal of session %s cannot keep up (%d bytes pending): dropping events; "
                "the journal restarts after the gap",
                self.session_id,
                self._buffered_bytes + self._inflight_bytes,
            )

    # ---- flushing ------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def shedding(self) -> bool:
        return self._shedding

    @property
    def next_id(self) -> int | None:
        """Id the journal on disk expects next (None: empty); give the EventLog this one."""
        return self._appender.next_id

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The flusher task: batch, write, fsync, until ``aclose()``. Failed writes retry.

        Runs :meth:`_hand_over_gil` beside it. Cancelling it flushes what is buffered
        (shielded) but writes no clean marker.
        """
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._hand_over_gil)
                task_status.started()
                while not self._closed:
                    await self._data.wait()
                    if self._closed:
                        break
                    if not self._urgent.is_set():
                        with trio.move_on_after(self._interval_s):
                            await self._urgent.wait()
                    try:
                        await self.flush()
                    except JournalIOError:
                        await trio.sleep(self._retry_s)
                nursery.cancel_scope.cancel()
        finally:
            if not self._closed:
                with trio.CancelScope(shield=True), contextlib.suppress(JournalIOError):
                    await self.flush()

    async def _hand_over_gil(self) -> None:
        """Let a starved writer thread have the GIL while this session's writer is behind.

        A CPython thread waiting for the GIL asks for it only after ``switchinterval``
        (5 ms) without a release; a busy trio thread releases and retakes it around every
        ``epoll_wait``, well inside that, so the waiter's timer restarts and it can wait
        as long as the loop stays busy (measured: one write batch stuck for the whole of
        a 0.45 s flood, the journal then shedding most events). While a write is in
        flight and another batch's worth is already buffered, this task blocks the trio
        thread in ``time.sleep`` for :data:`GIL_NAP_S` (the worker takes the GIL then),
        at most once per :data:`GIL_NAP_PERIOD_S` daemon-wide (shared by all sessions via
        the Journal): at most ~10 % of the loop, only while some journal is behind.
        """
        journal = self.journal
        while True:
            await self._behind.wait()
            while self._inflight_bytes and self._buffered_bytes >= self._batch_bytes:
                now = trio.current_time()
                if now >= journal._next_gil_nap:
                    journal._next_gil_nap = now + GIL_NAP_PERIOD_S
                    time.sleep(GIL_NAP_S)  # noqa: ASYNC251 (the point: release the GIL)
                    journal.gil_naps += 1
                await trio.sleep(GIL_NAP_PERIOD_S)
            self._behind = trio.Event()

    async def flush(self) -> None:
        """Make every event accepted before this call durable; :class:`JournalIOError` if not."""
        async with self._io_lock:
            if not self._runs:
                return
            batch, self._runs, self._run = self._runs, [], None
            size, self._buffered_bytes = self._buffered_bytes, 0
            self._inflight_bytes = size
            self._data = trio.Event()
            self._urgent = trio.Event()
            appender = self._appender
            before, before_bytes = appender.records_written, appender.bytes_written
            try:
                await threads.run_sync(journal_limiter(), appender.append, batch)
            except OSError as exc:
                self._runs[:0] = batch
                if self._run is None:
                    self._run = batch[-1]
                self._buffered_bytes += size
                self._inflight_bytes = 0
                self._data.set()
                self.write_errors += 1
                self.degraded = True
                if self.last_error is None or self.write_errors % 100 == 1:
                    log.warning("journal of session %s: write failed: %s", self.session_id, exc)
                self.last_error = str(exc)
                raise JournalIOError(self.session_id, f"write failed: {exc}") from exc
            self._inflight_bytes = 0
            events = appender.records_written - before
            written = appender.bytes_written - before_bytes
            self.bytes_written += written
            self.events_written += events
            self.journal.bytes_written += written
            self.journal.events_written += events
            if self._shedding and not self._runs:
                self._shedding = False
                log.warning(
                    "journal of session %s caught up after dropping %d events",
                    self.session_id,
                    self.dropped_events,
                )

    async def update_meta(self, meta: JournalMeta) -> None:
        """Replace the stored meta (e.g. a new ACP session id after an agent restart)."""
        if meta.session_id != self.session_id:
            raise ValueError("update_meta cannot change the session id")
        async with self._io_lock:
            meta_file = MetaFile(meta=meta, updated_at_ms=now_ms())
            try:
                await threads.run_sync(journal_limiter(), write_meta, self.directory, meta_file)
            except OSError as exc:
                raise JournalIOError(self.session_id, f"meta write failed: {exc}") from exc
            self.meta = meta

    async def aclose(self, *, discard: bool = False) -> None:
        """Flush, mark clean, close, release the lock. Idempotent; never raises for I/O.

        ``discard=True`` skips the flush and the clean marker (the journal is about to be
        deleted).
        """
        if self._closed:
            return
        self._closed = True
        self._data.set()
        self._urgent.set()
        with trio.CancelScope(shield=True):
            if not discard:
                try:
                    await self.flush()
                except JournalIOError as exc:
                    log.error(
                        "journal of session %s not flushed at close: %s", self.session_id, exc
                    )
            async with self._io_lock:
                complete = not self._runs and (
                    self._last_seen_id is None or self._last_seen_id == self._appender.last_id
                )
                await threads.run_sync(journal_limiter(), self._finish, not discard and complete)
            self.journal._forget(self)
            self.journal.request_sweep()

    def _finish(self, clean: bool) -> None:
        try:
            self._appender.close()
            if clean:
                last = self._appender.last_id or 0
                write_meta(
                    self.directory,
                    MetaFile(meta=self.meta, clean_last_id=last, updated_at_ms=now_ms()),
                )
        except OSError as exc:
            log.error("journal of session %s: closing failed: %s", self.session_id, exc)
        finally:
            if self._lock_fd is not None:
                release_lock(self._lock_fd)
                self._lock_fd = None

    def statistics(self) -> dict[str, Any]:
        appender = self._appender
        return {
            "bytesWritten": self.bytes_written,
            "eventsWritten": self.events_written,
            "fsyncs": appender.fsyncs,
            "bufferedEvents": sum(r.count for r in self._runs),
            "bufferedBytes": self._buffered_bytes + self._inflight_bytes,
            "maxBufferBytes": self._max_buffer,
            "droppedEvents": self.dropped_events,
            "degraded": self.degraded,
            "shedding": self._shedding,
            "writeErrors": self.write_errors,
            "lastError": self.last_error,
            "resets": appender.resets,
            "rotatedSegments": appender.rotated_segments,
            "diskBytes": appender.disk_bytes,
            "lastId": appender.last_id,
        }


class Journal:
    """The daemon's journal directory (``<state_dir>/journal``). See the module docstring."""

    def __init__(self, state_dir: str | os.PathLike[str], limits: JournalLimits | None = None):
        self.root = Path(state_dir) / JOURNAL_DIR
        self.limits = limits or JournalLimits()
        self._writers: dict[str, SessionJournal | None] = {}  # None: being opened
        self.bytes_written = 0
        self.events_written = 0
        self.dropped_events = 0
        self.gil_naps = 0
        self._next_gil_nap = 0.0  # trio clock; see SessionJournal._hand_over_gil
        self.swept_journals = 0  # closed journals deleted by the janitor
        self.swept_bytes = 0
        self.disk_bytes = 0  # every journal's bytes on disk at the last sweep
        self._sweep_wanted = trio.Event()

    def session_dir(self, session_id: str) -> Path:
        return self.root / safe_name(session_id)

    @property
    def writers(self) -> list[SessionJournal]:
        return [w for w in self._writers.values() if w is not None]

    def _forget(self, writer: SessionJournal) -> None:
        if self._writers.get(writer.session_id) is writer:
            del self._writers[writer.session_id]

    # ---- writing -------------------------------------------------------------------------

    async def open_writer(self, meta: JournalMeta, *, fresh: bool = False) -> SessionJournal:
        """Open (create, or continue after repairing its tail) a session's journal.

        Writes ``meta`` (no clean marker) durably before returning, so a crash from here on
        is never mistaken for a clean stop. ``fresh`` deletes any existing events first.
        Raises :class:`JournalBusy` if a writer holds it, :class:`JournalIOError` on I/O.
        """
        sid = meta.session_id
        if sid in self._writers:
            raise JournalBusy(sid, "a writer is already open in this daemon")
        self._writers[sid] = None
        try:
            appender, lock_fd = await threads.run_sync(
                journal_limiter(), self._open_sync, meta, fresh
            )
        except BaseException:
            del self._writers[sid]
            raise
        writer = SessionJournal(self, meta, self.session_dir(sid), appender, lock_fd)
        self._writers[sid] = writer
        return writer

    def _open_sync(self, meta: JournalMeta, fresh: bool) -> tuple[Appender, int]:
        sid = meta.session_id
        directory = self.session_dir(sid)
        try:
            ensure_dir(self.root)
            ensure_dir(directory)
            lock_fd = try_lock(directory)
        except OSError as exc:
            raise JournalIOError(sid, f"cannot open {directory}: {exc}") from exc
        if lock_fd is None:
            raise JournalBusy(sid, f"{directory} is locked by another process")
        try:
            existing = read_meta(directory)
            if existing is not None and existing.meta.session_id != sid:
                raise JournalBusy(sid, f"{directory} belongs to {existing.meta.session_id!r}")
            if fresh:
                for seg in list_segments(directory):
                    seg.path.unlink(missing_ok=True)
                fsync_dir(directory)
            found = scan(directory, collect=False, repair=True)
            if found.problems:
                log.warning("journal of session %s repaired: %s", sid, "; ".join(found.problems))
            write_meta(directory, MetaFile(meta=meta, updated_at_ms=now_ms()))
            limits = self.limits
            appender = Appender(
                directory,
                found,
                max_bytes=limits.max_session_bytes,
                segment_bytes=limits.segment_bytes,
            )
        except OSError as exc:
            release_lock(lock_fd)
            raise JournalIOError(sid, f"cannot open {directory}: {exc}") from exc
        except BaseException:
            release_lock(lock_fd)
            raise
        return appender, lock_fd

    async def reopen(
        self, session_id: str, *, tail: int | None, meta_for: Callable[[Replay], JournalMeta]
    ) -> tuple[Replay, SessionJournal]:
        """:meth:`read` and :meth:`open_writer` (appending) in one pass: one scan of the
        segments, in one worker thread call, for a load that goes on journaling.
        ``meta_for(replay)`` (pure; runs in the thread) gives the meta to write. Raises
        :class:`JournalNotFound`, :class:`JournalBusy`, :class:`JournalIOError`."""
        if session_id in self._writers:
            raise JournalBusy(session_id, "a writer is already open in this daemon")
        self._writers[session_id] = None
        try:
            replay, meta, appender, lock_fd = await threads.run_sync(
                journal_limiter(), self._reopen_sync, session_id, tail, meta_for
            )
        except BaseException:
            del self._writers[session_id]
            raise
        writer = SessionJournal(self, meta, self.session_dir(session_id), appender, lock_fd)
        self._writers[session_id] = writer
        return replay, writer

    def _reopen_sync(
        self, sid: str, tail: int | None, meta_for: Callable[[Replay], JournalMeta]
    ) -> tuple[Replay, JournalMeta, Appender, int]:
        directory = self.session_dir(sid)
        meta_file = read_meta(directory)
        if meta_file is None or meta_file.meta.session_id != sid:
            raise JournalNotFound(sid, "no journal")
        try:
            lock_fd = try_lock(directory)
        except OSError as exc:
            raise JournalIOError(sid, f"cannot open {directory}: {exc}") from exc
        if lock_fd is None:
            raise JournalBusy(sid, f"{directory} is locked by another process")
        try:
            found = scan(directory, collect=True, tail=tail, repair=True)
            if found.problems:
                log.warning("journal of session %s cut: %s", sid, "; ".join(found.problems))
            replay = _replay(meta_file, found)
            meta = meta_for(replay)
            write_meta(directory, MetaFile(meta=meta, updated_at_ms=now_ms()))
            limits = self.limits
            appender = Appender(
                directory,
                found,
                max_bytes=limits.max_session_bytes,
                segment_bytes=limits.segment_bytes,
            )
        except OSError as exc:
            release_lock(lock_fd)
            raise JournalIOError(sid, f"cannot open {directory}: {exc}") from exc
        except BaseException:
            release_lock(lock_fd)
            raise
        return replay, meta, appender, lock_fd

    # ---- reading -------------------------------------------------------------------------

    async def read(self, session_id: str, *, tail: int | None = None) -> Replay:
        """:meth:`load` in a worker thread."""
        return await threads.run_sync(
            journal_limiter(), self._load, session_id, tail, session_id in self._writers
        )

    def load(self, session_id: str, *, tail: int | None = None) -> Replay:
        """Read a session's journal (blocking): meta and the last ``tail`` records.

        The corrupt or torn part (see ``store.scan``) is cut on disk unless a writer holds
        the journal, in which case reading is read-only. Raises :class:`JournalNotFound`
        when there is no journal or its meta is unreadable, :class:`JournalIOError` when the
        file system fails; never for bad record data.
        """
        return self._load(session_id, tail, session_id in self._writers)

    def _load(self, session_id: str, tail: int | None, writer_open: bool) -> Replay:
        directory = self.session_dir(session_id)
        meta_file = read_meta(directory)
        if meta_file is None or meta_file.meta.session_id != session_id:
            raise JournalNotFound(session_id, "no journal")
        try:
            lock_fd = None if writer_open else try_lock(directory)
            try:
                found = scan(directory, collect=True, tail=tail, repair=lock_fd is not None)
            finally:
                if lock_fd is not None:
                    release_lock(lock_fd)
        except OSError as exc:
            raise JournalIOError(session_id, f"cannot read {directory}: {exc}") from exc
        if found.problems:
            log.warning("journal of session %s cut: %s", session_id, "; ".join(found.problems))
        return _replay(meta_file, found)

    async def list_sessions(self) -> list[JournalMeta]:
        """Metas of every journal with a readable meta (oldest first); see :meth:`sessions`."""
        return await threads.run_sync(journal_limiter(), self.sessions)

    def sessions(self) -> list[JournalMeta]:
        """Blocking :meth:`list_sessions`."""
        out: list[JournalMeta] = []
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return out
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                continue
            meta_file = read_meta(Path(entry.path))
            if meta_file is not None and safe_name(meta_file.meta.session_id) == entry.name:
                out.append(meta_file.meta)
        out.sort(key=lambda m: (m.created_at_ms, m.session_id))
        return out

    async def delete(self, session_id: str) -> bool:
        """Close this daemon's writer (discarding its buffer) and remove the journal.

        True when something was removed; :class:`JournalBusy` when another process holds it.
        """
        writer = self._writers.get(session_id)
        if writer is not None:
            await writer.aclose(discard=True)
        return await threads.run_sync(journal_limiter(), self._delete_sync, session_id)

    def _delete_sync(self, session_id: str) -> bool:
        directory = self.session_dir(session_id)
        if not directory.is_dir():
            return False
        try:
            lock_fd = try_lock(directory)
            if lock_fd is None:
                raise JournalBusy(session_id, f"{directory} is locked by another process")
            try:
                shutil.rmtree(directory)
            finally:
                release_lock(lock_fd)
            fsync_dir(self.root)
        except OSError as exc:
            raise JournalIOError(session_id, f"cannot delete {directory}: {exc}") from exc
        return True

    # ---- the janitor: retention and the total bound ----------------------------------------

    def request_sweep(self) -> None:
        """Ask the janitor for a sweep soon (a journal was closed)."""
        self._sweep_wanted.set()

    async def run_janitor(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Sweep at start, every ``sweep_interval_ms``, and shortly after a journal closes
        (at most once a second)."""
        task_status.started()
        interval = self.limits.sweep_interval_ms / 1000
        while True:
            try:
                await self.sweep()
            except JournalIOError as exc:
                log.warning("journal sweep failed: %s", exc)
            with trio.move_on_after(interval):
                await self._sweep_wanted.wait()
            self._sweep_wanted = trio.Event()
            await trio.sleep(SWEEP_MIN_GAP_S)

    async def sweep(self) -> int:
        """Delete closed journals past the retention, then, while every journal together
        exceeds ``max_total_bytes``, the closed ones oldest first. Journals with a writer
        (here or in another process: the flock) are never touched. Returns how many went."""
        return await threads.run_sync(journal_limiter(), self._sweep_sync, now_ms())

    def _sweep_sync(self, now: int) -> int:
        limits = self.limits
        try:
            entries = [e for e in os.scandir(self.root) if e.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise JournalIOError("*", f"cannot list {self.root}: {exc}") from exc
        found: list[tuple[int, int, Path, str | None]] = []  # (last activity, bytes, dir, id)
        total = 0
        for entry in entries:
            directory = Path(entry.path)
            size, last = _dir_usage(directory)
            meta_file = read_meta(directory)
            session_id = meta_file.meta.session_id if meta_file is not None else None
            if meta_file is not None:
                last = max(last, meta_file.updated_at_ms)
            total += size
            if session_id is None or session_id not in self._writers:
                found.append((last, size, directory, session_id))
        found.sort(key=lambda item: item[0])
        removed = 0
        for last, size, directory, session_id in found:
            expired = bool(limits.retention_ms) and now - last > limits.retention_ms
            over = bool(limits.max_total_bytes) and total > limits.max_total_bytes
            if not (expired or over):
                continue
            if session_id is not None and session_id in self._writers:
                continue  # opened meanwhile
            if _remove_unlocked(directory):
                total -= size
                removed += 1
                self.swept_journals += 1
                self.swept_bytes += size
                log.info(
                    "journal of %s deleted (%s, %d bytes)",
                    session_id or directory.name,
                    "retention" if expired else "total bound",
                    size,
                )
        if removed:
            with contextlib.suppress(OSError):
                fsync_dir(self.root)
        self.disk_bytes = total
        return removed

    async def flush(self) -> None:
        """Make every event accepted so far by every open writer durable; writers stay open
        (``POST /daemon/drain``). Raises the first :class:`JournalIOError`."""
        for writer in self.writers:
            if not writer.closed:
                await writer.flush()

    async def aclose(self) -> None:
        """Close every open writer (drain: after this, everything published is durable)."""
        for writer in self.writers:
            await writer.aclose()

    def statistics(self) -> dict[str, Any]:
        writers = self.writers
        return {
            "directory": str(self.root),
            "openWriters": len(writers),
            "bytesWritten": self.bytes_written,
            "eventsWritten": self.events_written,
            "droppedEvents": self.dropped_events,
            "gilNaps": self.gil_naps,
            "diskBytes": self.disk_bytes,
            "sweptJournals": self.swept_journals,
            "sweptBytes": self.swept_bytes,
            "degradedSessions": sorted(w.session_id for w in writers if w.degraded),
        }


def _dir_usage(directory: Path) -> tuple[int, int]:
    """(bytes of the files in ``directory``, newest modification in Unix ms)."""
    size = 0
    newest = 0
    try:
        for entry in os.scandir(directory):
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            size += st.st_size
            newest = max(newest, int(st.st_mtime * 1000))
    except FileNotFoundError:
        pass
    return size, newest


def _remove_unlocked(directory: Path) -> bool:
    """Delete a journal directory unless a writer (any process) holds its lock."""
    try:
        lock_fd = try_lock(directory)
    except FileNotFoundError:
        return False
    except OSError as exc:
        log.warning("journal sweep: cannot lock %s: %s", directory, exc)
        return False
    if lock_fd is None:
        return False
    try:
        shutil.rmtree(directory, ignore_errors=True)
    finally:
        release_lock(lock_fd)
    return not directory.exists()


def _replay(meta_file: MetaFile, found: ScanResult) -> Replay:
    last = found.last_id
    clean = (
        meta_file.clean_last_id is not None
        and meta_file.clean_last_id == (last or 0)
        and not found.problems
    )
    return Replay(
        meta=meta_file.meta,
        records=list(found.records),
        count=found.count,
        first_id=found.first_id,
        last_id=last,
        next_id=found.next_id or 1,
        clean=clean,
        cut_bytes=found.cut_bytes,
        problems=tuple(found.problems),
    )
