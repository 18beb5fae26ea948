"""The security front's raw ASGI I/O: early answers and bounded request-body reads.

:mod:`serve.http.middleware` answers refusals and its fast-path reads itself, below the
framework, and reads every request body before the app sees it (see its docstring for
why). These helpers hold that I/O so the checks read as checks: :func:`respond` (a
complete small JSON response), :func:`drain_body` (read and discard, bounded in bytes and
time), :func:`read_body` (the whole body, bounded) and :func:`replay` (a ``receive`` that
hands a read body to the app as one message). Nothing here decides anything.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import trio

__all__ = [
    "BODY_READ_TIMEOUT_S",
    "DRAIN_TIMEOUT_S",
    "JSON_TYPE",
    "TIMED_OUT",
    "TOO_LARGE",
    "drain_body",
    "read_body",
    "replay",
    "respond",
]

log = logging.getLogger("serve.http.middleware")

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

JSON_TYPE = b"application/json; charset=utf-8"
DRAIN_TIMEOUT_S = 10.0
"""Longest time spent draining a refused request's body."""
BODY_READ_TIMEOUT_S = 60.0
"""Longest time spent reading a chunked body (the app's ``BODY_TIMEOUT``)."""

#: What :func:`read_body` returns past its limit, and after its timeout.
TOO_LARGE = b"<too large>"
TIMED_OUT = b"<timed out>"


async def respond(
    send: Send,
    status: int,
    body: bytes,
    headers: tuple[tuple[bytes, bytes], ...],
    *,
    close: bool,
) -> None:
    """Send a whole response: ``body`` (JSON when not empty) with ``headers``; with
    ``close``, ``Connection: close`` and a failed send is only logged."""
    out: list[tuple[bytes, bytes]] = []
    if body:
        out.append((b"content-type", JSON_TYPE))
    out.append((b"content-length", b"%d" % len(body)))
    out.extend(headers)
    if close:
        out.append((b"connection", b"close"))
    try:
        await send({"type": "http.response.start", "status": status, "headers": out})
        await send({"type": "http.response.body", "body": body})
    except (trio.BusyResourceError, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        # An early refusal on a connection hypercorn is already tearing down (a peer
        # still pushing a body it will never be allowed to send): nothing to deliver.
        if not close:
            raise
        log.debug("early %d not delivered: the connection is closing", status)


async def drain_body(receive: Receive, limit: int) -> bool:
    """Read and discard the request body; True iff it ended within ``limit`` bytes and
    :data:`DRAIN_TIMEOUT_S`."""
    total = 0
    with trio.move_on_after(DRAIN_TIMEOUT_S):
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return False
            total += len(message.get("body", b""))
            if not message.get("more_body", False):
                return True
            if total > limit:
                return False
    return False


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole request body, :data:`TOO_LARGE` past ``limit`` bytes, :data:`TIMED_OUT`
    after :data:`BODY_READ_TIMEOUT_S`, or ``None`` when the client disconnected."""
    parts: list[bytes] = []
    total = 0
    with trio.move_on_after(BODY_READ_TIMEOUT_S):
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > limit:
                return TOO_LARGE
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)
    return TIMED_OUT


def replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that yields ``body`` once, then defers to the real one."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
