"""The journal as the rest of the daemon sees it: :class:`JournalBackend` and its writers.

Two implementations: the files journal (:class:`serve.journal.journal.Journal`, the
default: one directory per session under ``<state_dir>/journal``) and the PostgreSQL
journal (:class:`serve.journal.pg.PgJournal`, ``--journal-url postgresql://...``; see
docs/postgres-journal.md). Both give the same guarantees: what survives a crash is a
gap-free prefix of each session's ids, a clean close is marked (:attr:`Replay.clean`),
each session is bounded (``max_session_bytes``), and the janitor applies the retention and
the total bound to closed journals only. Their writers share the hot path and the flusher
(:class:`serve.journal.writer.SessionJournal`); only where a batch goes differs.

This is the narrowest interface the sessions, the routes and the runtime use; nothing
outside ``serve.journal`` names an implementation except the place that builds one
(``serve.runtime.build``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import trio

from serve.journal.store import JournalMeta
from serve.journal.types import JournalLimits, Ownership, Replay


class JournalWriter(Protocol):
    """One session's open journal (:class:`serve.journal.writer.SessionJournal`)."""

    session_id: str
    meta: JournalMeta
    degraded: bool
    #: Called (trio thread) once a shared journal's lease was lost (serve/journal/pg).
    on_lease_lost: Callable[[], bool] | None

    @property
    def closed(self) -> bool: ...

    def sink(self, event_id: int, event_type: str, frame: bytes) -> None:
        """The EventLog's sink: buffer one published frame (never blocks or raises)."""

    async def run(self, *, task_status: trio.TaskStatus[None] = ...) -> None:
        """The flusher task, in the session's nursery, until :meth:`aclose`."""

    async def flush(self) -> None:
        """Every event accepted so far is durable (or :class:`JournalIOError`)."""

    async def update_meta(self, meta: JournalMeta) -> None:
        """Replace the stored meta (the same session id)."""

    async def aclose(self, *, discard: bool = False) -> None:
        """Flush, mark clean, give the journal up. Idempotent; never raises for I/O."""

    def statistics(self) -> dict[str, Any]: ...


@runtime_checkable
class JournalBackend(Protocol):
    """The daemon's journal: writers opened and reopened, reads, deletes, the janitor."""

    limits: JournalLimits

    async def open_writer(self, meta: JournalMeta, *, fresh: bool = False) -> JournalWriter:
        """Create (``fresh``: empty) or continue a session's journal; :class:`JournalBusy`
        when a writer holds it (here, in another process, or another daemon's lease)."""

    async def reopen(
        self, session_id: str, *, tail: int | None, meta_for: Callable[[Replay], JournalMeta]
    ) -> tuple[Replay, JournalWriter]:
        """Read and open for appending in one step (:class:`JournalNotFound` when none)."""

    async def read(self, session_id: str, *, tail: int | None = None) -> Replay:
        """A session's meta and its last ``tail`` events (:class:`JournalNotFound`)."""

    async def list_sessions(self) -> list[JournalMeta]:
        """Metas of every journal, oldest first."""

    async def delete(self, session_id: str) -> bool:
        """Close this daemon's writer and remove the journal; True when one was removed."""

    async def run_janitor(self, *, task_status: trio.TaskStatus[None] = ...) -> None:
        """The journal's service (retention, total bound; the PostgreSQL journal also
        renews its leases here): runs until cancelled."""

    async def flush(self) -> None:
        """Make every open writer's accepted events durable (``POST /daemon/drain``)."""

    async def aclose(self) -> None:
        """Close every open writer (and the PostgreSQL journal's pool)."""

    def statistics(self) -> dict[str, Any]: ...


@runtime_checkable
class SharedJournal(JournalBackend, Protocol):
    """A journal several daemons share (the PostgreSQL one): each session has one owner,
    and any daemon can ask who it is (``serve.cluster``)."""

    owner_id: str | None

    async def owner_of(self, session_id: str) -> Ownership | None:
        """The session's lease holder and whether it may be taken (None: no journal)."""

    async def peers(self) -> list[str]:
        """The addresses of the other live daemons that own sessions."""
