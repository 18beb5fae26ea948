"""The dispatch: the method table, and one message from receipt to its reply.

:func:`submit` takes one parsed message of a connection (the transports call it through
:meth:`serve.acpfront.AcpFront.submit`): a request or notification becomes a task under
the connection's :data:`~serve.acpfront.connections.MAX_INFLIGHT` bound (:func:`handle`),
a response is a vote (:func:`serve.acpfront.vote_methods.answer`), ``$/cancel_request``
cancels a running request, anything invalid is answered at once.

:func:`handle` checks what no handler should (``initialize`` again, an unknown method, a
``sessionId`` that is no string or contradicts the ``Acp-Session-Id`` header), runs the
transport's policy (strict gate, rate limit), then the handler of :data:`METHODS`. Its
result, or the error anything under it raised (rendered once, :func:`serve.acpfront.errors.
to_rpc`), is queued where :mod:`.routing` says (or answered in the request's POST, for
the qwen SDK: :class:`~serve.acpfront.routing.Inline`); a reply to one of
:data:`~serve.acpfront.routing.SESSION_REPLIES` waits (bounded) until the pump has queued
the events its request caused, so it follows them on the stream. A request cancelled by
``$/cancel_request`` is answered -32800.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import trio

from acp import telemetry
from serve import tracecontext
from serve.acpfront import access as acp_access
from serve.acpfront import (
    file_methods,
    fork,
    jsonrpc,
    session_methods,
    v121,
    vote_methods,
    workspace_methods,
)
from serve.acpfront.connections import MAX_INFLIGHT, Connection, Connections
from serve.acpfront.errors import ConnectionLevel, to_rpc
from serve.acpfront.jsonrpc import (
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    SERVER_ERROR,
    Notification,
    Request,
    Response,
    RpcError,
)
from serve.acpfront.links import Replied, caught_up_now
from serve.acpfront.routing import SESSION_REPLIES, Inline, reply, reply_conn

__all__ = ["METHODS", "Handler", "handle", "submit"]

log = logging.getLogger(__name__)

#: A method's handler: ``(front, connection, params) -> result`` (a JSON value, a
#: msgspec Struct or Raw, or a :class:`~serve.acpfront.links.Replied`).
Handler = Callable[[Connections, Connection, dict[str, Any]], Awaitable[object]]

METHODS: Final[Mapping[str, Handler]] = {
    "session/new": session_methods.session_new,
    "session/load": session_methods.session_load,
    "session/resume": session_methods.session_resume,
    "session/fork": fork.session_fork,
    "session/list": session_methods.session_list,
    "session/close": session_methods.session_close,
    "session/prompt": session_methods.session_prompt,
    "session/cancel": session_methods.session_cancel,
    "_session/steering": session_methods.session_steering,
    "session/set_mode": session_methods.session_set_mode,
    "session/set_model": session_methods.session_set_model,
    "session/set_config_option": v121.set_config_option,  # every option (ACP 1.21)
    "session/delete": v121.session_delete,
    "authenticate": v121.authenticate,
    "logout": v121.logout,
    "session/permission": vote_methods.session_permission,
    "_qwen/health": session_methods.health,
    "_qwen/session/heartbeat": session_methods.heartbeat,
    "_qwen/session/update_metadata": session_methods.update_metadata,
    "_qwen/session/detach": session_methods.detach,
    "_qwen/session/context": session_methods.context,
    "_qwen/session/supported_commands": session_methods.supported_commands_of,
    "_qwen/status": session_methods.status,
    "_qwen/file/read": file_methods.file_read,
    "_qwen/file/read_bytes": file_methods.file_read_bytes,
    "_qwen/file/stat": file_methods.file_stat,
    "_qwen/file/list": file_methods.file_list,
    "_qwen/file/glob": file_methods.file_glob,
    "_qwen/file/write": file_methods.file_write,
    "_qwen/file/edit": file_methods.file_edit,
    **workspace_methods.HANDLERS,  # the _qwen/workspace/* reads
}


def submit(
    front: Connections,
    conn: Connection,
    message: jsonrpc.Message,
    header_session: str | None,
    inline: Inline | None = None,
) -> None:
    """Handle one message in the background; its reply lands in an outbox (or ``inline``,
    which is then done in every case)."""
    conn.touch()
    match message:
        case Notification(method=v121.CANCEL_REQUEST):
            v121.cancel_request(conn, message.params)
        case Request() | Notification():
            if conn.inflight >= MAX_INFLIGHT:
                if isinstance(message, Request):
                    reply_conn(
                        front,
                        conn,
                        jsonrpc.error_bytes(
                            message.id,
                            RpcError(
                                SERVER_ERROR,
                                f"Too many requests in flight ({MAX_INFLIGHT})",
                                {"httpStatus": 429, "code": "too_many_inflight"},
                            ),
                        ),
                        inline,
                    )
                if inline is not None:
                    inline.done.set()
                return
            conn.inflight += 1
            front.spawn(handle, front, conn, message, header_session, inline)
        case Response():
            front.spawn(vote_methods.answer, front, conn, message)
        case jsonrpc.Invalid(id=rid, error=error):
            reply_conn(front, conn, jsonrpc.error_bytes(rid, error))
        case jsonrpc.Batch():
            reply_conn(
                front,
                conn,
                jsonrpc.error_bytes(
                    None, RpcError(jsonrpc.INVALID_REQUEST, "Batches are not supported")
                ),
            )


def _check(
    front: Connections,
    conn: Connection,
    message: Request | Notification,
    header_session: str | None,
) -> Handler | None:
    """The request's handler once the checks common to every method pass (None: an
    unknown notification, ignored)."""
    method, params = message.method, message.params
    sid = params.get("sessionId")
    if method == "initialize":
        raise ConnectionLevel(jsonrpc.INVALID_REQUEST, "The connection is already initialized")
    handler = METHODS.get(method)
    if handler is None:
        if isinstance(message, Notification):
            return None  # unknown notifications are ignored
        raise ConnectionLevel(METHOD_NOT_FOUND, f"Method not found: {method}")
    if sid is not None and not isinstance(sid, str):
        raise ConnectionLevel(INVALID_PARAMS, "`sessionId` must be a string")
    if header_session is not None and sid is not None and header_session != sid:
        raise ConnectionLevel(
            INVALID_PARAMS,
            "The Acp-Session-Id header does not match params.sessionId",
            {"httpStatus": 400, "code": "session_mismatch"},
        )
    if front.policy is not None:
        refusal = front.policy(conn, method, params)
        if refusal is not None:
            raise refusal
    return handler


async def handle(
    front: Connections,
    conn: Connection,
    message: Request | Notification,
    header_session: str | None,
    inline: Inline | None = None,
) -> None:
    """Run one request or notification (see the module docstring); its reply goes to
    ``inline`` when given."""
    rid = message.id if isinstance(message, Request) else None
    method = message.method
    params = message.params
    raw_sid = params.get("sessionId")
    sid = raw_sid if isinstance(raw_sid, str) else None
    scope = trio.CancelScope()
    conn.tasks.add(scope)
    if rid is not None and rid not in conn.running:
        conn.running[rid] = scope
    trace = tracecontext.from_meta(params)
    ran = False  # the handler ran (its outcome is audited; the checks audit their own)
    audited = False  # its outcome was (a request cancelled mid-way is audited as such)
    meta = params.get("_meta")
    parent = meta.get("traceparent") if isinstance(meta, dict) else None
    span = telemetry.span(
        f"acp {method}",
        parent=parent if isinstance(parent, str) else None,
        kind="server",
        attributes={"rpc.system": "jsonrpc", "rpc.method": method},
    )
    try:
        with span, tracecontext.traced(trace), scope:
            if trace is not None:
                log.info("ACP %s %s (traced)", conn.id, method)
            try:
                handler = _check(front, conn, message, header_session)
                if handler is None:
                    return
                ran = True
                result = await handler(front, conn, params)
                audited = True
                made = result.get("sessionId") if isinstance(result, dict) else None
                acp_access.audit_outcome(
                    front.host, conn, method, sid or (made if isinstance(made, str) else None), None
                )
            except ConnectionLevel as exc:
                if ran:
                    audited = True
                    acp_access.audit_outcome(front.host, conn, method, sid, exc)
                if rid is not None:
                    reply_conn(front, conn, jsonrpc.error_bytes(rid, exc), inline)
                return
            except Exception as exc:
                if rid is not None or ran:
                    error = to_rpc(exc, sid)  # the one place a failure becomes a reply
                    if ran:
                        audited = True
                        acp_access.audit_outcome(front.host, conn, method, sid, error)
                if rid is not None:
                    await _after_events(conn, method, sid)
                    reply(front, conn, method, sid, jsonrpc.error_bytes(rid, error), inline)
                return
            if rid is None:
                return
            if isinstance(result, Replied):
                await result.deliver(rid, inline)
                return
            # A reply follows the events its request caused (model_switched,
            # approval_mode_changed, the turn's updates) on the stream.
            await _after_events(conn, method, sid)
            reply(front, conn, method, sid, jsonrpc.result_bytes(rid, result), inline)
    finally:
        if ran and not audited:  # cancelled ($/cancel_request, the connection closed)
            acp_access.audit_cancelled(front.host, conn, method, sid)
        conn.tasks.discard(scope)
        if rid is not None and conn.running.get(rid) is scope:
            del conn.running[rid]
            if rid in conn.cancelled and scope.cancelled_caught and not conn.closed:
                reply(
                    front,
                    conn,
                    method,
                    sid,
                    jsonrpc.error_bytes(rid, v121.cancelled_error(method)),
                    inline,
                )
        if rid is not None:
            conn.cancelled.discard(rid)
        if inline is not None:
            inline.done.set()  # no reply (the connection closed): the POST ends anyway
        conn.inflight -= 1
        conn.touch()


async def _after_events(conn: Connection, method: str, sid: str | None) -> None:
    link = conn.sessions.get(sid) if sid is not None else None
    if link is not None and method in SESSION_REPLIES:
        await caught_up_now(link)
