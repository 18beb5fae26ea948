"""A session's access record (owner, members) in its journal, so it survives a restart.

The record itself (:class:`serve.access.SessionAccess`) is the session actor's own state,
``SessionActor.access``, swapped whole. :func:`settle` runs once the agent link opened (or
the journal was read for a lazy load): a journaled record wins over the one the session
was made with (a load or resume after a daemon restart keeps its owner); otherwise a record
other than the default (owner ``operator``, no members) is written into the journal meta's
``attrs``. :func:`set_access` is ``SetAccess`` (``PUT /session/:id/members``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from serve.access.roles import ATTR, SessionAccess, from_attr, to_attr

if TYPE_CHECKING:
    from serve.sessions.journal_link import JournalLink
    from serve.sessions.messages import SetAccess

__all__ = ["set_access", "settle"]


class _Owned(Protocol):
    access: SessionAccess
    journal_link: JournalLink


async def settle(session: _Owned) -> None:
    journaled = from_attr(session.journal_link.attrs)
    if journaled is not None:
        session.access = journaled
    elif session.access != SessionAccess():
        await session.journal_link.remember({ATTR: to_attr(session.access)})


async def set_access(session: _Owned, msg: SetAccess) -> SessionAccess:
    session.access = msg.access
    await session.journal_link.remember({ATTR: to_attr(msg.access)})
    return msg.access
