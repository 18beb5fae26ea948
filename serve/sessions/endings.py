"""How a session ends: every unfinished prompt gets its terminal, then one final event;
or, handed over to another daemon, with no event at all.

:func:`abort_everything` runs once (``ended`` guards it): the running turn's request is
abandoned, every admitted prompt ends (``turns.aborted``: ``turn_complete {promptCancelled}``
on a close, ``turn_error`` with the reason when the session died), the session's permission
requests are withdrawn and forgotten, ``session/cancel`` is sent on a close (best effort;
the child is stopped next), the inbox is drained (the mediator's ``permission_resolved``
events for that withdrawal must precede the final event), then ``session_closed
{reason, closedBy?}`` or ``session_died {reason, exitCode?, signalCode?}`` is published and
the log closed (SSE streams drain and end).

:func:`hand_over` (``POST /daemon/drain`` in a cluster, ``--journal-url``) ends an idle
session on this daemon only: its permission requests are withdrawn, its streams end with
no final event (clients reconnect with ``Last-Event-ID``, and reach the daemon that
restores it), and the actor stops; its agent is stopped and its journal flushed and closed
cleanly (a PostgreSQL lease is released: ``expires_at = now()``), so another daemon
restores it from the journal on the next request, with the same event epoch.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from serve.sessions import cancelling, turns
from serve.sessions.binding import signal_name
from serve.sessions.prompt_events import publish_terminal

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from acp.process import ExitInfo
    from serve.sessions.core import SessionCore


async def abort_everything(
    session: SessionCore,
    reason: str,
    *,
    died: bool,
    exit_info: ExitInfo | None = None,
    closed_by: str | None = None,
) -> None:
    """Terminal events for every unfinished prompt, cancel permissions, final event."""
    if session.ended.is_set():
        return
    session.closing = True
    if session.turn_scope is not None:
        session.turn_scope.cancel()
    sid = session.session_id
    kind, data = turns.aborted(sid, reason, died=died)
    for terminal in session.prompts.abort_all(kind, data):
        publish_terminal(session, terminal)
    await cancelling.cancel_permissions(session, forget=True)
    nursery = session.calls.nursery
    if not died and nursery is not None:
        nursery.start_soon(cancelling.send_cancel, session)  # the child is stopped next
    await session.drain_inbox()
    if died:
        final: dict[str, Any] = {"sessionId": sid, "reason": reason}
        if exit_info is not None:
            final["exitCode"] = exit_info.exit_code
            final["signalCode"] = signal_name(exit_info.signal)
        session.log.publish("session_died", final)
        log.info("session %s died (%s)", sid, reason)
    else:
        final = {"sessionId": sid, "reason": reason}
        if closed_by is not None:
            final["closedBy"] = closed_by
        session.log.publish("session_closed", final, originator=closed_by)
        log.info("session %s closed (%s)", sid, reason)
    session.log.close()
    session.ended.set()


async def hand_over(session: SessionCore) -> bool:
    """Leave this daemon without a final event (module docstring); False while busy. The
    caller then stops the actor (its ``run`` closes the agent and the journal)."""
    if session.ended.is_set() or session.closing or session.pending_count:
        return False
    session.closing = True
    await cancelling.cancel_permissions(session, forget=True)
    await session.drain_inbox()
    session.log.close()
    session.ended.set()
    log.info("session %s handed over: its journal is closed for another daemon", session.session_id)
    return True
