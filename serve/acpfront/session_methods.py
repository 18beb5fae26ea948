"""The session methods of ``/acp``: ``session/*`` and ``_qwen/session/*``, plus status.

Each handler is ``(front, conn, params) -> result`` (the dispatch table,
:mod:`.dispatch`): it validates ``params``, then sends the session actor, the registry or
the Host a message and shapes the typed reply. Creation and restore go to the
SessionRegistry (``CreateSession``/``RestoreSession``, admitted under the connection's
session bound first, :func:`serve.acpfront.links.reserve`); prompts, cancel, close, mode
and model switches, metadata and heartbeats to the session actor (``SubmitPrompt``,
``CancelTurn``, ...). A domain error a reply raises propagates: the dispatch renders it
once through the error table (:mod:`.errors`). The few rebuilds left here change what
the client reads on purpose (an agent that failed to start, a restore of a session the
agent does not know, a failed turn).

The application layer (:class:`serve.api.SessionService`) answers ``session/list``; the
other use cases move onto it once ``/acp`` takes REST's answers where the two fronts
drifted (listed in :mod:`serve.api`'s docstring: each move changes an ``/acp`` body).
"""

from __future__ import annotations

import os
from typing import Any

import trio

from actors import ActorStopped, InboxFull
from serve.acpfront import access as acp_access
from serve.acpfront import steering, v121
from serve.acpfront.connections import ASK_TIMEOUT_S, Connection, Connections, SessionLink
from serve.acpfront.errors import draining, not_found, params_error, to_rpc, unserved
from serve.acpfront.jsonrpc import INTERNAL_ERROR, METHOD_NOT_FOUND, SERVER_ERROR, RpcError
from serve.acpfront.links import Replied, own_made, owned, reserve
from serve.api import SessionService, parse_prompt, prompt_content
from serve.errors import RETRYABLE_TURN_CODES
from serve.sessions.actor import SessionActor
from serve.sessions.messages import (
    CancelTurn,
    CloseSession,
    Heartbeat,
    MetadataSet,
    ModelSet,
    ModeSet,
    SessionView,
    SetApprovalMode,
    SetModel,
    UpdateMetadata,
)
from serve.sessions.registry import CreateSession, RestoreSession, Ticket
from serve.status.agent import context_state, supported_commands

__all__ = [
    "context",
    "detach",
    "health",
    "heartbeat",
    "session_cancel",
    "session_close",
    "session_list",
    "session_load",
    "session_new",
    "session_prompt",
    "session_result",
    "session_resume",
    "session_set_mode",
    "session_set_model",
    "session_steering",
    "status",
    "supported_commands_of",
    "update_metadata",
    "workspace_of",
]

# ---- shared steps -------------------------------------------------------------------------


def workspace_of(front: Connections, conn: Connection, params: dict[str, Any]) -> str:
    """The served workspace ``params.cwd`` names (the connection's when absent)."""
    registry = front.host.registry
    raw = params.get("cwd", params.get("workspaceCwd"))
    if raw is None:
        return conn.workspace
    if not isinstance(raw, str) or not os.path.isabs(raw):
        raise params_error("`cwd` must be an absolute path")
    try:
        cwd = os.path.realpath(raw)
    except (OSError, ValueError):
        cwd = os.path.normpath(raw)
    runtime = registry.by_ref(raw) if cwd not in registry.runtimes else None
    found = cwd if cwd in registry.runtimes else str(runtime.path) if runtime else None
    # One the caller may not use answers as one not served (nothing tells them apart).
    if found is not None and acp_access.may_use(front.host, conn, found):
        return found
    raise unserved(cwd)


