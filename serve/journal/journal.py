"""The daemon's journal directory: writers opened and reopened, reads, deletes, the janitor.

Ownership
---------
The daemon owns one :class:`Journal` (a directory, limits, totals). Each live session owns
one :class:`~serve.journal.writer.SessionJournal` from :meth:`Journal.open_writer` (or
:meth:`Journal.reopen`, a read and an open in one scan); both take the session directory's
exclusive ``flock`` and set up its appender in one step (:meth:`Journal._open_appender`),
so a second writer (this process or another daemon on the same state directory) gets
:class:`JournalBusy`. Reads (:meth:`Journal.read`) cut a torn tail unless a writer holds the
journal. The janitor (:meth:`Journal.run_janitor`) applies the retention and the total
bound to closed journals only.

Every blocking step runs in a worker thread under the journal limiter
(:func:`serve.threads.journal_limiter`); the ``*_sync`` methods are those steps.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from serve import threads
from serve.journal.store import (
    JOURNAL_DIR,
    Appender,
    JournalMeta,
    MetaFile,
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
from serve.journal.sweeps import SweepSchedule
from serve.journal.types import (
    JournalBusy,
    JournalError,
    JournalIOError,
    JournalLimits,
    JournalNotFound,
    Replay,
)
from serve.journal.writer import SessionJournal
from serve.threads import journal_limiter

__all__ = [
    "Journal",
    "JournalBusy",
    "JournalError",
    "JournalIOError",
    "JournalLimits",
    "JournalNotFound",
    "Replay",
    "SessionJournal",
]

log = logging.getLogger(__name__)

#: Shortest pause between two sweeps of the janitor, in seconds.


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
        self.next_gil_nap = 0.0  # trio clock; see SessionJournal._hand_over_gil
        self.swept_journals = 0  # closed journals deleted by the janitor
        self.swept_bytes = 0
        self.disk_bytes = 0  # every journal's bytes on disk at the last sweep
        self._sweeps = SweepSchedule()

    def session_dir(self, session_id: str) -> Path:
        return self.root / safe_name(session_id)

    @property
    def writers(self) -> list[SessionJournal]:
        return [w for w in self._writers.values() if w is not None]

    def writer_closed(self, writer: SessionJournal) -> None:
        """``writer`` closed (:class:`~serve.journal.writer.WriterHome`): forget it, and
        ask the janitor for a sweep."""
        if self._writers.get(writer.session_id) is writer:
            del self._writers[writer.session_id]
        self.request_sweep()

    # ---- writing -------------------------------------------------------------------------

    async def open_writer(self, meta: JournalMeta, *, fresh: bool = False) -> SessionJournal:
        """Open (create, or continue after repairing its tail) a session's journal.

        Writes ``meta`` (no clean marker) durably before returning, so a crash from here on
        is never mistaken for a clean stop. ``fresh`` deletes any existing events first.
        Raises :class:`JournalBusy` if a writer holds it, :class:`JournalIOError` on I/O.
        """
        writer, _ = await self._start_writer(meta.session_id, self._open_sync, meta, fresh)
        return writer

    async def reopen(
        self, session_id: str, *, tail: int | None, meta_for: Callable[[Replay], JournalMeta]
    ) -> tuple[Replay, SessionJournal]:
        """:meth:`read` and :meth:`open_writer` (appending) in one pass: one scan of the
        segments, in one worker thread call, for a load that goes on journaling.
        ``meta_for(replay)`` (pure; runs in the thread) gives the meta to write. Raises
        :class:`JournalNotFound`, :class:`JournalBusy`, :class:`JournalIOError`."""
        writer, replay = await self._start_writer(
            session_id, self._reopen_sync, session_id, tail, meta_for
        )
        return replay, writer

    async def _start_writer[*Ts, T](
        self,
        sid: str,
        open_sync: Callable[[*Ts], tuple[JournalMeta, Appender, int, T]],
        *args: *Ts,
    ) -> tuple[SessionJournal, T]:
        """Reserve ``sid`` for one writer of this daemon, run ``open_sync`` (one of the
        ``*_sync`` openers) in a worker thread, and register the writer it opened."""
        if sid in self._writers:
            raise JournalBusy(sid, "a writer is already open in this daemon")
        self._writers[sid] = None
        try:
            meta, appender, lock_fd, extra = await threads.run_sync(
                journal_limiter(), open_sync, *args
            )
        except BaseException:
            del self._writers[sid]
            raise
        writer = SessionJournal(self, meta, self.session_dir(sid), appender, lock_fd)
        self._writers[sid] = writer
        return writer, extra

    def _open_sync(self, meta: JournalMeta, fresh: bool) -> tuple[JournalMeta, Appender, int, None]:
        sid = meta.session_id
        directory = self.session_dir(sid)
        try:
            ensure_dir(self.root)
            ensure_dir(directory)
        except OSError as exc:
            raise JournalIOError(sid, f"cannot open {directory}: {exc}") from exc

        def prepare() -> tuple[ScanResult, JournalMeta, None]:
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
            return found, meta, None

        return self._open_appender(sid, directory, prepare)

    def _reopen_sync(
        self, sid: str, tail: int | None, meta_for: Callable[[Replay], JournalMeta]
    ) -> tuple[JournalMeta, Appender, int, Replay]:
        directory = self.session_dir(sid)
        meta_file = read_meta(directory)
        if meta_file is None or meta_file.meta.session_id != sid:
            raise JournalNotFound(sid, "no journal")

        def prepare() -> tuple[ScanResult, JournalMeta, Replay]:
            found = scan(directory, collect=True, tail=tail, repair=True)
            if found.problems:
                log.warning("journal of session %s cut: %s", sid, "; ".join(found.problems))
            replay = _replay(meta_file, found)
            return found, meta_for(replay), replay

        return self._open_appender(sid, directory, prepare)

    def _open_appender[T](
        self, sid: str, directory: Path, prepare: Callable[[], tuple[ScanResult, JournalMeta, T]]
    ) -> tuple[JournalMeta, Appender, int, T]:
        """The one set-up step of a writer (blocking): take the directory's lock, let
        ``prepare`` scan (and repair) the segments under it and name the meta, write that
        meta (no clean marker) and open the appender after the valid records. The lock is
        released again if any of it fails (``OSError``: :class:`JournalIOError`)."""
        try:
            lock_fd = try_lock(directory)
        except OSError as exc:
            raise JournalIOError(sid, f"cannot open {directory}: {exc}") from exc
        if lock_fd is None:
            raise JournalBusy(sid, f"{directory} is locked by another process")
        try:
            found, meta, extra = prepare()
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
        return meta, appender, lock_fd, extra

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
        self._sweeps.request()

    async def run_janitor(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Sweep at start, every ``sweep_interval_ms``, and shortly after a journal closes
        (at most once a second)."""
        task_status.started()
        await self._sweeps.run(self.sweep, self.limits.sweep_interval_ms / 1000)

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
