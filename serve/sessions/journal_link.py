"""The journal link of one session: its durable journal writer, and a log rebuilt from one.

:class:`JournalLink` opens a writer (fresh or appending), keeps a journal already read by a
load (:meth:`JournalLink.keep`: deciding costs no second read), and closes it;
:func:`log_from_replay` rebuilds an :class:`~serve.events.EventLog` from a journal after a
daemon restart. ``--no-journal`` or an I/O error: the session runs without one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Literal

import msgspec
import trio

from serve.events import EventLog
from serve.journal import (
    JournalBackend,
    JournalError,
    JournalMeta,
    JournalNotFound,
    JournalWriter,
    Replay,
)
from serve.sessions.turn_record import PromptsOnRecord, scan

log = logging.getLogger(__name__)

#: Longest a value given to :meth:`JournalLink.remember_soon` waits for its meta write
#: (seconds): back-to-back turns cost one write per interval, not one each.
REMEMBER_SOON_S = 1.0


def log_from_replay(
    session_id: str, replay: Replay, ring_size: int, ring_bytes: int, *, epoch: str | None = None
) -> EventLog:
    """An EventLog rebuilt from a journal's replay (same ids; the same epoch when the
    journal was closed cleanly, else ``epoch``, else a new one)."""
    epoch = replay.meta.epoch if replay.clean else epoch
    first = replay.records[0].event_id if replay.records else replay.next_id
    restored = EventLog(
        session_id, ring_size=ring_size, ring_bytes=ring_bytes, epoch=epoch, next_id=first
    )
    for event_id, _type, frame in replay:
        restored.restore(event_id, frame)
    return restored


class JournalLink:
    """One session's journal writer (``journal`` None: ``--no-journal``)."""

    def __init__(self, journal: JournalBackend | None) -> None:
        self.journal = journal
        self.writer: JournalWriter | None = None
        #: The meta's free-form attributes (serve/sessions/journal_load.py), kept when the
        #: journal is opened again.
        self.attrs: dict[str, str] = {}
        self._kept: tuple[EventLog, bool] | None = None
        #: The session's news that another daemon took it over (its writer was fenced).
        self.on_lost: Callable[[], bool] | None = None
        #: What the journal read by a load says about the session's prompts, until
        #: serve/sessions/recovery.py settles them.
        self.on_record: PromptsOnRecord | None = None
        #: Attributes :meth:`remember_soon` has yet to write, and its writer task's nursery.
        self._pending: dict[str, str] = {}
        self._writing = False
        self._nursery: trio.Nursery | None = None

    async def open(
        self,
        nursery: trio.Nursery,
        log_: EventLog,
        *,
        workspace: str,
        origin: Literal["new", "load", "resume"],
        fresh: bool,
    ) -> None:
        """Journal ``log_``'s events (an I/O error: the session runs without a journal)."""
        if self.journal is None or self.writer is not None:
            return
        meta = JournalMeta(
            session_id=log_.session_id,
            epoch=log_.epoch,
            workspace=workspace,
            acp_session_id=log_.session_id,
            origin=origin,
            created_at_ms=int(time.time() * 1000),
            attrs=dict(self.attrs),
        )
        try:
            writer = await self.journal.open_writer(meta, fresh=fresh)
        except JournalError as exc:
            log.warning("session %s runs without a journal: %s", log_.session_id, exc)
            return
        await self.adopt(nursery, log_, writer)

    async def adopt(self, nursery: trio.Nursery, log_: EventLog, writer: JournalWriter) -> None:
        """Journal ``log_``'s events with ``writer`` (opened by the caller: a reopen)."""
        self.writer = writer
        writer.on_lease_lost = self.on_lost
        self.attrs = dict(writer.meta.attrs)
        log_.sink = writer.sink
        self._nursery = nursery
        await nursery.start(writer.run)

    async def restore(
        self, session_id: str, ring_size: int, ring_bytes: int
    ) -> tuple[EventLog, bool] | None:
        """The log rebuilt from the journal (same ids; the same epoch when it was closed
        cleanly) and whether it held records; None when there is none to read. A read
        already made for this open (:meth:`keep`) is used instead of a second one."""
        kept, self._kept = self._kept, None
        if kept is not None:
            return kept
        if self.journal is None:
            return None
        try:
            replay = await self.journal.read(session_id, tail=ring_size)
        except JournalNotFound:
            return None
        except JournalError as exc:
            log.warning("journal of session %s unreadable: %s", session_id, exc)
            return None
        self.attrs = dict(replay.meta.attrs)
        self.on_record = scan(replay)
        return log_from_replay(session_id, replay, ring_size, ring_bytes), bool(replay.records)

    def keep(self, restored: EventLog, had_records: bool) -> None:
        """A journal read made before the agent was asked, for :meth:`restore` to use."""
        self._kept = (restored, had_records)

    async def remember(self, attrs: dict[str, str]) -> None:
        """Keep ``attrs`` in the journal's meta (written only when they changed)."""
        merged = {**self.attrs, **attrs}
        if merged == self.attrs:
            return
        self.attrs = merged
        writer = self.writer
        if writer is None or writer.closed:
            return
        await self._write_meta(writer)

    async def _write_meta(self, writer: JournalWriter) -> None:
        try:
            await writer.update_meta(msgspec.structs.replace(writer.meta, attrs=dict(self.attrs)))
        except JournalError as exc:
            log.warning("session %s: journal meta not updated: %s", writer.session_id, exc)

    def remember_soon(self, attrs: dict[str, str]) -> None:
        """:meth:`remember` off the caller's path (e.g. the budget after each turn): at
        most one write per :data:`REMEMBER_SOON_S`, the values given meanwhile coalesced
        into it; what is left when the journal closes is written then."""
        self._pending.update(attrs)
        if self._writing or self._nursery is None:
            return
        try:
            self._nursery.start_soon(self._write_pending)
        except RuntimeError:  # the session's nursery is closed: the close wrote them
            return
        self._writing = True

    async def _write_pending(self) -> None:
        try:
            while self._pending:
                await trio.sleep(REMEMBER_SOON_S)  # coalesce back-to-back turns' values
                attrs, self._pending = self._pending, {}
                await self.remember(attrs)
        finally:
            self._writing = False

    async def flush(self) -> None:
        """What was published so far is durable (an I/O error is logged: the writer
        retries on its own)."""
        writer = self.writer
        if writer is None or writer.closed:
            return
        try:
            await writer.flush()
        except JournalError as exc:
            log.warning("session %s: journal not flushed: %s", writer.session_id, exc)

    async def aclose(self, timeout_s: float = 5.0) -> None:
        writer = self.writer
        if writer is not None:
            with trio.CancelScope(shield=True), trio.move_on_after(timeout_s):
                self.attrs = {**self.attrs, **self._pending}
                self._pending = {}
                if not writer.closed and self.attrs != writer.meta.attrs:
                    await self._write_meta(writer)  # what a cancelled write left unwritten
                await writer.aclose()

    def statistics(self) -> dict[str, Any] | None:
        return self.writer.statistics() if self.writer is not None else None


__all__ = ["JournalLink", "log_from_replay"]
