"""Sans-IO Server-Sent-Events parsing: bytes in, frames out, envelopes decoded.

Theory of operation
-------------------
:class:`SseParser` follows the WHATWG event-stream rules the daemon's frames use
(spec §5.1): lines end with ``\\r\\n``, ``\\n`` or ``\\r``; ``field: value`` with one
leading space stripped; a line starting with ``:`` is a comment (``: heartbeat``); a blank
line dispatches the frame being built. ``data`` lines are joined with ``\\n``. A frame
with only ``retry``/``id`` (the opening ``retry: 3000``) is still returned, with
``data=None``, so the caller can learn the reconnection delay.

It is fed arbitrary chunks (a frame, a line or a UTF-8 sequence may be split anywhere;
a ``\\r`` at the end of a chunk waits for the next one to know whether ``\\n`` follows)
and keeps at most ``max_frame_chars`` characters of one undispatched frame: beyond that
it raises :class:`~serve.client.errors.ProtocolError` rather than grow without bound
(the reference SDK's 16 Mi-character limit).

:func:`decode_event` applies the SDK's envelope contract: the ``data`` must be a JSON
object with ``v == 1``, a string ``type``, an object ``data`` and, when present, an ``id``
that is a safe integer >= 1; anything else is dropped (None), never raised, so one odd
frame cannot end a stream.
"""

from __future__ import annotations

import codecs
import re
from typing import Final

import msgspec

from serve.client.errors import ProtocolError
from serve.client.types import Event

__all__ = ["MAX_FRAME_CHARS", "SseComment", "SseFrame", "SseParser", "decode_event"]

MAX_FRAME_CHARS: Final = 16 * 1024 * 1024
MAX_SAFE_INTEGER: Final = 2**53 - 1
_LINE_END = re.compile(r"\r\n|\r|\n")
_event_decoder = msgspec.json.Decoder(Event)


class SseFrame(msgspec.Struct, frozen=True):
    """One dispatched frame; ``data`` None when the frame had no data line."""

    data: str | None = None
    event: str | None = None
    id: str | None = None
    retry_ms: int | None = None


class SseComment(msgspec.Struct, frozen=True):
    """A comment line (``: heartbeat``), without the colon and leading space."""

    text: str


class SseParser:
    """Incremental event-stream parser. Not thread-safe; one per connection."""

    def __init__(self, max_frame_chars: int = MAX_FRAME_CHARS) -> None:
        self._max = max_frame_chars
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._tail = ""  # an incomplete line
        self._data: list[str] = []
        self._event: str | None = None
        self._id: str | None = None
        self._retry: int | None = None
        self._has_fields = False
        self._frame_chars = 0

    def feed(self, chunk: bytes) -> list[SseFrame | SseComment]:
        """Parse ``chunk``; return the frames and comments it completed, in order."""
        text = self._tail + self._decoder.decode(chunk)
        out: list[SseFrame | SseComment] = []
        pos = 0
        for match in _LINE_END.finditer(text):
            if match.group() == "\r" and match.end() == len(text):
                break  # maybe the first half of \r\n: wait for more
            self._line(text[pos : match.start()], out)
            pos = match.end()
        self._tail = text[pos:]
        if self._frame_chars + len(self._tail) > self._max:
            raise ProtocolError(f"SSE frame larger than {self._max} characters without a separator")
        return out

    def _line(self, line: str, out: list[SseFrame | SseComment]) -> None:
        if line == "":
            if self._has_fields:
                out.append(
                    SseFrame(
                        data="\n".join(self._data) if self._data else None,
                        event=self._event,
                        id=self._id,
                        retry_ms=self._retry,
                    )
                )
            self._data, self._event, self._id, self._retry = [], None, None, None
            self._has_fields = False
            self._frame_chars = 0
            return
        if line.startswith(":"):
            out.append(SseComment(line[1:].removeprefix(" ")))
            return
        name, sep, value = line.partition(":")
        if sep:
            value = value.removeprefix(" ")
        self._frame_chars += len(line) + 1
        if self._frame_chars > self._max:
            raise ProtocolError(f"SSE frame larger than {self._max} characters without a separator")
        if name == "data":
            self._data.append(value)
            self._has_fields = True
        elif name == "event":
            self._event = value
            self._has_fields = True
        elif name == "id":
            if "\0" not in value:
                self._id = value
                self._has_fields = True
        elif name == "retry":
            if value.isdigit():
                self._retry = int(value)
                self._has_fields = True
        # any other field name is ignored, as the standard says


def decode_event(data: str) -> Event | None:
    """The envelope in a frame's ``data``, or None when it breaks the v1 contract."""
    try:
        event = _event_decoder.decode(data)
    except msgspec.DecodeError:
        return None
    if event.v != 1:
        return None
    if event.id is not None and not 1 <= event.id <= MAX_SAFE_INTEGER:
        return None
    return event
