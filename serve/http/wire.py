"""JSON in and out of the HTTP front: one encoder, precise decode errors.

Request bodies are decoded with msgspec from the raw bytes (never ``request.get_json``),
so malformed JSON becomes ``400 {"error":"Invalid JSON in request body"}``. Keys ``__proto__``,
``constructor`` and ``prototype`` are dropped from untyped bodies (the reference strips
them; they mean nothing to us, and dropping them keeps forwarded bodies clean).
"""

from __future__ import annotations

from typing import Any

import msgspec
from quart import Response, request

from serve.http.errors import ApiError, invalid_json

_encoder = msgspec.json.Encoder()
_untyped = msgspec.json.Decoder()
_HOSTILE_KEYS = frozenset({"__proto__", "constructor", "prototype"})

JSON_TYPE = "application/json; charset=utf-8"


def encode(obj: Any) -> bytes:
    return _encoder.encode(obj)


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(_encoder.encode(obj), status=status, headers=headers, content_type=JSON_TYPE)


def raw_json_response(body: bytes, status: int = 200) -> Response:
    return Response(body, status=status, content_type=JSON_TYPE)


def _strip_hostile(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_hostile(v) for k, v in value.items() if k not in _HOSTILE_KEYS}
    if isinstance(value, list):
        return [_strip_hostile(v) for v in value]
    return value


async def body_bytes() -> bytes:
    data = await request.get_data(cache=True, as_text=False)
    assert isinstance(data, bytes)
    return data


async def json_body(*, allow_empty: bool = True) -> dict[str, Any]:
    """The request body as a JSON object (``{}`` when empty and allowed)."""
    data = await body_bytes()
    if not data.strip():
        if allow_empty:
            return {}
        raise invalid_json()
    try:
        value = _untyped.decode(data)
    except msgspec.DecodeError:
        raise invalid_json() from None
    if not isinstance(value, dict):
        raise ApiError(400, {"error": "Request body must be a JSON object"})
    return _strip_hostile(value)  # type: ignore[no-any-return]