async def _ticket_session(
    front: Connections, msg: CreateSession | RestoreSession
) -> tuple[SessionActor, bool]:
    if front.host.draining:
        raise draining()
    ticket: Ticket = await front.host.registry.ask(msg, timeout_s=ASK_TIMEOUT_S)
    try:
        session: SessionActor = await ticket.pending.wait()
    except RpcError:
        raise
    except Exception as exc:
        error = to_rpc(exc)
        if error.code == INTERNAL_ERROR:  # not a domain error: the agent did not start
            error = RpcError(
                SERVER_ERROR,
                f"Agent failed to start: {exc}",
                {"httpStatus": 503, "code": "acp_channel_unavailable", "retryable": True},
            )
        raise error from None
    return session, bool(ticket.attached)


def session_result(view: SessionView, link: SessionLink, attached: bool) -> dict[str, Any]:
    state = view.state
    out: dict[str, Any] = {
        "sessionId": view.session_id,
        **{k: state[k] for k in ("modes", "models", "configOptions") if k in state},
        "workspaceCwd": view.workspace,
        "attached": attached,
        "clientId": link.client_id,
        "createdAt": view.created_at,
    }
    return out


# ---- create, restore, list ----------------------------------------------------------------


async def session_new(
    front: Connections, conn: Connection, params: dict[str, Any]
) -> dict[str, Any]:
    workspace = workspace_of(front, conn, params)
    dirs = await v121.additional_directories(front, params, workspace)
    raw_meta = params.get("_meta")
    meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
    scope = meta.get("qwen-code/sessionScope", "thread") if meta else "thread"
    if scope not in ("single", "thread"):
        raise params_error("`_meta.qwen-code/sessionScope` must be single or thread")
    if meta and meta.get("qwen-code/sessionId") is not None:
        raise params_error(
            "`sessionId` overrides are not supported by this daemon", code="invalid_session_id"
        )
    reserved = reserve(conn)
    try:
        acp_access.check_workspace(front.host, conn, workspace)
        owner, quota = acp_access.owner_of(front.host, conn)
        session, attached = await _ticket_session(
            front, CreateSession(workspace, scope, dirs, owner, quota)
        )
        # A session made for this call: its set-up events (available commands, ...) too.
        link, view = await own_made(front, conn, session, attached, replay=not attached)
    finally:
        conn.reserved_sessions -= reserved
    out = session_result(view, link, attached)
    mode = params.get("approvalMode")
    if not mode and not attached:
        mode = front.host.settings.approval_mode  # --approval-mode, the operator's
    if isinstance(mode, str) and mode:
        try:
            await session.call(SetApprovalMode(mode, False, link.client_id), timeout_s=30)
        except Exception:
            pass  # as on REST: the session stands in its agent's mode
    model = params.get("modelServiceId")
    if isinstance(model, str) and model:
        try:
            await session.call(SetModel(model, link.client_id), timeout_s=60)
            out["modelApplied"] = True
        except Exception:
            out["modelApplied"] = False
    return out


async def _restore(
    front: Connections, conn: Connection, params: dict[str, Any], action: str
) -> dict[str, Any]:
    sid = params.get("sessionId")
    if not isinstance(sid, str) or not sid:
        raise params_error("`sessionId` must be a non-empty string")
    workspace = workspace_of(front, conn, params)
    dirs = await v121.additional_directories(front, params, workspace)
    acp_access.check_workspace(front.host, conn, workspace)
    await acp_access.check_restore(front.host, conn, sid)
    owner, quota = acp_access.owner_of(front.host, conn)
    reserved = reserve(conn, sid)
    try:
        try:
            session, attached = await _ticket_session(
                front, RestoreSession(sid, workspace, action, dirs, owner, quota)
            )
        except RpcError as exc:
            # The agent's own "no such session" (a remote error) is the daemon's 404.
            data = exc.data if isinstance(exc.data, dict) else {}
            if data.get("httpStatus") == 500 and data.get("code") in (-32002, -32602):
                raise not_found(sid) from None
            raise
        link, view = await own_made(front, conn, session, attached, replay=action == "load")
    finally:
        conn.reserved_sessions -= reserved
    out = session_result(view, link, attached)
    out["state"] = view.state
    out["lastEventId"] = view.last_event_id
    out["eventEpoch"] = view.epoch
    return out


