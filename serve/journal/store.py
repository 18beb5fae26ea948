"""The journal's blocking file layer: layout, meta file, scan-and-repair, segment appender.

Layout (one directory per session)::

    <state_dir>/journal/<safe name>/meta.json                 JournalMeta + clean marker
    <state_dir>/journal/<safe name>/lock                      flock held by the open writer
    <state_dir>/journal/<safe name>/00000000000000000001.seg  records, see format.py
    <state_dir>/journal/<safe name>/00000000000000004711.seg  ...newer segments

The safe name is the session id itself when it is a plain file name
(``[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}``), else ``~`` + sha256 of it; the real id is in
``meta.json``, which is written atomically (temp file, fsync, rename, fsync directory).

Invariant kept by the appender and restored by :func:`scan`: the segments, oldest first,
hold one gap-free run of ids. Rotation deletes oldest segments first; a discontinuity in
the ids appended (events the writer had to drop, or a caller that restarted ids) deletes
every segment before the new run starts, durably, so a crash never leaves two runs.

:func:`scan` reads the segments in order and stops at the first imperfection (torn or
garbage tail, bad checksum, a segment that does not continue its predecessor): with
``repair`` the bad segment is truncated at its last good record and every later segment is
deleted, so what remains is the longest valid prefix. It never raises on bad data; only
the file system's own errors (``OSError``) propagate.

Everything here blocks and is not thread-safe; the trio layer (``journal.py``) runs it in
``trio.to_thread.run_sync``, one call at a time per session.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import msgspec

from serve.journal.format import (
    HEADER_BYTES,
    JournalRecord,
    decode_segment,
    fill_crc,
    parse_segment_name,
    record_parts,
    segment_header,
    segment_name,
)

JOURNAL_DIR = "journal"
META_NAME = "meta.json"
LOCK_NAME = "lock"
META_FORMAT = 1
DIR_MODE = 0o700
FILE_MODE = 0o600

_SAFE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")
_datasync = getattr(os, "fdatasync", os.fsync)


class JournalMeta(msgspec.Struct, frozen=True, kw_only=True):
    """What a restarted daemon needs to rebuild the session around its journaled events."""

    session_id: str  # the HTTP session id
    epoch: str  # the EventLog's epoch when the journal was (re)opened
    workspace: str
    acp_session_id: str  # the agent's session id (session/load or session/resume target)
    origin: Literal["new", "load", "resume"] = "new"  # how the agent session was obtained
    created_at_ms: int = 0
    attrs: dict[str, str] = {}  # free-form extras for the session actor


class MetaFile(msgspec.Struct, frozen=True, kw_only=True):
    """``meta.json``: the meta plus the clean-shutdown marker."""

    format: int = META_FORMAT
    meta: JournalMeta
    #: Last id on disk when the writer closed cleanly (0: none); None while a writer is open
    #: or after a crash.
    clean_last_id: int | None = None
    updated_at_ms: int = 0


_meta_decoder = msgspec.json.Decoder(MetaFile)
_encoder = msgspec.json.Encoder()


def safe_name(session_id: str) -> str:
    """Directory name for a session id: itself when harmless, else ``~`` + its sha256."""
    if _SAFE.fullmatch(session_id):
        return session_id
    return "~" + hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_dir(path: Path) -> None:
    """Create ``path`` (mode 0700) and make its entry durable in the parent."""
    if path.is_dir():
        return
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    fsync_dir(path.parent)


def write_meta(directory: Path, meta_file: MetaFile) -> None:
    """Replace ``meta.json`` atomically and durably."""
    tmp = directory / (META_NAME + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    try:
        _write_all(fd, _encoder.encode(meta_file))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, directory / META_NAME)
    fsync_dir(directory)


def read_meta(directory: Path) -> MetaFile | None:
    """The meta file, or None when it is missing, unreadable or not ours."""
    try:
        meta_file = _meta_decoder.decode((directory / META_NAME).read_bytes())
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    return meta_file if meta_file.format == META_FORMAT else None


def try_lock(directory: Path) -> int | None:
    """Take the session's exclusive flock; its fd, or None when another holder has it."""
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def release_lock(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)  # closing the last fd drops the flock


