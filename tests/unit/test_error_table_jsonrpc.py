"""The JSON-RPC renderer of the one error table (serve/errors/jsonrpc.py), walked.

``/acp`` answers a domain error with the REST body as ``data`` (``httpStatus`` first) and
a JSON-RPC code that follows the status; the bytes are the ones the front always sent.
"""

from __future__ import annotations

import msgspec

from actors import ActorStopped
from serve.acpfront import jsonrpc
from serve.acpfront.errors import to_rpc
from serve.errors import WireError, jsonrpc_file, rpc_error
from serve.errors.jsonrpc import jsonrpc as render
from serve.events import SubscriberLimitExceeded
from serve.sessions.errors import NotSupportedByAgent, SessionLimitError, SessionRequestError
from serve.sessions.messages import SessionGone
from serve.sessions.prompt_queue import PromptQueueFull
from serve.workspaces.files.errors import make_error


def _bytes(exc: BaseException, sid: str | None = None) -> bytes:
    return jsonrpc.error_bytes(1, to_rpc(exc, sid))


def test_the_code_follows_the_status() -> None:
    codes = {
        status: render(WireError(status, None, {"error": "x"})).code
        for status in (400, 401, 403, 404, 409, 429, 500, 501, 503, 504)
    }
    assert codes == {
        400: -32602,
        401: -32000,
        403: -32000,
        404: -32002,
        409: -32000,
        429: -32000,
        500: -32603,
        501: -32601,
        503: -32603,
        504: -32603,
    }


def test_session_errors_render_the_rest_body_as_data() -> None:
    assert _bytes(SessionRequestError("bad mode", "invalid_approval_mode", allowed=["a"])) == (
        b'{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"bad mode","data":'
        b'{"httpStatus":400,"error":"bad mode","code":"invalid_approval_mode","allowed":["a"]}}}'
    )
    assert _bytes(NotSupportedByAgent("no load", "not_supported_by_agent")) == (
        b'{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"no load","data":'
        b'{"httpStatus":501,"error":"no load","code":"not_supported_by_agent"}}}'
    )
    assert _bytes(SessionLimitError("full", "session_limit_exceeded", limit=2)) == (
        b'{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"full","data":'
        b'{"httpStatus":503,"error":"full","code":"session_limit_exceeded","limit":2}}}'
    )


def test_the_acp_session_family() -> None:
    gone = (
        b'{"jsonrpc":"2.0","id":1,"error":{"code":-32002,"message":"No session with id \\"s\\"",'
        b'"data":{"httpStatus":404,"code":"session_not_found","sessionId":"s"}}}'
    )
    assert _bytes(SessionGone("s"), "s") == gone
    assert _bytes(ActorStopped("session"), "s") == gone
    assert _bytes(PromptQueueFull(4, 4)) == (
        b'{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"Prompt queue is full (4)",'
        b'"data":{"httpStatus":503,"code":"prompt_queue_full","limit":4}}}'
    )
    assert msgspec.json.decode(_bytes(SubscriberLimitExceeded(64)))["error"] == {
        "code": -32000,
        "message": "EventBus subscriber limit reached (64)",
        "data": {"httpStatus": 429, "code": "subscriber_limit_exceeded", "limit": 64},
    }


def test_unexpected_errors_are_a_logged_500() -> None:
    assert rpc_error(ValueError("boom")) is None
    assert msgspec.json.decode(_bytes(ValueError("boom")))["error"] == {
        "code": -32603,
        "message": "Internal error",
        "data": {"httpStatus": 500},
    }


def test_file_method_errors_answer_server_error_above_404() -> None:
    io = jsonrpc_file(make_error("io_error", "disk"))
    assert (io.code, io.data["httpStatus"]) == (-32000, 503)
    missing = jsonrpc_file(make_error("path_not_found", "nope"))
    assert (missing.code, missing.message) == (-32002, "nope")
    assert missing.data == {
        "httpStatus": 404,
        "errorKind": "path_not_found",
        "error": "nope",
        "status": 404,
    }
