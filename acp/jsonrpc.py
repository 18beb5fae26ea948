"""JSON-RPC 2.0 over newline-delimited JSON: framing, envelopes, encoders (sans-IO).

Theory of operation
-------------------
ACP's stdio transport carries one JSON object per ``\\n``-terminated line. This module is the
pure half of that: no I/O, no trio, table-testable.

* :class:`LineFramer` turns arbitrary byte chunks into complete lines. It never holds more than
  ``max_line_bytes`` of an unfinished line: a longer line is discarded as it streams in and
  reported once, as an :class:`OversizedLine`, when its newline finally arrives. Empty lines and
  a trailing ``\\r`` are ignored.
* :func:`parse_line` decodes one line into an :class:`Envelope` whose ``params`` / ``result`` /
  ``error`` stay ``msgspec.Raw`` (the bytes are forwarded, never re-encoded) and classifies it
  as a request, notification or response; malformed input comes back as :class:`Invalid` with
  the JSON-RPC code to answer with (and the id, when one could be read). A line nesting
  deeper than msgspec's recursion guard is such an :class:`Invalid` too, never an exception.
* ``encode_*`` build outgoing lines (terminated by ``\\n``). :func:`encode_error` is the one
  place where an exception becomes a wire error object.

Ids: we number our own requests with ints; the peer's ids (int, str or null) are echoed back
exactly as received.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Final, overload

import msgspec
from msgspec import UNSET, Raw, UnsetType

from acp.errors import INVALID_REQUEST, PARSE_ERROR, RemoteError

log = logging.getLogger(__name__)

RequestId = int | str | None
EMPTY: Final = Raw(b"")
NULL: Final = Raw(b"null")
DEFAULT_MAX_LINE_BYTES: Final = 50 * 2**20


# --------------------------------------------------------------------------- framing


#: Bytes of an oversized line's start and end kept for its report (:class:`OversizedLine`).
EXCERPT_BYTES: Final = 512


class OversizedLine(msgspec.Struct, frozen=True):
    """A line longer than the cap was dropped; ``size`` is its length in bytes, ``head`` and
    ``tail`` its first and last :data:`EXCERPT_BYTES` (enough to tell whose it was)."""

    size: int
    head: bytes = b""
    tail: bytes = b""


class LineFramer:
    """Split a byte stream into lines of at most ``max_line_bytes`` bytes (without the ``\\n``).

    A line that arrives within one chunk is a slice of it; a line spread over several chunks
    is accumulated in a ``bytearray`` as the chunks arrive (a small copy per chunk, spread
    over the reads) and handed over as that ``bytearray`` itself when its newline arrives:
    a 16 MiB line costs no 16 MiB copy in one go. A handed-over line is never touched again
    (``msgspec.Raw`` views into it stay valid).
    """

    __slots__ = ("_buf", "_discarded", "_discarding", "_head", "_tail", "max_line_bytes")

    def __init__(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        if max_line_bytes <= 0:
            raise ValueError("max_line_bytes must be positive")
        self.max_line_bytes = max_line_bytes
        self._buf = bytearray()
        self._discarding = False
        self._discarded = 0
        self._head = b""  # of the line being discarded
        self._tail = b""

    @property
    def buffered_bytes(self) -> int:
        """Bytes of an unfinished line currently held (always <= ``max_line_bytes``)."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray) -> list[bytes | bytearray | OversizedLine]:
        """Add ``data``; return every line it completes, in order."""
        if isinstance(data, bytearray):
            data = bytes(data)
        out: list[bytes | bytearray | OversizedLine] = []
        limit = self.max_line_bytes
        view = memoryview(data)
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                break
            if self._discarding:
                tail = (self._tail + data[max(start, nl - EXCERPT_BYTES) : nl])[-EXCERPT_BYTES:]
                out.append(OversizedLine(self._discarded + nl - start, self._head, tail))
                self._discarding = False
                self._discarded = 0
                self._head = self._tail = b""
            elif self._buf:
                size = len(self._buf) + nl - start
                if size > limit:
                    end = data[max(start, nl - EXCERPT_BYTES) : nl]
                    tail = (bytes(self._buf[-EXCERPT_BYTES:]) + end)[-EXCERPT_BYTES:]
                    head = bytes(self._buf[:EXCERPT_BYTES])
                    head += data[start : start + EXCERPT_BYTES - len(head)]
                    out.append(OversizedLine(size, head, tail))
                    self._buf = bytearray()
                else:
                    line, self._buf = self._buf, bytearray()
                    line += view[start:nl]
                    if line.endswith(b"\r"):
                        del line[-1]
                    if not line.isspace():
                        out.append(line)
            elif nl - start > limit:
                head, tail = data[start : start + EXCERPT_BYTES], data[nl - EXCERPT_BYTES : nl]
                out.append(OversizedLine(nl - start, head, tail))
            else:
                part = data[start:nl]
                if part.endswith(b"\r"):
                    part = part[:-1]
                if part and not part.isspace():
                    out.append(part)
            start = nl + 1
        if start < len(data):
            self._keep(view[start:])
        return out

    def _keep(self, rest: memoryview) -> None:
        size = len(rest)
        if self._discarding:
            self._discarded += size
            self._tail = (self._tail + bytes(rest[-EXCERPT_BYTES:]))[-EXCERPT_BYTES:]
            return
        if len(self._buf) + size > self.max_line_bytes:
            self._discarding = True
            self._discarded = len(self._buf) + size
            start = bytes(self._buf[:EXCERPT_BYTES])
            self._head = start + bytes(rest[: EXCERPT_BYTES - len(start)])
            end = bytes(self._buf[-EXCERPT_BYTES:]) + bytes(rest[-EXCERPT_BYTES:])
            self._tail = end[-EXCERPT_BYTES:]
            self._buf = bytearray()
        else:
            self._buf += rest


