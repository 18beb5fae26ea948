"""Votes: ``session/permission`` and a client's answers to the requests we forwarded.

The front forwards only ``session/request_permission`` and ``elicitation/create`` (to
clients that advertised the mode: :mod:`.elicit`) from a session's log to a remote
client; the pump remembers each as a server request (JSON-RPC id → session and request
id, :data:`~serve.acpfront.connections.MAX_SERVER_REQUESTS` per connection). The client's
JSON-RPC response (:func:`answer`) and an explicit ``session/permission`` (the qwen SDK's
daemon dialect) are votes to the PermissionMediator (``CastVote``, ``CastElicitation``)
under the daemon's mediation policy; a refused ``session/permission`` answers the
mediator's REST body as ``data``.
"""

from __future__ import annotations

import logging
from typing import Any

from serve.acpfront import access as acp_access
from serve.acpfront import elicit
from serve.acpfront.connections import ASK_TIMEOUT_S, Connection, Connections, SessionLink
from serve.acpfront.errors import params_error
from serve.acpfront.jsonrpc import (
    INVALID_PARAMS,
    RESOURCE_NOT_FOUND,
    SERVER_ERROR,
    Response,
    RpcError,
)
from serve.acpfront.links import owned
from serve.acpfront.translate import PERMISSION_ID_PREFIX
from serve.errors.votes import vote_wire
from serve.permissions.mediator import CastVote

__all__ = ["PERMISSION_METHOD", "answer", "session_permission"]

log = logging.getLogger(__name__)

#: The forwarded request a client's JSON-RPC response answers (the audit line's method).
PERMISSION_METHOD = "session/request_permission"


async def session_permission(
    front: Connections, conn: Connection, params: dict[str, Any]
) -> dict[str, Any]:
    request_id = params.get("requestId")
    if not isinstance(request_id, str) or not request_id:
        raise params_error("`requestId` must be a non-empty string")
    sid = params.get("sessionId")
    link: SessionLink | None = owned(conn, params) if sid is not None else None
    if link is None:
        for s, r in conn.server_requests.values():
            if r == request_id:
                link = conn.sessions.get(s)
                break
    if sid is None and not await acp_access.check_vote(front.host, conn, request_id):
        raise RpcError(  # as for an unknown request: nothing is disclosed
            RESOURCE_NOT_FOUND,
            "No pending permission request",
            {"httpStatus": 404, "error": "No pending permission request", "requestId": request_id},
        )
    body = {k: v for k, v in params.items() if k not in ("sessionId", "requestId")}
    counted = await front.host.mediator.ask(
        CastVote(
            request_id,
            sid if isinstance(sid, str) else None,
            body,
            link.client_id if link is not None else None,
            conn.loopback,
        ),
        timeout_s=ASK_TIMEOUT_S,
    )
    status, out = vote_wire(counted, legacy=not isinstance(sid, str))
    if status != 200:
        raise RpcError(
            INVALID_PARAMS
            if status == 400
            else RESOURCE_NOT_FOUND
            if status == 404
            else SERVER_ERROR,
            str(out.get("error", "vote refused")),
            {"httpStatus": status, **out},
        )
    conn.server_requests.pop(PERMISSION_ID_PREFIX + request_id, None)
    result: dict[str, Any] = out
    return result


async def answer(front: Connections, conn: Connection, message: Response) -> None:
    """The client answered a request we sent it: a permission or elicitation vote."""
    rid = message.id
    if not isinstance(rid, str):
        return
    target = conn.server_requests.pop(rid, None)
    if target is None:
        if rid.startswith(PERMISSION_ID_PREFIX):
            log.info("ACP connection %s answered unknown request %s", conn.id, rid)
        return
    sid, request_id = target
    method = "elicitation/create" if rid.startswith(elicit.ID_PREFIX) else PERMISSION_METHOD
    link = conn.sessions.get(sid)
    if link is not None and not acp_access.may_vote(front.host, conn, link.session):
        log.info("ACP connection %s may not vote on %s (an observer)", conn.id, sid)
        acp_access.audit(front.host, conn, method, sid, 403)
        return
    client_id = link.client_id if link is not None else None
    result = message.result if message.error is None else None
    if rid.startswith(elicit.ID_PREFIX):
        status = await elicit.answer(
            front.host.mediator,
            sid,
            request_id,
            result,
            client_id,
            conn.loopback,
            timeout_s=ASK_TIMEOUT_S,
        )
        _audit_answer(front, conn, method, sid, status)
        return
    body = result if isinstance(result, dict) and "outcome" in result else None
    try:
        counted = await front.host.mediator.ask(
            CastVote(
                request_id,
                sid,
                body if body is not None else {"outcome": {"outcome": "cancelled"}},
                client_id,
                conn.loopback,
            ),
            timeout_s=ASK_TIMEOUT_S,
        )
        status = vote_wire(counted)[0]
    except Exception as exc:
        log.info("ACP permission answer not counted: %r", exc)
        status = 500
    _audit_answer(front, conn, method, sid, status)


def _audit_answer(front: Connections, conn: Connection, method: str, sid: str, status: int) -> None:
    """The one audit line of a vote sent as a JSON-RPC response (its ``method`` is the
    request it answers: a vote is a mutation whatever carries it)."""
    outcome = "ok" if status < 400 else "denied" if status in (401, 403, 404) else "error"
    acp_access.audit(front.host, conn, method, sid, status, outcome)
