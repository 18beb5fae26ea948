"""A minimal raw ACP-over-HTTP client for the wire tests (httpx + trio, real sockets)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import trio

from tests.conftest import AUTH

#: Hang guard for one wait in these tests (not a timing assertion).
GUARD_S = 30


class Frame:
    """One SSE message: its ``id:`` (None for replies and lifecycle) and its JSON-RPC body."""

    def __init__(self, event_id: int | None, message: dict[str, Any]) -> None:
        self.id = event_id
        self.message = message

    @property
    def method(self) -> str | None:
        return self.message.get("method")

    @property
    def kind(self) -> str | None:
        if self.method == "_qwen/notify":
            return self.message["params"]["kind"]
        return None

    def __repr__(self) -> str:
        return f"Frame({self.id}, {json.dumps(self.message)[:160]})"


class Stream:
    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.first_line: str | None = None
        self._send, self._recv = trio.open_memory_channel[Frame | None](10_000)

    async def pump(self) -> None:
        event_id: int | None = None
        data: list[str] = []
        try:
            async for line in self.response.aiter_lines():
                if self.first_line is None:
                    self.first_line = line
                if line == "":
                    if data:
                        await self._send.send(Frame(event_id, json.loads("\n".join(data))))
                    event_id, data = None, []
                elif line.startswith("id: "):
                    event_id = int(line[4:])
                elif line.startswith("data: "):
                    data.append(line[6:])
        except (httpx.HTTPError, trio.ClosedResourceError):
            pass
        finally:
            await self._send.send(None)

    async def next(self) -> Frame | None:
        """The next message, or None once the stream has ended."""
        with trio.fail_after(GUARD_S):
            return await self._recv.receive()

    async def until(self, predicate: Any) -> list[Frame]:
        out: list[Frame] = []
        while True:
            frame = await self.next()
            if frame is None:
                raise AssertionError(f"stream ended before the awaited message: {out}")
            out.append(frame)
            if predicate(frame):
                return out

    async def reply(self, rid: Any) -> Frame:
        frames = await self.until(lambda f: f.message.get("id") == rid and f.method is None)
        return frames[-1]


class AcpHttp:
    """One ACP connection over Streamable HTTP."""

    def __init__(self, client: httpx.AsyncClient, nursery: trio.Nursery) -> None:
        self.client = client
        self.nursery = nursery
        self.connection_id: str | None = None
        self._next = 100

    def next_id(self) -> int:
        self._next += 1
        return self._next

    def headers(self, session_id: str | None = None, **extra: str) -> dict[str, str]:
        out = {**AUTH, **extra}
        if self.connection_id:
            out["Acp-Connection-Id"] = self.connection_id
        if session_id:
            out["Acp-Session-Id"] = session_id
        return out

    async def initialize(self, params: dict[str, Any] | None = None) -> dict[str, Any]:
        body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params or {}}
        response = await self.client.post("/acp", json=body, headers=AUTH)
        assert response.status_code == 200, response.text
        self.connection_id = response.headers["acp-connection-id"]
        return response.json()  # type: ignore[no-any-return]

    async def post(
        self, message: dict[str, Any], session_id: str | None = None, **headers: str
    ) -> httpx.Response:
        return await self.client.post(
            "/acp", json=message, headers=self.headers(session_id, **headers)
        )

    async def request(
        self, method: str, params: dict[str, Any], session_id: str | None = None
    ) -> int:
        rid = self.next_id()
        response = await self.post(
            {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}, session_id
        )
        assert response.status_code == 202, response.text
        assert response.content == b""
        return rid

    @asynccontextmanager
    async def stream(self, session_id: str | None = None, **headers: str) -> AsyncIterator[Stream]:
        request = self.client.build_request(
            "GET",
            "/acp",
            headers=self.headers(session_id, Accept="text/event-stream", **headers),
            timeout=httpx.Timeout(30, read=None),
        )
        response = await self.client.send(request, stream=True)
        try:
            assert response.status_code == 200, (await response.aread()).decode()
            stream = Stream(response)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(stream.pump)
                yield stream
                nursery.cancel_scope.cancel()
        finally:
            await response.aclose()

    async def new_session(self, cwd: str, conn: Stream) -> dict[str, Any]:
        rid = await self.request("session/new", {"cwd": cwd, "mcpServers": []})
        reply = await conn.reply(rid)
        assert "result" in reply.message, reply
        return reply.message["result"]  # type: ignore[no-any-return]


class WsClosed(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(f"closed {code}")
        self.code = code


class Ws:
    """A minimal WebSocket client (wsproto over a trio TCP stream)."""

    def __init__(self, stream: trio.SocketStream, conn: Any) -> None:
        self.stream = stream
        self.conn = conn
        self._pending: list[Any] = []

    @classmethod
    async def connect(cls, port: int, path: str = "/acp", headers: dict[str, str] | None = None):
        from wsproto import ConnectionType, WSConnection
        from wsproto.events import AcceptConnection, RejectConnection, Request

        stream = await trio.open_tcp_stream("127.0.0.1", port)
        conn = WSConnection(ConnectionType.CLIENT)
        extra = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
        await stream.send_all(
            conn.send(Request(host=f"127.0.0.1:{port}", target=path, extra_headers=extra))
        )
        ws = cls(stream, conn)
        while True:
            for event in await ws._events():
                if isinstance(event, AcceptConnection):
                    return ws
                if isinstance(event, RejectConnection):
                    await stream.aclose()
                    raise WsClosed(-event.status_code)

    async def _events(self) -> list[Any]:
        with trio.fail_after(GUARD_S):
            data = await self.stream.receive_some(65536)
        self.conn.receive_data(data or None)
        return list(self.conn.events())

    async def send(self, obj: Any) -> None:
        from wsproto.events import TextMessage

        text = obj if isinstance(obj, str) else json.dumps(obj)
        await self.stream.send_all(self.conn.send(TextMessage(data=text)))

    async def recv(self) -> dict[str, Any]:
        """The next JSON message; raises :class:`WsClosed` when the server closes."""
        from wsproto.events import CloseConnection, Ping, TextMessage

        buffer = ""
        while True:
            if not self._pending:
                self._pending = await self._events()
            event = self._pending.pop(0)
            if isinstance(event, TextMessage):
                buffer += event.data
                if event.message_finished:
                    return json.loads(buffer)  # type: ignore[no-any-return]
            elif isinstance(event, CloseConnection):
                raise WsClosed(event.code)
            elif isinstance(event, Ping):
                from wsproto.connection import ConnectionState

                if self.conn.state is ConnectionState.OPEN:  # not once the server closes
                    await self.stream.send_all(self.conn.send(event.response()))

    async def until(self, predicate: Any) -> list[dict[str, Any]]:
        out = []
        while True:
            msg = await self.recv()
            out.append(msg)
            if predicate(msg):
                return out

    async def abort(self) -> None:
        """Drop the socket without a closing handshake."""
        await self.stream.aclose()