# --------------------------------------------------------------------------- envelopes


class Envelope(msgspec.Struct, frozen=True):
    """One JSON-RPC message with its payload left raw. ``jsonrpc`` is not checked (lenient)."""

    id: int | str | UnsetType | None = UNSET
    method: str | UnsetType = UNSET
    params: Raw = EMPTY
    result: Raw = EMPTY
    error: Raw = EMPTY


class ErrorObject(msgspec.Struct, frozen=True):
    code: int
    message: str = ""
    data: object = None


class Request(msgspec.Struct, frozen=True):
    id: RequestId
    method: str
    params: Raw


class Notification(msgspec.Struct, frozen=True):
    method: str
    params: Raw


class TypedNotification(msgspec.Struct, frozen=True):
    """A notification of a method given to :func:`typed_decoders`, its params decoded as that
    method's Struct (only :func:`parse_line` with ``typed`` returns one)."""

    method: str
    params: msgspec.Struct


class Response(msgspec.Struct, frozen=True):
    """A reply to one of our requests: ``error`` is set, or ``result`` is (possibly ``null``)."""

    id: RequestId
    result: Raw
    error: ErrorObject | None


class Invalid(msgspec.Struct, frozen=True):
    """Not a valid JSON-RPC message. ``code`` is the error to answer with when ``id`` is known."""

    code: int
    reason: str
    id: RequestId | UnsetType = UNSET


Message = Request | Notification | Response | Invalid

_envelope_decoder: Final = msgspec.json.Decoder(Envelope)
_error_decoder: Final = msgspec.json.Decoder(ErrorObject)


#: The method of a line written the usual way (``{"jsonrpc":"2.0","method":"...",``),
#: read without decoding the line.
_METHOD_PEEK: Final = re.compile(
    rb'\A\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"method"\s*:\s*"([A-Za-z0-9_/$.]{1,128})"'
)


class TypedEnvelope(msgspec.Struct, frozen=True):
    """A line read by a :func:`typed_decoders` decoder: each decoder's envelope is a subclass
    that declares ``params`` as its method's Struct."""

    method: str
    params: msgspec.Struct
    id: RequestId | UnsetType = UNSET


TypedDecoders = Mapping[bytes, "msgspec.json.Decoder[msgspec.Struct]"]


def typed_decoders(
    methods: Mapping[str, type[msgspec.Struct]],
) -> dict[bytes, msgspec.json.Decoder[msgspec.Struct]]:
    """Decoders that read a notification of ``method`` with its params as the given Struct
    in the same pass as the envelope (one scan of a large line instead of two)."""
    out: dict[bytes, msgspec.json.Decoder[msgspec.Struct]] = {}
    for method, params_type in methods.items():
        envelope = msgspec.defstruct(
            "TypedEnvelope",
            [("method", str), ("params", params_type), ("id", RequestId | UnsetType, UNSET)],
            bases=(TypedEnvelope,),
            frozen=True,
        )
        out[method.encode()] = msgspec.json.Decoder(envelope)
    return out