async def session_load(
    front: Connections, conn: Connection, params: dict[str, Any]
) -> dict[str, Any]:
    return await _restore(front, conn, params, "load")


async def session_resume(
    front: Connections, conn: Connection, params: dict[str, Any]
) -> dict[str, Any]:
    return await _restore(front, conn, params, "resume")


async def session_list(
    front: Connections, conn: Connection, params: dict[str, Any]
) -> dict[str, Any]:
    workspace = (
        workspace_of(front, conn, params)
        if params.get("cwd") is not None or params.get("workspaceCwd") is not None
        else None
    )
    sessions = []
    shown = acp_access.visible(front.host, conn)  # multi-user: only what it may see
    for found in await SessionService(front.host).summaries(workspace, shown):  # serve/api
        summary = dict(found)
        summary["cwd"] = summary.get("workspaceCwd")
        summary["title"] = summary.get("displayName")
        summary["updatedAt"] = summary.get("createdAt")
        sessions.append(summary)
    return {"sessions": sessions}


# ---- close, detach ------------------------------------------------------------------------


async def session_close(front: Connections, conn: Connection, params: dict[str, Any]) -> Replied:
    link = owned(conn, params)
    link.hold_end = True
    try:
        await link.session.call(
            CloseSession(reason="client_close", closed_by=link.client_id),
            timeout_s=ASK_TIMEOUT_S,
        )
        # The session's last events (session_closed) are queued before the reply.
        with trio.move_on_after(5):
            await link.pump_done.wait()
    finally:
        link.hold_end = False
    return Replied(front, conn, link, "close")


async def detach(front: Connections, conn: Connection, params: dict[str, Any]) -> Replied:
    return Replied(front, conn, owned(conn, params), "detach")


# ---- turns --------------------------------------------------------------------------------


async def session_prompt(
    front: Connections, conn: Connection, params: dict[str, Any]
) -> dict[str, Any]:
    link = owned(conn, params)
    # One validation for both fronts (serve/api/prompts.py): the content, the `_meta` the
    # agent gets, `promptId` and `deadlineMs` with REST's bounds and codes.
    body = parse_prompt(params, steering=False)
    SessionService(front.host).check_prompt_quota(conn.principal)  # multi-user quotas
    session = link.session
    admission = await session.call(body.request(link.client_id), timeout_s=ASK_TIMEOUT_S)
    try:
        await admission.done.wait()
    except trio.Cancelled:
        # The request went away (its connection closed): cancel its prompt, as on REST.
        if not admission.done.is_set():
            try:
                session.tell_nowait(CancelTurn(link.client_id, admission.prompt_id))
            except (InboxFull, ActorStopped):
                pass
        raise
    terminal = admission.job.terminal
    event_type, data = terminal.kind, terminal.data
    if event_type == "turn_complete":
        out: dict[str, Any] = {
            "stopReason": data["stopReason"],
            "promptId": admission.prompt_id,
            "_meta": {"qwen": {"promptId": admission.prompt_id}},
        }
        if "branchPoint" in data:
            out["branchPoint"] = data["branchPoint"]
        return out
    code = data.get("code")
    status = 402 if code == "budget_exhausted" else 503 if code in RETRYABLE_TURN_CODES else 500
    detail = {k: data[k] for k in ("code", "data", "errorKind") if k in data}
    raise RpcError(
        INTERNAL_ERROR,
        str(data.get("message", "prompt failed")),
        {"httpStatus": status, "promptId": admission.prompt_id, **detail},
    )


