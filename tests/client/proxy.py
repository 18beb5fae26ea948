"""A TCP proxy for tests that can pause the daemon→client direction and cut connections.

Listens on 127.0.0.1:0 and forwards each accepted connection to the daemon. The
upstream socket gets a small receive buffer, so while the proxy is paused the daemon's
writes back up quickly (that is how a slow client looks to the daemon). ``cut()`` aborts
every open connection at once (both sockets closed, mid-frame if need be); new
connections are still accepted. ``cut_first_after`` cuts the first connection after
exactly that many daemon→client bytes (deterministically mid-stream, usually mid-frame).
``stop_listening()`` refuses new connections. Every task lives in the nursery passed to
``start``.
"""

from __future__ import annotations

import socket

import trio

UPSTREAM_RCVBUF = 4096
CHUNK = 4096


class Proxy:
    def __init__(self, target_port: int, *, cut_first_after: int | None = None) -> None:
        self.target_port = target_port
        self.cut_first_after = cut_first_after
        self._listen_scope = trio.CancelScope()
        self.port = 0
        self.accepted = 0
        self._resume = trio.Event()
        self._resume.set()
        self._scopes: set[trio.CancelScope] = set()

    async def start(self, nursery: trio.Nursery) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        nursery.start_soon(self._listen, listeners)

    async def _listen(self, listeners: list[trio.SocketListener]) -> None:
        with self._listen_scope:
            await trio.serve_listeners(self._handle, listeners)
        for listener in listeners:
            await listener.aclose()

    def stop_listening(self) -> None:
        self._listen_scope.cancel()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def pause(self) -> None:
        if self._resume.is_set():
            self._resume = trio.Event()

    def resume(self) -> None:
        self._resume.set()

    def cut(self) -> None:
        for scope in list(self._scopes):
            scope.cancel()

    async def _handle(self, downstream: trio.SocketStream) -> None:
        self.accepted += 1
        budget = self.cut_first_after if self.accepted == 1 else None
        sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UPSTREAM_RCVBUF)
        await sock.connect(("127.0.0.1", self.target_port))
        upstream = trio.SocketStream(sock)
        with trio.CancelScope() as scope:
            self._scopes.add(scope)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._pump, downstream, upstream, False, None, nursery)
                    nursery.start_soon(self._pump, upstream, downstream, True, budget, nursery)
            finally:
                self._scopes.discard(scope)
        for stream in (upstream, downstream):
            stream.socket.close()

    async def _pump(
        self,
        source: trio.SocketStream,
        sink: trio.SocketStream,
        gated: bool,
        budget: int | None,
        nursery: trio.Nursery,
    ) -> None:
        try:
            while budget is None or budget > 0:
                if gated:
                    await self._resume.wait()
                data = await source.receive_some(CHUNK)
                if not data:
                    break
                if gated:
                    await self._resume.wait()  # paused while receiving: hold this chunk too
                if budget is not None:
                    data = data[:budget]
                    budget -= len(data)
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        nursery.cancel_scope.cancel()
