"""A session's access record (owner, members) in its journal, so it survives a restart.

The record itself (:class:`serve.access.SessionAccess`) is the session actor's own state,
``SessionActor.access``, swapped whole. Every journal carries one from its first write,
the operator's included: :func:`stamp` puts it into the meta's ``attrs`` before a fresh
journal is opened, so the meta written at the open already names the owner.
:func:`settle` runs once the agent link opened (or the journal was read for a lazy load):
a journaled record wins over the one the session was made with (a load or resume after a
daemon restart keeps its owner); a journal without one (written before multi-user auth,
or by an older daemon) gets the session's. A session with no record anywhere is restored
only by an ``admin`` (``SessionService.check_journaled``). :func:`set_access` is
``SetAccess`` (``PUT /session/:id/members``).
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Protocol

from serve.access.roles import ATTR, SessionAccess, from_attr, to_attr
from serve.journal import JournalBackend, JournalError, JournalMeta

if TYPE_CHECKING:
    from serve.sessions.journal_link import JournalLink
    from serve.sessions.messages import SetAccess

__all__ = ["journal_record", "set_access", "settle", "stamp"]

log = logging.getLogger(__name__)


class _Owned(Protocol):
    access: SessionAccess
    journal_link: JournalLink


def stamp(session: _Owned) -> None:
    """The session's record into the attrs a journal about to be opened is written with
    (a record already there, read from the journal, is kept; a journal already open gets
    its record from :func:`settle`)."""
    if session.journal_link.writer is None:
        session.journal_link.attrs.setdefault(ATTR, to_attr(session.access))


async def settle(session: _Owned) -> None:
    journaled = from_attr(session.journal_link.attrs)
    if journaled is not None:
        session.access = journaled
    else:
        await session.journal_link.remember({ATTR: to_attr(session.access)})


async def set_access(session: _Owned, msg: SetAccess) -> SessionAccess:
    session.access = msg.access
    await session.journal_link.remember({ATTR: to_attr(msg.access)})
    return msg.access


async def journal_record(
    journal: JournalBackend, session_id: str, workspace: str, access: SessionAccess
) -> None:
    """A journal holding only ``access`` (no events) for a session the agent made outside
    the registry (a vendor branch not loaded): a load after a daemon restart goes by it
    (a journal without events loads through the agent, serve/sessions/journal_load.py).
    An I/O error is logged: the record kept in memory still holds until the restart."""
    meta = JournalMeta(
        session_id=session_id,
        epoch=str(uuid.uuid4()),
        workspace=workspace,
        acp_session_id=session_id,
        origin="new",
        created_at_ms=int(time.time() * 1000),
        attrs={ATTR: to_attr(access)},
    )
    try:
        writer = await journal.open_writer(meta)
    except JournalError as exc:
        log.warning("session %s: owner record not journaled: %s", session_id, exc)
        return
    await writer.aclose()
