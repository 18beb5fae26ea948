"""Keep-alive connections that hypercorn can close: the last body message is sent shielded.

quart-trio runs a request as two tasks in one nursery: one reads the ASGI messages, one
sends the response. When the response's last body message is sent, hypercorn queues
``http.disconnect`` for the reader, which cancels the nursery, and only then, further down
the same ``send`` call, marks the connection idle and starts its keep-alive task. That
start is a checkpoint inside the cancelled nursery, so it is cancelled: a connection that
sent a request with a body (any POST) is never marked idle again. Such a connection is then
not closed by hypercorn's keep-alive timeout, and on shutdown it holds the listener for the
whole ``--http-graceful-timeout-ms``.

:class:`ShieldLastBody` shields that one ``send`` (the socket write inside it is already
shielded by hypercorn, and bounded by ``TCP_USER_TIMEOUT``), so the keep-alive task starts
and an idle connection closes at once when the daemon stops.

It sits under the security front (serve/http/middleware.py), around the framework only: the
front's own answers need no shield (no task of the framework's is there to cancel them).
It also counts the app's ASGI calls in flight (``FrontStats.open_requests``: HTTP requests until
their last body message, event streams included, and WebSockets until their handler
returns), so the daemon's drain knows when nothing of the app is left running: hypercorn's
graceful timeout would otherwise also wait on its own leftovers, such as the ping task of a
closed WebSocket, which sleeps out its 15 s interval before it notices the close. The
front counts the requests it answers itself in the same counter.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from serve.host import FrontStats

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class ShieldLastBody:
    """ASGI wrapper: the final ``http.response.body`` message is sent under a shield; the
    calls in flight are counted in ``stats.open_requests``."""

    def __init__(self, app: ASGIApp, stats: FrontStats) -> None:
        self.app = app
        self.stats = stats

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope.get("type")
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        stats = self.stats
        stats.open_requests += 1
        done = False

        def finish() -> None:
            nonlocal done
            if not done:
                done = True
                stats.open_requests -= 1

        async def shielded_send(message: Message) -> None:
            if message.get("type") == "http.response.body" and not message.get("more_body"):
                with trio.CancelScope(shield=True):
                    await send(message)
                finish()  # the response is complete; what follows is hypercorn's
                return
            await send(message)

        try:
            await self.app(scope, receive, shielded_send if kind == "http" else send)
        finally:
            finish()


__all__ = ["ShieldLastBody"]
