"""Cancelling a turn, and what happens when the agent ignores it.

A cancel (``POST /session/:id/cancel``, a disconnected client's prompt) publishes
``prompt_cancelled``, withdraws the session's open permission requests, and sends
``session/cancel`` as a task of the session's nursery; a queued prompt is simply removed
with its terminal. A cancel the agent ignores escalates (:func:`escalate_cancel`): after
``--cancel-grace-ms`` the turn ends with ``turn_error {code:"cancel_timeout"}`` and the agent
is restarted in place. On a shared child (``--sessions-per-agent`` > 1) that would hit every
session on it, so the child is first probed (:meth:`AgentLink.responsive`: any answer within
:data:`PROBE_TIMEOUT_S` means it still reads and writes for everyone): responsive, only this
session leaves it (:meth:`AgentBinding.leave_shared_child`); unresponsive for all, the child
is killed and every session on it restores itself.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from acp.errors import AcpError
from actors import ActorError
from serve.permissions.mediator import CancelSessionPermissions
from serve.sessions import turns
from serve.sessions.prompt_events import finish, publish_terminal

if TYPE_CHECKING:
    from serve.sessions.core import SessionCore
    from serve.sessions.prompt_queue import Job

log = logging.getLogger(__name__)

#: Bound on the answer to the liveness probe of a shared child whose session ignored a
#: cancel (seconds): no answer at all, and the child is unresponsive for every session.
PROBE_TIMEOUT_S = 2.0
#: Bound on the permission mediator's answer (an actor: quick) on cancel and close.
MEDIATOR_TIMEOUT_S = 2.0


async def cancel_turn(session: SessionCore, client_id: str | None) -> None:
    active = session.prompts.running
    session.log.publish(
        "prompt_cancelled",
        {"sessionId": session.session_id, "reason": "client_cancel"},
        prompt_id=active.prompt_id if active else None,
        originator=client_id,
    )
    await cancel_permissions(session)
    session.spawn(send_cancel, session)
    if active is not None and not active.done:
        session.spawn(escalate_cancel, session, active)


async def cancel_prompt(session: SessionCore, prompt_id: str, client_id: str | None) -> None:
    """Cancel one prompt: the running one through the agent, a queued one at once."""
    running = session.prompts.running
    if running is not None and running.prompt_id == prompt_id:
        await cancel_turn(session, client_id)
        return
    if any(j.prompt_id == prompt_id for j in session.prompts.queued):
        session.log.publish(
            "prompt_cancelled",
            {"sessionId": session.session_id, "reason": "client_disconnected"},
            prompt_id=prompt_id,
            originator=client_id,
        )
        terminal = session.prompts.cancel_queued(
            prompt_id, {"sessionId": session.session_id, "stopReason": "cancelled"}
        )
        publish_terminal(session, terminal)


async def send_cancel(session: SessionCore) -> None:
    """``session/cancel`` to the agent (a notification; bounded by the link)."""
    conn = session.link.conn
    if conn is not None and not conn.closed:
        try:
            with trio.move_on_after(session.settings.initialize_timeout_ms / 1000):
                await conn.cancel(session.session_id)
        except AcpError:
            pass


async def escalate_cancel(session: SessionCore, job: Job) -> None:
    """A cancel the agent ignores: after the grace the turn ends with ``turn_error
    {code:"cancel_timeout"}`` and the agent is restarted in place."""
    grace_ms = session.settings.cancel_grace_ms
    if not grace_ms:
        return
    await trio.sleep(grace_ms / 1000)
    if job.done or session.prompts.running is not job or session.closing:
        return
    finish(session, job, "turn_error", turns.cancel_timeout(session.session_id, grace_ms))
    link = session.link
    if link.shared and await link.responsive(PROBE_TIMEOUT_S):
        if not session.closing and session.prompts.running is job:
            log.warning(
                "agent of session %s ignored session/cancel for %d ms: the session leaves its "
                "shared child (pid %s)",
                session.session_id,
                grace_ms,
                link.pid,
            )
            await session.binding.leave_shared_child()
        return
    log.warning(
        "agent of session %s ignored session/cancel for %d ms: restarting it",
        session.session_id,
        grace_ms,
    )
    session.binding.killed_agent = True
    await link.kill()  # the child watcher restarts it in place


async def cancel_permissions(session: SessionCore, *, forget: bool = False) -> None:
    try:
        with trio.move_on_after(MEDIATOR_TIMEOUT_S):
            await session.mediator.ask(
                CancelSessionPermissions(session.session_id, "session_closed", forget=forget),
                timeout_s=MEDIATOR_TIMEOUT_S,
            )
    except ActorError:
        pass