async def session_steering(
    front: Connections, conn: Connection, params: dict[str, Any]
) -> dict[str, Any]:
    link = owned(conn, params)  # serve/acpfront/steering.py
    content = prompt_content(params.get("prompt"))
    # A steer starts or extends a turn: charged as a prompt (multi-user quotas).
    SessionService(front.host).check_prompt_quota(conn.principal)
    return await steering.steer(
        link.session, link.client_id, content.blocks, content.text, params, ASK_TIMEOUT_S
    )


async def session_cancel(
    front: Connections, conn: Connection, params: dict[str, Any]
) -> dict[str, Any]:
    link = owned(conn, params)
    await link.session.call(CancelTurn(link.client_id), timeout_s=ASK_TIMEOUT_S)
    return {}


# ---- switches and metadata ----------------------------------------------------------------


async def session_set_mode(
    front: Connections, conn: Connection, params: dict[str, Any]
) -> dict[str, Any]:
    link = owned(conn, params)
    mode = params.get("modeId", params.get("mode"))
    if not isinstance(mode, str) or not mode:
        raise params_error("`modeId` must be a non-empty string")
    changed: ModeSet = await link.session.call(
        SetApprovalMode(mode, False, link.client_id), timeout_s=ASK_TIMEOUT_S
    )
    out: dict[str, Any] = {
        "sessionId": changed.session_id,
        "previous": changed.previous,
        "mode": changed.mode,
        "persisted": changed.persisted,
    }
    if changed.requested is not None:
        out["requested"] = changed.requested
    return out


async def session_set_model(
    front: Connections, conn: Connection, params: dict[str, Any]
) -> dict[str, Any]:
    link = owned(conn, params)
    model = params.get("modelId")
    if not isinstance(model, str) or not model.strip():
        raise params_error("`modelId` must be a non-empty string")
    switched: ModelSet = await link.session.call(
        SetModel(model, link.client_id, timeout_s=60.0), timeout_s=60
    )
    return {"modelId": switched.model_id}


async def heartbeat(front: Connections, conn: Connection, params: dict[str, Any]) -> dict[str, Any]:
    link = owned(conn, params)
    last_seen = await link.session.call(Heartbeat(link.client_id), timeout_s=ASK_TIMEOUT_S)
    return {"sessionId": link.session_id, "lastSeenAt": last_seen, "clientId": link.client_id}


async def update_metadata(
    front: Connections, conn: Connection, params: dict[str, Any]
) -> dict[str, Any]:
    link = owned(conn, params)
    name = params.get("displayName")
    if not isinstance(name, str) or not name.strip() or len(name) > 256:
        raise params_error(
            "`displayName` must be a non-empty string of at most 256 characters",
            code="invalid_metadata",
        )
    done: MetadataSet = await link.session.call(
        UpdateMetadata(name.strip(), link.client_id), timeout_s=ASK_TIMEOUT_S
    )
    return {"sessionId": done.session_id, "displayName": done.display_name}


# ---- reads --------------------------------------------------------------------------------


async def context(front: Connections, conn: Connection, params: dict[str, Any]) -> dict[str, Any]:
    link = owned(conn, params)
    return {
        "v": 1,
        "sessionId": link.session_id,
        "workspaceCwd": link.workspace,
        "state": context_state(link.session),
    }


async def supported_commands_of(
    front: Connections, conn: Connection, params: dict[str, Any]
) -> dict[str, Any]:
    link = owned(conn, params)
    return {
        "v": 1,
        "sessionId": link.session_id,
        "availableCommands": supported_commands(link.session),
    }


async def status(front: Connections, conn: Connection, params: dict[str, Any]) -> dict[str, Any]:
    detail = params.get("detail", "summary")
    if detail not in ("summary", "full"):
        raise params_error("`detail` must be one of: summary, full")
    if front.daemon_status is None:
        raise RpcError(METHOD_NOT_FOUND, "_qwen/status is not offered by this front")
    return front.daemon_status(detail)


async def health(front: Connections, conn: Connection, params: dict[str, Any]) -> dict[str, str]:
    return {"status": "ok"}