@dataclass
class Segment:
    first_id: int
    path: Path
    size: int


def list_segments(directory: Path) -> list[Segment]:
    """The directory's segment files, oldest first."""
    out: list[Segment] = []
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return out
    for entry in entries:
        first_id = parse_segment_name(entry.name)
        if first_id is None or not entry.is_file(follow_symlinks=False):
            continue
        out.append(Segment(first_id, Path(entry.path), entry.stat(follow_symlinks=False).st_size))
    out.sort(key=lambda s: s.first_id)
    return out


@dataclass
class ScanResult:
    """The longest valid prefix of a session's segments (see :func:`scan`)."""

    segments: list[Segment] = field(default_factory=list)
    records: deque[JournalRecord] = field(default_factory=deque)
    count: int = 0  # valid records on disk
    first_id: int | None = None  # oldest valid id
    next_id: int | None = None  # id the next append must carry (None: journal empty)
    cut_bytes: int = 0  # bytes judged invalid (removed when repairing)
    problems: list[str] = field(default_factory=list)

    @property
    def last_id(self) -> int | None:
        return None if self.next_id is None or self.count == 0 else self.next_id - 1


def scan(
    directory: Path, *, collect: bool = True, tail: int | None = None, repair: bool = True
) -> ScanResult:
    """Validate the segments in id order; keep the last ``tail`` records when collecting.

    With ``repair`` the invalid part is cut on disk: the first bad segment is truncated at
    its last good record (deleted when it has none) and every later segment is deleted.
    """
    result = ScanResult(records=deque(maxlen=tail))
    cut = False
    changed = False
    for seg in list_segments(directory):
        name = seg.path.name
        if cut:
            result.problems.append(f"{name}: dropped, it follows the cut")
            result.cut_bytes += seg.size
            if repair:
                seg.path.unlink(missing_ok=True)
                changed = True
            continue
        if result.next_id is not None and seg.first_id != result.next_id:
            cut = True
            result.problems.append(f"{name}: starts at id {seg.first_id}, not {result.next_id}")
            result.cut_bytes += seg.size
            if repair:
                seg.path.unlink(missing_ok=True)
                changed = True
            continue
        data = seg.path.read_bytes()
        found = decode_segment(data, seg.first_id, collect=collect)
        if collect:
            result.records.extend(found.records)
        if found.problem is not None:
            cut = True
            result.problems.append(f"{name} at byte {found.good_bytes}: {found.problem}")
            keep = found.good_bytes if found.good_records else 0
            result.cut_bytes += len(data) - keep
            if repair:
                changed = True
                if found.good_records:
                    _truncate(seg.path, keep)
                else:
                    seg.path.unlink(missing_ok=True)
            if not found.good_records:
                continue
            seg.size = keep
        else:
            seg.size = len(data)
        if found.good_records and result.first_id is None:
            result.first_id = seg.first_id
        result.count += found.good_records
        result.next_id = found.next_id
        result.segments.append(seg)
    if changed:
        fsync_dir(directory)
    return result


