"""The JSON-RPC rendering of the one table, for the ``/acp`` front (beside :func:`rest`).

A failure under an ``/acp`` handler propagates to the front's dispatch, which asks
:func:`rpc_error` once for its ``(code, message, data)``: ``data`` is the REST body with
``httpStatus`` (the status REST answers) first, so a client of either front reads the same
fields. The JSON-RPC ``code`` follows the status (:func:`jsonrpc`): 400 → invalid params,
404 → resource not found, 501 → method not found, any other 4xx → server error, 5xx →
internal error. Two renderings differ on purpose and are named here: a
``_qwen/file/*`` call answers every status but 400/404 as a server error
(:func:`jsonrpc_file`), and the session family has ``/acp`` bodies of its own (a session
that is gone or whose actor stopped, a full prompt queue, a log with all its subscribers).

No transport: the JSON-RPC codes are numbers here; ``serve.acpfront.jsonrpc`` builds its
``RpcError`` from an :class:`RpcWire`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from actors import ActorError
from serve.errors.table import WireError, fs_error, wire_error
from serve.events.log import SubscriberLimitExceeded
from serve.sessions.messages import SessionGone
from serve.sessions.prompt_queue import PromptQueueFull
from serve.workspaces.files.errors import WorkspaceFsError

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "METHOD_NOT_FOUND",
    "RESOURCE_NOT_FOUND",
    "SERVER_ERROR",
    "RpcWire",
    "jsonrpc",
    "jsonrpc_file",
    "rpc_error",
    "session_not_found",
]

METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
SERVER_ERROR: Final = -32000
RESOURCE_NOT_FOUND: Final = -32002

_BY_STATUS: Final = {400: INVALID_PARAMS, 404: RESOURCE_NOT_FOUND, 501: METHOD_NOT_FOUND}


@dataclass(frozen=True)
class RpcWire:
    """A JSON-RPC error before encoding: ``code``, ``message``, ``data`` (fresh dict)."""

    code: int
    message: str
    data: dict[str, Any]


def jsonrpc(wire: WireError) -> RpcWire:
    """The JSON-RPC rendering of a neutral wire error."""
    status = wire.status
    code = _BY_STATUS.get(status, SERVER_ERROR if status < 500 else INTERNAL_ERROR)
    body = wire.body
    return RpcWire(code, str(body.get("error", "error")), {"httpStatus": status, **body})


def jsonrpc_file(err: WorkspaceFsError) -> RpcWire:
    """A ``_qwen/file/*`` failure: the file routes' envelope (spec §4.5) as ``data``."""
    wire = fs_error(err)
    status = wire.status
    code = (
        INVALID_PARAMS if status == 400 else RESOURCE_NOT_FOUND if status == 404 else SERVER_ERROR
    )
    return RpcWire(code, err.message, {"httpStatus": status, **wire.body})


def session_not_found(session_id: str) -> RpcWire:
    return RpcWire(
        RESOURCE_NOT_FOUND,
        f'No session with id "{session_id}"',
        {"httpStatus": 404, "code": "session_not_found", "sessionId": session_id},
    )


def rpc_error(exc: BaseException, session_id: str | None = None) -> RpcWire | None:
    """The ``/acp`` answer to a domain or actor failure under a request about
    ``session_id``, or ``None`` when it is unexpected (the front answers a logged 500)."""
    if isinstance(exc, SessionGone | ActorError):
        return session_not_found(session_id or "")
    if isinstance(exc, PromptQueueFull):
        return RpcWire(
            SERVER_ERROR,
            f"Prompt queue is full ({exc.limit})",
            {"httpStatus": 503, "code": "prompt_queue_full", "limit": exc.limit},
        )
    if isinstance(exc, SubscriberLimitExceeded):
        return RpcWire(
            SERVER_ERROR,
            str(exc),
            {"httpStatus": 429, "code": "subscriber_limit_exceeded", "limit": exc.limit},
        )
    wire = wire_error(exc)
    return None if wire is None else jsonrpc(wire)
