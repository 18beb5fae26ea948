"""Model and approval-mode switches of a session (``POST /session/:id/model`` and
``/approval-mode``; ``/acp`` ``session/set_model`` and ``session/set_mode``).

Started from the session's inbox (:func:`start_model_switch`, :func:`start_mode_change`)
and run off it by :class:`~serve.sessions.control.AgentCalls` (serialized among themselves,
bounded by the caller's timeout); a released session binds an agent first
(:meth:`~serve.sessions.binding.AgentBinding.bound_then`). Approval modes are the agent's
own ids, or qwen's five names mapped onto them (serve/permissions/modes.py); an unknown one
is refused before anything is sent (:class:`ApprovalModeRefused`). The outcome is published
(``model_switched`` / ``model_switch_failed``, ``approval_mode_changed``) and answered.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from acp.errors import RemoteError, RequestTimeout
from actors import Reply
from serve.permissions.modes import UnknownApprovalMode, apply_mode, resolve_mode
from serve.sessions.messages import ApprovalModeRefused, ModelSet, ModelSwitchFailed, ModeSet

if TYPE_CHECKING:
    from serve.sessions.core import SessionCore
    from serve.sessions.messages import SetApprovalMode, SetModel


def start_model_switch(session: SessionCore, msg: SetModel) -> Reply[ModelSet]:
    return session.calls.start_switch(
        "model switch",
        msg.timeout_s,
        functools.partial(
            session.binding.bound_then, "model", functools.partial(_set_model, session), msg
        ),
        connected=lambda: session.link.connected or session.binding.released,
    )


def start_mode_change(session: SessionCore, msg: SetApprovalMode) -> Reply[ModeSet]:
    check_approval_mode(session, msg.mode)
    return session.calls.start_switch(
        "approval mode change",
        msg.timeout_s,
        functools.partial(
            session.binding.bound_then, "mode", functools.partial(_set_approval_mode, session), msg
        ),
        connected=lambda: session.link.connected or session.binding.released,
    )


async def _set_model(session: SessionCore, msg: SetModel, timeout_s: float) -> ModelSet:
    conn = session.link.conn
    assert conn is not None
    try:
        await conn.set_model(
            session.session_id,
            msg.model_id,
            timeout_s=min(timeout_s, session.settings.initialize_timeout_ms / 1000),
        )
    except (RemoteError, RequestTimeout) as exc:
        error = exc.message if isinstance(exc, RemoteError) else str(exc)
        session.log.publish(
            "model_switch_failed",
            {"sessionId": session.session_id, "requestedModelId": msg.model_id, "error": error},
            originator=msg.client_id,
        )
        raise ModelSwitchFailed(msg.model_id, error) from None
    session.current_model = msg.model_id
    session.log.publish(
        "model_switched",
        {"sessionId": session.session_id, "modelId": msg.model_id},
        originator=msg.client_id,
    )
    return ModelSet(msg.model_id)


def check_approval_mode(session: SessionCore, mode: str) -> str:
    """The agent's mode id for ``mode`` (its own id, or a qwen name mapped onto it)."""
    try:
        return resolve_mode(mode, session.agent_modes())
    except UnknownApprovalMode as exc:
        raise ApprovalModeRefused(str(exc), allowed=exc.allowed) from None


async def _set_approval_mode(
    session: SessionCore, msg: SetApprovalMode, timeout_s: float
) -> ModeSet:
    """Agent ids as is, qwen names mapped onto them (serve/permissions/modes.py)."""
    conn = session.link.conn
    assert conn is not None
    modes = session.agent_modes()
    mode_id = check_approval_mode(session, msg.mode)
    previous = session.current_mode
    try:
        reported = await apply_mode(
            conn,
            session.session_id,
            modes,
            mode_id,
            timeout_s=min(timeout_s, session.settings.initialize_timeout_ms / 1000),
        )
    except (RemoteError, RequestTimeout) as exc:
        error = exc.message if isinstance(exc, RemoteError) else str(exc)
        raise ApprovalModeRefused(f"Approval mode change failed: {error}") from None
    if reported is None:  # set_mode answers {}: a current_mode_update may have come
        seen = session.current_mode
        reported = seen if seen is not None and seen != previous else mode_id
    session.current_mode = reported
    event: dict[str, Any] = {"sessionId": session.session_id, "previous": previous}
    event.update(next=reported, persisted=False)
    requested = msg.mode if reported != msg.mode else None
    if requested is not None:
        event["requested"] = requested
    session.log.publish("approval_mode_changed", event, originator=msg.client_id)
    return ModeSet(session.session_id, reported, previous, False, requested)
