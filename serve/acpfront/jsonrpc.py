"""JSON-RPC 2.0 validation and encoding for the ACP front (no I/O, no HTTP).

:func:`parse` turns one received message (bytes) into a :class:`Request`, a
:class:`Notification`, a :class:`Response` (the remote client answering a request we sent
it), or a :class:`Invalid` carrying the error reply to send (``id`` null when the id itself
could not be read). A JSON array is a :class:`Batch` (ACP does not use batches). Nothing a
client sends can raise out of here.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

# The codes a domain error renders to are the error table's (serve/errors/jsonrpc.py).
from serve.errors.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    RESOURCE_NOT_FOUND,
    SERVER_ERROR,
    RpcWire,
)

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "RESOURCE_NOT_FOUND",
    "SERVER_ERROR",
    "Batch",
    "ErrorObject",
    "ErrorReply",
    "Id",
    "Invalid",
    "Message",
    "Notification",
    "Request",
    "Response",
    "RpcError",
    "encode",
    "error_bytes",
    "notification_bytes",
    "parse",
    "parse_obj",
    "request_bytes",
    "result_bytes",
]

PARSE_ERROR = -32700
INVALID_REQUEST = -32600

Id = str | int

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


class RpcError(Exception):
    """An error reply: JSON-RPC ``code``, ``message`` and optional ``data``."""

    def __init__(self, code: int, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    @classmethod
    def of(cls, wire: RpcWire) -> RpcError:
        """The error table's JSON-RPC rendering (:func:`serve.errors.rpc_error`) as a reply."""
        return cls(wire.code, wire.message, wire.data)


class ErrorObject(msgspec.Struct, frozen=True, omit_defaults=True):
    """The ``error`` member of an error reply: ``{code, message, data?}``."""

    code: int
    message: str
    data: dict[str, Any] | None = None


class ErrorReply(msgspec.Struct, frozen=True):
    """An error reply as sent (also the body of an ``/acp`` HTTP error answer):
    ``{"jsonrpc":"2.0","id":<id or null>,"error":{...}}``. The OpenAPI document describes
    ``/acp`` errors with this type."""

    jsonrpc: Literal["2.0"]
    id: Id | None
    error: ErrorObject


class Request(msgspec.Struct, frozen=True):
    id: Id
    method: str
    params: dict[str, Any]


class Notification(msgspec.Struct, frozen=True):
    method: str
    params: dict[str, Any]


class Response(msgspec.Struct, frozen=True):
    id: Id
    result: object = None
    error: object = None


class Invalid(msgspec.Struct, frozen=True):
    id: Id | None
    error: RpcError


class Batch(msgspec.Struct, frozen=True):
    size: int


Message = Request | Notification | Response | Invalid | Batch


def _valid_id(value: object) -> bool:
    return (isinstance(value, str) and len(value) <= 256) or (
        isinstance(value, int) and not isinstance(value, bool) and -(2**53) < value < 2**53
    )


def parse(raw: bytes) -> Message:
    try:
        obj = _decoder.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return Invalid(None, RpcError(PARSE_ERROR, "Parse error: the body is not valid JSON"))
    except RecursionError:  # msgspec's depth guard: thousands of nested arrays/objects
        return Invalid(None, RpcError(PARSE_ERROR, "Parse error: the body nests JSON too deeply"))
    return parse_obj(obj)


def parse_obj(obj: object) -> Message:
    if isinstance(obj, list):
        return Batch(len(obj))
    if not isinstance(obj, dict):
        return Invalid(None, RpcError(INVALID_REQUEST, "Invalid Request: expected an object"))
    raw_id = obj.get("id")
    has_id = "id" in obj and raw_id is not None
    rid: Id | None = raw_id if has_id and _valid_id(raw_id) else None
    if obj.get("jsonrpc") != "2.0":
        return Invalid(rid, RpcError(INVALID_REQUEST, 'Invalid Request: "jsonrpc" must be "2.0"'))
    if has_id and rid is None:
        return Invalid(
            None,
            RpcError(INVALID_REQUEST, 'Invalid Request: "id" must be a string or an integer'),
        )
    method = obj.get("method")
    if method is None and "method" not in obj:
        if rid is None:
            return Invalid(None, RpcError(INVALID_REQUEST, "Invalid Request: no method and no id"))
        has_result = "result" in obj
        has_error = "error" in obj
        if has_result == has_error:
            return Invalid(
                rid,
                RpcError(
                    INVALID_REQUEST,
                    "Invalid Request: a response has exactly one of result and error",
                ),
            )
        return Response(rid, obj.get("result"), obj.get("error"))
    if not isinstance(method, str) or not method or len(method) > 256:
        return Invalid(
            rid, RpcError(INVALID_REQUEST, 'Invalid Request: "method" must be a non-empty string')
        )
    params = obj.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        return Invalid(rid, RpcError(INVALID_PARAMS, 'Invalid params: "params" must be an object'))
    if rid is None:
        return Notification(method, params)
    return Request(rid, method, params)


def encode(obj: object) -> bytes:
    return _encoder.encode(obj)


def result_bytes(rid: Id, result: object) -> bytes:
    if isinstance(result, msgspec.Raw):
        return (
            b'{"jsonrpc":"2.0","id":' + _encoder.encode(rid) + b',"result":' + bytes(result) + b"}"
        )
    return _encoder.encode({"jsonrpc": "2.0", "id": rid, "result": result})


def error_bytes(rid: Id | None, error: RpcError) -> bytes:
    return _encoder.encode(
        ErrorReply("2.0", rid, ErrorObject(error.code, error.message, error.data))
    )


def request_bytes(rid: Id, method: str, params: object) -> bytes:
    return _encoder.encode({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})


def notification_bytes(method: str, params: object) -> bytes:
    return _encoder.encode({"jsonrpc": "2.0", "method": method, "params": params})
