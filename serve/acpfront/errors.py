"""The ``/acp`` front's own refusals, and the one place an exception becomes a reply.

The front refuses some requests itself (bad params, a session this connection does not
own, its own bounds, a draining daemon): those are :class:`~serve.acpfront.jsonrpc.RpcError`
values built here. Everything else a handler raises (a domain error, an actor that stopped)
propagates to :func:`serve.acpfront.dispatch.handle`, which asks :func:`to_rpc` once: the
error table (:func:`serve.errors.rpc_error`, rendered for JSON-RPC beside REST) gives the
code, message and data; an unexpected exception is logged and answered as a 500.

:class:`ConnectionLevel` marks an error answered on the connection stream whatever the
method (ownership, a header contradicting the params, an unknown method).
"""

from __future__ import annotations

import logging

from serve.acpfront.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS, SERVER_ERROR, RpcError
from serve.errors import rpc_error
from serve.errors.jsonrpc import session_not_found

__all__ = [
    "ConnectionLevel",
    "draining",
    "not_found",
    "not_owned",
    "not_running",
    "params_error",
    "session_limit",
    "to_rpc",
    "unserved",
]

log = logging.getLogger(__name__)


class ConnectionLevel(RpcError):
    """An error answered on the connection stream whatever the method (ownership,
    a header contradicting the params, an unknown method)."""


def params_error(message: str, **data: object) -> RpcError:
    return RpcError(INVALID_PARAMS, message, {"httpStatus": 400, **data} if data else None)


def not_found(session_id: str) -> RpcError:
    return RpcError.of(session_not_found(session_id))


def unserved(workspace: str) -> RpcError:
    """A ``cwd`` naming no workspace of this daemon (or one the caller may not use)."""
    return params_error(
        f"Requested workspace {workspace} is not served by this daemon",
        code="workspace_mismatch",
        requestedWorkspace=workspace,
    )


def not_owned(session_id: str) -> ConnectionLevel:
    """A session the connection did not load or resume (nor make)."""
    return ConnectionLevel(
        INVALID_PARAMS,
        f'Session "{session_id}" is not owned by this connection '
        "(session/load or session/resume it first)",
        {"httpStatus": 403, "code": "session_not_owned", "sessionId": session_id},
    )


def session_limit(limit: int) -> RpcError:
    return RpcError(
        SERVER_ERROR,
        f"A connection may own at most {limit} sessions",
        {"httpStatus": 503, "code": "connection_session_limit", "limit": limit},
    )


def draining() -> RpcError:
    return RpcError(
        SERVER_ERROR, "Daemon is draining", {"httpStatus": 503, "code": "daemon_draining"}
    )


def not_running() -> RpcError:
    return RpcError(SERVER_ERROR, "ACP front is not running", {"httpStatus": 503})


def to_rpc(exc: BaseException, session_id: str | None = None) -> RpcError:
    """The reply to a failure under a request about ``session_id`` (see the module doc)."""
    if isinstance(exc, RpcError):
        return exc
    wire = rpc_error(exc, session_id)
    if wire is not None:
        return RpcError.of(wire)
    log.exception("ACP request failed", exc_info=exc)
    return RpcError(INTERNAL_ERROR, "Internal error", {"httpStatus": 500})