@overload
def parse_line(line: bytes | bytearray) -> Message: ...
@overload
def parse_line(
    line: bytes | bytearray, typed: TypedDecoders | None
) -> Message | TypedNotification: ...
def parse_line(
    line: bytes | bytearray, typed: TypedDecoders | None = None
) -> Message | TypedNotification:
    """Classify one line. Never raises.

    ``typed``: for a notification whose method (peeked at the start of the line) has a
    decoder there, the params come back as that Struct, decoded in the same pass; when it
    does not fit, the line is decoded the generic way."""
    if typed:
        peek = _METHOD_PEEK.match(line)
        decoder = typed.get(peek.group(1)) if peek is not None else None
        if decoder is not None:
            try:
                env_typed = decoder.decode(line)
            except RecursionError:
                return Invalid(PARSE_ERROR, "invalid JSON: nested too deeply")
            except msgspec.DecodeError:
                pass  # not the expected shape: classify it the generic way below
            else:
                if isinstance(env_typed, TypedEnvelope) and env_typed.id is UNSET:
                    return TypedNotification(env_typed.method, env_typed.params)
    try:
        env = _envelope_decoder.decode(line)
    except msgspec.ValidationError as exc:
        return Invalid(INVALID_REQUEST, f"not a JSON-RPC message: {exc}")
    except msgspec.DecodeError as exc:
        return Invalid(PARSE_ERROR, f"invalid JSON: {exc}")
    except RecursionError:
        return Invalid(PARSE_ERROR, "invalid JSON: nested too deeply")
    method = env.method
    if method is not UNSET:
        if env.id is UNSET:
            return Notification(method, env.params or NULL)
        return Request(env.id, method, env.params or NULL)
    if env.id is UNSET:
        return Invalid(INVALID_REQUEST, "message has neither method nor id")
    if env.error:
        try:
            err: ErrorObject | None = _error_decoder.decode(env.error)
        except msgspec.DecodeError:
            err = ErrorObject(code=-32603, message="agent sent a malformed error object")
        return Response(env.id, EMPTY, err)
    if env.result:
        return Response(env.id, env.result, None)
    return Invalid(INVALID_REQUEST, "response has neither result nor error", env.id)


def remote_error(err: ErrorObject, method: str = "") -> RemoteError:
    return RemoteError(err.code, err.message, err.data, method=method)


# --------------------------------------------------------------------------- encoders


class _OutRequest(msgspec.Struct, frozen=True):
    jsonrpc: str
    id: RequestId
    method: str
    params: object


class _OutNotification(msgspec.Struct, frozen=True):
    jsonrpc: str
    method: str
    params: object


class _OutResult(msgspec.Struct, frozen=True):
    jsonrpc: str
    id: RequestId
    result: object


class _OutErrorBody(msgspec.Struct, frozen=True, omit_defaults=True):
    code: int
    message: str
    data: object = None


class _OutError(msgspec.Struct, frozen=True):
    jsonrpc: str
    id: RequestId
    error: _OutErrorBody


_encoder: Final = msgspec.json.Encoder()


def _line(msg: object) -> bytes:
    buf = bytearray()
    _encoder.encode_into(msg, buf)
    buf += b"\n"
    return bytes(buf)


def encode_request(id: RequestId, method: str, params: object) -> bytes:
    """``params`` may be a Struct, dict, list, ``msgspec.Raw`` or ``None`` (sent as ``{}``)."""
    return _line(_OutRequest("2.0", id, method, {} if params is None else params))


def encode_notification(method: str, params: object) -> bytes:
    return _line(_OutNotification("2.0", method, {} if params is None else params))


def encode_result(id: RequestId, result: object) -> bytes:
    return _line(_OutResult("2.0", id, result))


def encode_error(id: RequestId, code: int, message: str, data: object = None) -> bytes:
    return _line(_OutError("2.0", id, _OutErrorBody(code, message, data)))
