"""JSON in and out of the HTTP front: one encoder, precise decode errors.

Request bodies are decoded with msgspec from the raw bytes (never ``request.get_json``),
so malformed JSON becomes ``400 {"error":"Invalid JSON in request body"}``. Keys ``__proto__``,
``constructor`` and ``prototype`` are dropped from untyped bodies (the reference strips
them; they mean nothing to us, and dropping them keeps forwarded bodies clean).

Nesting is bounded: a body nesting arrays/objects deeper than :data:`MAX_JSON_DEPTH` levels
is ``400 {"error":"Request body nests JSON deeper than 64 levels"}``, whether msgspec's own
recursion guard trips (``RecursionError``, thousands of levels) or the walk that strips the
hostile keys finds it (the walk is iterative, so it cannot overflow the stack itself).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
from quart import Response, make_response, request

from serve.http.errors import ApiError, invalid_json

_encoder = msgspec.json.Encoder()
_untyped = msgspec.json.Decoder()
_HOSTILE_KEYS = frozenset({"__proto__", "constructor", "prototype"})
#: Deepest nesting of arrays/objects accepted in a request body (levels).
MAX_JSON_DEPTH = 64

JSON_TYPE = "application/json; charset=utf-8"


def encode(obj: object) -> bytes:
    return _encoder.encode(obj)


def json_response(
    obj: object, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return Response(_encoder.encode(obj), status=status, headers=headers, content_type=JSON_TYPE)


def raw_json_response(body: bytes, status: int = 200) -> Response:
    return Response(body, status=status, content_type=JSON_TYPE)


async def stream_response(body: AsyncIterator[bytes], headers: dict[str, str]) -> Response:
    """A 200 that streams ``body`` (an event stream) with no response timeout: it lasts as
    long as its client reads it."""
    response = await make_response(body, 200, headers)
    # quart types make_response as a Quart or a werkzeug Response; it makes the app's own.
    assert isinstance(response, Response)
    response.timeout = None
    return response


def too_deep() -> ApiError:
    return ApiError(400, {"error": f"Request body nests JSON deeper than {MAX_JSON_DEPTH} levels"})


def _strip_hostile(value: dict[str, Any]) -> dict[str, Any]:
    """Drop the hostile keys everywhere, in place; :func:`too_deep` past the depth bound."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise too_deep()
        if isinstance(node, dict):
            for key in _HOSTILE_KEYS.intersection(node):
                del node[key]
            stack.extend((v, depth + 1) for v in node.values() if isinstance(v, dict | list))
        elif isinstance(node, list):  # (only objects and arrays are stacked)
            stack.extend((v, depth + 1) for v in node if isinstance(v, dict | list))
    return value


async def body_bytes() -> bytes:
    data = await request.get_data(cache=True, as_text=False)
    assert isinstance(data, bytes)
    return data


async def json_body(*, allow_empty: bool = True) -> dict[str, Any]:
    """The request body as a JSON object (``{}`` when empty and allowed)."""
    data = await body_bytes()
    if not data:  # no body at all; blanks alone are not JSON (400, as Express's parser)
        if allow_empty:
            return {}
        raise invalid_json()
    try:
        value = _untyped.decode(data)
    except msgspec.DecodeError:
        raise invalid_json() from None
    except RecursionError:
        raise too_deep() from None
    if not isinstance(value, dict):
        raise ApiError(400, {"error": "Request body must be a JSON object"})
    return _strip_hostile(value)