def _truncate(path: Path, size: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


_IOV_MAX = 1024


def _writev_all(fd: int, parts: list[bytes | bytearray]) -> int:
    """Write ``parts`` in order with ``writev`` (no joined copy; the GIL is released while
    the kernel copies). Handles short writes. Returns the bytes written."""
    total = 0
    index = 0
    offset = 0  # bytes of parts[index] already written
    count = len(parts)
    while index < count:
        batch: list[bytes | bytearray | memoryview] = [
            memoryview(parts[index])[offset:] if offset else parts[index]
        ]
        batch.extend(parts[index + 1 : index + _IOV_MAX])
        n = os.writev(fd, batch)
        total += n
        # Advance past what was written.
        while n and index < count:
            left = len(parts[index]) - offset
            if n >= left:
                n -= left
                index += 1
                offset = 0
            else:
                offset += n
                n = 0
        while index < count and not len(parts[index]) - offset:
            index += 1
            offset = 0
    return total


@dataclass(slots=True)
class Run:
    """Consecutive records ``first_id .. first_id + count - 1`` as record parts, 3 each.

    Built by the sink on the trio thread (see ``format.record_parts``), written by the
    appender in a worker thread with one ``join`` per segment touched.
    """

    first_id: int
    parts: list[bytes | bytearray] = field(default_factory=list)
    count: int = 0
    nbytes: int = 0
    #: Records of large frames whose CRC the writer thread computes (format.fill_crc).
    deferred: list[tuple[bytes, bytes, bytearray]] = field(default_factory=list)

    def fill_crcs(self) -> None:
        """Compute the deferred CRCs (in the writer thread; idempotent)."""
        for head, frame, placeholder in self.deferred:
            fill_crc(head, frame, placeholder)
        self.deferred.clear()

    def add(self, head: bytes, frame: bytes, crc: bytes) -> int:
        self.parts += (head, frame, crc)
        size = len(head) + len(frame) + len(crc)
        self.count += 1
        self.nbytes += size
        return size

    def record_bytes(self, index: int) -> int:
        parts = self.parts
        return len(parts[3 * index]) + len(parts[3 * index + 1]) + len(parts[3 * index + 2])

    def drop_first(self, n: int) -> Run:
        """The run without its first ``n`` records."""
        rest = Run(self.first_id + n, self.parts[3 * n :], self.count - n)
        rest.nbytes = sum(len(p) for p in rest.parts)
        self.fill_crcs()
        return rest


def make_run(first_id: int, items: Iterable[tuple[int, str, bytes]]) -> Run:
    """A run from plain (id, type, frame) items (tests, tools); ids must be consecutive."""
    run = Run(first_id)
    for event_id, event_type, frame in items:
        if event_id != run.first_id + run.count:
            raise ValueError(
                f"make_run: id {event_id} does not follow {run.first_id + run.count - 1}"
            )
        run.add(*record_parts(event_id, event_type, frame))
    return run


class Appender:
    """Appends runs of records to a session's segments, fsyncing once per batch.

    Built from a repairing :func:`scan` (its segments and next id). ``append`` writes the
    runs, rolling to a new segment when the current one would exceed ``segment_bytes``,
    ``fdatasync``s once, then deletes oldest segments while the total exceeds
    ``max_bytes`` (the newest is never deleted). A run that does not continue the journal
    resets it (all segments deleted, directory fsynced) and starts a new run of ids.
    In the steady state a batch costs one ``write`` and one ``fdatasync``: few moments
    where the worker thread must win the GIL back from a busy trio thread.

    On ``OSError`` the appender is *broken*: it closes its segment and re-derives its state
    from disk (repairing scan, fsync of every kept segment) before the next append, and
    skips the records of a retried batch that the scan found on disk.
    """

    def __init__(
        self, directory: Path, found: ScanResult, *, max_bytes: int, segment_bytes: int
    ) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.segments: list[Segment] = list(found.segments)
        self.next_id: int | None = found.next_id
        self.count = found.count
        self._fd: int | None = None
        self._broken = False
        self._skip_below: int | None = None
        self.bytes_written = 0
        self.records_written = 0
        self.fsyncs = 0
        self.resets = 0
        self.rotated_segments = 0
        #: Bytes of segment files after the last append (a plain int other threads may read).
        self.disk_bytes = sum(s.size for s in self.segments)

    @property
    def last_id(self) -> int | None:
        return None if self.next_id is None or self.count == 0 else self.next_id - 1

    def append(self, runs: Iterable[Run]) -> int:
        """Write and fsync ``runs``; bytes written. Raises ``OSError`` (then broken)."""
        if self._broken:
            self._recover()
        try:
            written = self._append(runs)
        except OSError:
            self._broken = True
            self._close_fd()
            raise
        self._skip_below = None
        return written

    def append_items(self, items: Iterable[tuple[int, str, bytes]]) -> int:
        """:meth:`append` for plain (id, type, frame) items, split into runs at id gaps."""
        runs: list[Run] = []
        for event_id, event_type, frame in items:
            if not runs or event_id != runs[-1].first_id + runs[-1].count:
                runs.append(Run(event_id))
            runs[-1].add(*record_parts(event_id, event_type, frame))
        return self.append(runs)

    def _append(self, runs: Iterable[Run]) -> int:
        written = 0
        dirty = False
        skip_below = self._skip_below
        runs = list(runs)
        for run in runs:
            run.fill_crcs()
        for run in runs:
            if skip_below is not None and run.first_id < skip_below:
                on_disk = min(skip_below - run.first_id, run.count)
                self.records_written += on_disk  # made durable by _recover's fsync
                run = run.drop_first(on_disk)
            if not run.count:
                continue
            if self.next_id is not None and run.first_id != self.next_id:
                self._reset()
            written += self._write_run(run)
            dirty = True
        if dirty and self._fd is not None:
            _datasync(self._fd)
            self.fsyncs += 1
        self._rotate()
        self.disk_bytes = sum(s.size for s in self.segments)
        return written

    def _write_run(self, run: Run) -> int:
        written = 0
        index = 0
        remaining = run.nbytes
        while index < run.count:
            event_id = run.first_id + index
            if self._fd is None:
                self._open_tail(event_id)
            size = self.segments[-1].size
            if size + remaining > self.segment_bytes:
                # Fill this segment with what fits (a record larger than a segment goes
                # alone into a fresh one), then seal it and start the next.
                room = self.segment_bytes - size
                end, taken = index, 0
                while end < run.count:
                    record = run.record_bytes(end)
                    if taken + record > room and (end > index or size > HEADER_BYTES):
                        break
                    taken += record
                    end += 1
                if end > index:
                    written += self._write(run.parts[3 * index : 3 * end])
                    remaining -= taken
                    index = end
                if index < run.count:
                    self._roll(run.first_id + index)
                continue
            written += self._write(run.parts[3 * index :] if index else run.parts)
            index = run.count
        self.next_id = run.first_id + run.count
        self.count += run.count
        self.records_written += run.count
        return written

    def _write(self, parts: list[bytes | bytearray]) -> int:
        assert self._fd is not None
        size = _writev_all(self._fd, parts)
        self.segments[-1].size += size
        self.bytes_written += size
        return size

    def _open_tail(self, event_id: int) -> None:
        """Reopen the newest segment when ``event_id`` continues it, else start one."""
        if self.segments and self.next_id == event_id:
            self._fd = os.open(self.segments[-1].path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            return
        self._roll(event_id)

    def _roll(self, first_id: int) -> None:
        """Seal the current segment (fsync) and start a new one whose first id is given."""
        if self._fd is not None:
            _datasync(self._fd)
            self.fsyncs += 1
            self._close_fd()
        path = self.directory / segment_name(first_id)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC
        self._fd = os.open(path, flags, FILE_MODE)
        self.segments = [s for s in self.segments if s.first_id != first_id]
        self.segments.append(Segment(first_id, path, 0))
        header = segment_header(first_id)
        _write_all(self._fd, header)
        self.segments[-1].size = len(header)
        self.bytes_written += len(header)
        fsync_dir(self.directory)

    def _reset(self) -> None:
        """Forget the current run of ids: delete every segment, durably."""
        self._close_fd()
        for seg in self.segments:
            seg.path.unlink(missing_ok=True)
        self.segments = []
        self.next_id = None
        self.count = 0
        self.resets += 1
        fsync_dir(self.directory)

    def _rotate(self) -> None:
        total = sum(s.size for s in self.segments)
        removed = False
        while total > self.max_bytes and len(self.segments) > 1:
            seg = self.segments.pop(0)
            total -= seg.size
            self.count -= _segment_count(seg, self.segments[0])
            seg.path.unlink(missing_ok=True)
            self.rotated_segments += 1
            removed = True
        if removed:
            fsync_dir(self.directory)

    def _recover(self) -> None:
        self._close_fd()
        found = scan(self.directory, collect=False, repair=True)
        for seg in found.segments:
            fd = os.open(seg.path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self.segments = found.segments
        self.next_id = found.next_id
        self.count = found.count
        self._skip_below = found.next_id
        self._broken = False

    def _close_fd(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                os.close(fd)

    def close(self) -> None:
        """Close the segment (every batch was fsynced when ``append`` returned)."""
        self._close_fd()


def _segment_count(seg: Segment, successor: Segment) -> int:
    return successor.first_id - seg.first_id


def now_ms() -> int:
    return int(time.time() * 1000)
