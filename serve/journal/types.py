"""The journal's vocabulary: its errors, its limits and a journal as read back.

:class:`JournalError` and its kinds say who failed: :class:`JournalNotFound` (nothing to
restore), :class:`JournalBusy` (another writer holds the journal),
:class:`JournalIOError` (the file system; the ``OSError`` is chained). :class:`JournalLimits`
bounds every session journal (units in the names, checked at construction);
:class:`Replay` is what :meth:`serve.journal.journal.Journal.read` returns.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

import msgspec

from serve.journal.format import JournalRecord
from serve.journal.store import JournalMeta

KIB = 1024
MIB = 1024 * KIB


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


#: The event types that end a session (``session_closed`` / ``session_died``): a journal
#: whose last event is one of them belongs to a session that ended, not one to take over.
FINAL_EVENTS: Final = frozenset({"session_closed", "session_died"})


class Ownership(msgspec.Struct, frozen=True, kw_only=True):
    """Who holds a journaled session on a shared journal (``PgJournal.owner_of``)."""

    session_id: str
    #: The lease holder's daemon id (None: never leased, or its lease row was deleted).
    owner_id: str | None
    #: How to reach the holder (its ``--advertise-url``); "" when unknown.
    address: str
    #: The lease is unexpired and its holder's liveness lock is held.
    alive: bool
    #: The holder is this daemon.
    mine: bool
    #: The journal's last event ends the session (it is not taken over, only loaded).
    ended: bool
    #: The session's workspace (from its meta).
    workspace: str
    #: What is left of the lease, in ms (0: expired, or none).
    lease_left_ms: int = 0
