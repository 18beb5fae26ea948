"""One session's journal writer: the sink on the hot path, the flusher, overload, close.

Ownership
---------
Each live session owns one :class:`SessionJournal` from
:meth:`serve.journal.journal.Journal.open_writer`: its ``sink`` goes to the session's
``EventLog``, its ``run`` flusher task lives in the session actor's nursery, and the actor
calls ``aclose()`` when the session ends or the daemon drains. A writer holds an exclusive
``flock`` on its session directory (taken when it was opened). It reports to the daemon's
journal through the narrow :class:`WriterHome` port (its limits, the daemon-wide totals and
the GIL hand-over clock, and its close).
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
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import trio

from acp import telemetry
from serve import threads
from serve.journal.format import (
    DEFER_CRC_BYTES,
    MAX_RECORD_BYTES,
    RECORD_OVERHEAD_BYTES,
    record_parts,
    record_parts_deferred,
)
from serve.journal.store import (
    JournalMeta,
    MetaFile,
    Run,
    now_ms,
    release_lock,
    write_meta,
)
from serve.journal.types import JournalIOError, JournalLimits
from serve.threads import journal_limiter

log = logging.getLogger(__name__)

#: How long the trio thread sleeps to hand the GIL to a starved writer thread, and how often
#: at most (daemon-wide); see SessionJournal._hand_over_gil.
GIL_NAP_S = 0.00005
GIL_NAP_PERIOD_S = 0.0005
#: Bytes charged per buffered event on top of its frame and type: the record's head and
#: CRC plus Python object overhead (3 list slots, two small bytes objects).
ENTRY_COST_BYTES = RECORD_OVERHEAD_BYTES + 96


class WriterHome(Protocol):
    """What a writer reads and counts in the daemon's journal
    (:class:`serve.journal.journal.Journal`)."""

    limits: JournalLimits
    bytes_written: int
    events_written: int
    dropped_events: int
    gil_naps: int
    #: Trio clock: the next GIL hand-over allowed daemon-wide (:meth:`_hand_over_gil`).
    next_gil_nap: float

    def writer_closed(self, writer: SessionJournal) -> None:
        """``writer`` is closed: forget it and sweep soon."""


class RunAppender(Protocol):
    """Where a writer's batches go: the files' :class:`serve.journal.store.Appender`, or
    the PostgreSQL journal's (``serve.journal.pg``). ``append`` blocks (a worker thread),
    makes the runs durable or raises ``OSError`` (retried; nothing of the batch counted)."""

    records_written: int
    bytes_written: int
    fsyncs: int
    resets: int
    rotated_segments: int
    disk_bytes: int

    @property
    def next_id(self) -> int | None: ...

    @property
    def last_id(self) -> int | None: ...

    def append(self, runs: list[Run]) -> int: ...

    def close(self) -> None: ...


class SessionJournal:
    """One session's journal writer. See the module docstring."""

    def __init__(
        self,
        journal: WriterHome,
        meta: JournalMeta,
        directory: Path,
        appender: RunAppender,
        lock_fd: int | None,
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
        #: Told (trio thread) when a shared journal's lease was lost: another daemon took
        #: the session over (``PgJournal.renew``); answers whether the news was delivered.
        self.on_lease_lost: Callable[[], bool] | None = None
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
                if now >= journal.next_gil_nap:
                    journal.next_gil_nap = now + GIL_NAP_PERIOD_S
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
                with telemetry.span("journal.flush", attributes={"acp_serve.journal.bytes": size}):
                    await threads.run_sync(self._limiter(), appender.append, batch)
            except BaseException as exc:
                # Not written: back to the front of the buffer. A cancel can only come while
                # waiting for a worker thread (a thread once started is waited for), e.g. a
                # daemon stopping while every journal thread is busy: the close's shielded
                # flush writes the batch then (it was lost before).
                self._runs[:0] = batch
                if self._run is None:
                    self._run = batch[-1]
                self._buffered_bytes += size
                self._inflight_bytes = 0
                self._data.set()
                if not isinstance(exc, OSError):
                    raise
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
                await threads.run_sync(self._limiter(), self._store_meta, meta_file)
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
                await threads.run_sync(self._limiter(), self._finish, not discard and complete)
            self.journal.writer_closed(self)

    def _finish(self, clean: bool) -> None:
        try:
            self._appender.close()
            if clean:
                last = self._appender.last_id or 0
                self._store_meta(
                    MetaFile(meta=self.meta, clean_last_id=last, updated_at_ms=now_ms())
                )
        except OSError as exc:
            log.error("journal of session %s: closing failed: %s", self.session_id, exc)
        finally:
            self._release()

    # ---- the storage hooks (the PostgreSQL writer overrides them) -------------------------

    def _limiter(self) -> trio.CapacityLimiter:
        """The worker-thread budget of this writer's blocking steps."""
        return journal_limiter()

    def _store_meta(self, meta_file: MetaFile) -> None:
        """Replace the stored meta durably (blocking; ``OSError`` on failure)."""
        write_meta(self.directory, meta_file)

    def _release(self) -> None:
        """Give up the journal (blocking; the last step of a close): the flock."""
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
