"""A session's event stream as a resumable async iterator of typed :class:`Event`\\ s.

Theory of operation
-------------------
:class:`EventStream` owns at most one open ``GET /session/:id/events`` response at a
time. ``__anext__`` hands out the envelopes already parsed from it; when none is left it
reads the next chunk, feeds the sans-IO :class:`~serve.client._sse.SseParser`, and lets
the :class:`~serve.client._cursor.StreamCursor` decide, envelope by envelope, what to
deliver. Heartbeat comments are counted, never delivered.

When the connection ends (the daemon evicted a slow reader with ``client_evicted`` and
closed the stream, a proxy cut it, the read timed out because even heartbeats stopped),
the next ``__anext__`` reconnects with ``Last-Event-ID`` = the last delivered id and the
last epoch, so the daemon replays exactly the missed events (duplicates are dropped by
id). Reconnects wait on :class:`~serve.client._cursor.Backoff`; after ``max_attempts``
consecutive failures :class:`~serve.client.errors.EventStreamLostError` is raised. A
reconnect answered 404 raises :class:`~serve.client.errors.NotFoundError` (the session
is gone); 429/5xx are retried; other errors are raised.

Lifecycle frames are delivered as events: ``state_resync_required`` (the caller should
reload the session, e.g. ``load_session``), ``replay_complete`` (once per connection that
asked for a replay), ``slow_client_warning``, ``client_evicted``. The stream ends after
``session_closed`` / ``session_died`` (delivered first).

Opening: the first connection is made by :meth:`open` (or ``async with``, or the first
``__anext__``). Once ``open`` returns, the daemon has registered the subscription, so an
action started afterwards cannot be missed. The first connection is not retried: a wrong
URL, token or session id fails at once.

Cancellation: cancelling a pending ``__anext__`` closes the connection (shielded) and
leaves the stream resumable: the next call reconnects from the cursor. ``aclose`` (or
leaving ``async with``) closes the connection; a closed stream ends iteration.
"""

from __future__ import annotations

import collections
import urllib.parse
from collections.abc import AsyncIterator, Callable
from typing import Self

import anyio
import httpx
import msgspec

from serve.client._cursor import Backoff, StreamCursor, Verdict
from serve.client._sse import SseComment, SseParser, decode_event
from serve.client.errors import (
    DaemonHttpError,
    DaemonUnreachableError,
    EventStreamLostError,
    ProtocolError,
    error_for_status,
)
from serve.client.types import Event

__all__ = ["EventStream", "EventStreamStats"]

_RETRYABLE = frozenset({429, 502, 503, 504})
_MAX_ERROR_BODY = 64 * 1024


class EventStreamStats(msgspec.Struct, frozen=True):
    """Counters of one :class:`EventStream` (for diagnostics and tests)."""

    connections: int
    reconnects: int
    heartbeats: int
    delivered: int
    duplicates_skipped: int
    malformed_dropped: int


class EventStream:
    """A resumable iterator over one session's events; see the module docstring."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        session_id: str,
        *,
        headers: Callable[[], dict[str, str]],
        last_event_id: int | None = None,
        epoch: str | None = None,
        max_queued: int | None = None,
        snapshot: bool = False,
        backoff: Backoff | None = None,
        read_timeout_s: float = 45.0,
        connect_timeout_s: float = 10.0,
    ) -> None:
        self.session_id = session_id
        self._http = http
        self._headers = headers
        self._cursor = StreamCursor(last_event_id, epoch)
        self._max_queued = max_queued
        self._snapshot = snapshot
        self._backoff = backoff or Backoff()
        self._timeout = httpx.Timeout(
            connect=connect_timeout_s, read=read_timeout_s, write=connect_timeout_s, pool=None
        )
        self._response: httpx.Response | None = None
        self._chunks: AsyncIterator[bytes] | None = None
        self._parser = SseParser()
        self._pending: collections.deque[Event] = collections.deque()
        self._closed = False
        self._productive = False  # the open connection yielded a frame or comment
        self._strikes = 0  # consecutive connections/attempts that yielded nothing
        self._reason = "initial"
        self._retry_s: float | None = None
        self._stream_id: str | None = None
        self._connections = 0
        self._heartbeats = 0
        self._skipped = 0
        self._malformed = 0

    # ---- public state --------------------------------------------------------------------

    @property
    def last_event_id(self) -> int | None:
        """Id of the last delivered event: resume from here."""
        return self._cursor.last_event_id

    @property
    def epoch(self) -> str | None:
        """The daemon's event epoch for this session (``X-Qwen-Event-Epoch``)."""
        return self._cursor.epoch

    @property
    def done(self) -> bool:
        return self._closed or self._cursor.done

    def stats(self) -> EventStreamStats:
        return EventStreamStats(
            connections=self._connections,
            reconnects=max(self._connections - 1, 0),
            heartbeats=self._heartbeats,
            delivered=self._cursor.delivered,
            duplicates_skipped=self._skipped,
            malformed_dropped=self._malformed,
        )

    # ---- lifecycle -----------------------------------------------------------------------

    async def open(self) -> Self:
        """Connect now (idempotent); after this the subscription is live on the daemon."""
        if self._response is None and not self.done:
            await self._connect()
        return self

    async def aclose(self) -> None:
        self._closed = True
        self._pending.clear()
        await self._drop()

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Event:
        while True:
            if self.done:
                raise StopAsyncIteration
            if self._pending:
                event = self._pending.popleft()
                verdict = self._cursor.observe(event)
                if verdict is Verdict.SKIP:
                    self._skipped += 1
                    continue
                if verdict is Verdict.STOP:
                    self._pending.clear()
                    await self._drop()
                return event
            if self._response is None:
                await self._connect()
                continue
            await self._read()

    # ---- connection ----------------------------------------------------------------------

    async def _read(self) -> None:
        assert self._chunks is not None
        try:
            chunk = await self._chunks.__anext__()
        except StopAsyncIteration:
            await self._lost("resume")
            return
        except httpx.TransportError:
            await self._lost("transport_error")
            return
        except BaseException:
            await self._drop()  # cancelled mid-read: resumable from the cursor
            raise
        try:
            items = self._parser.feed(chunk)
        except ProtocolError:
            await self._drop()
            raise
        for item in items:
            self._productive = True
            if isinstance(item, SseComment):
                self._heartbeats += 1
                continue
            if item.retry_ms is not None:
                self._retry_s = item.retry_ms / 1000
            if item.data is None:
                continue
            event = decode_event(item.data)
            if event is None:
                self._malformed += 1
            else:
                self._pending.append(event)

    async def _lost(self, reason: str) -> None:
        self._strikes = 0 if self._productive else self._strikes + 1
        self._reason = reason
        await self._drop()

    async def _drop(self) -> None:
        response, self._response, self._chunks = self._response, None, None
        if response is not None:
            with anyio.CancelScope(shield=True):
                await response.aclose()

    def _request(self) -> httpx.Request:
        headers = {"Accept": "text/event-stream", **self._headers()}
        headers.update(self._cursor.resume_headers())
        params: dict[str, str] = {"connectReason": self._reason}
        if self._max_queued is not None:
            params["maxQueued"] = str(self._max_queued)
        if self._snapshot:
            params["snapshot"] = "1"
        if self._stream_id is not None:
            params["previousStreamId"] = self._stream_id
        return self._http.build_request(
            "GET",
            f"/session/{urllib.parse.quote(self.session_id, safe='')}/events",
            headers=headers,
            params=params,
            timeout=self._timeout,
        )

    async def _connect(self) -> None:
        first = self._connections == 0
        floor_s: float | None = None
        last_error: BaseException | None = None
        while True:
            if self._strikes:
                if self._backoff.exhausted(self._strikes):
                    raise EventStreamLostError(
                        self.session_id, self._strikes, self.last_event_id
                    ) from last_error
                delay = self._backoff.delay(self._strikes, cap_s=self._retry_s, floor_s=floor_s)
                await anyio.sleep(delay)
            request = self._request()
            try:
                response = await self._http.send(request, stream=True)
            except httpx.TransportError as exc:
                if first:
                    raise DaemonUnreachableError(
                        f"cannot open the event stream of session {self.session_id} "
                        f"at {request.url}: {exc}"
                    ) from exc
                self._strikes += 1
                self._reason = "transport_error"
                last_error, floor_s = exc, None
                continue
            if response.status_code == 200:
                self._response = response
                self._chunks = response.aiter_bytes()
                self._parser = SseParser()
                self._productive = False
                self._connections += 1
                self._stream_id = response.headers.get("x-qwen-sse-stream-id")
                self._cursor.connected(response.headers.get("x-qwen-event-epoch"))
                if not response.headers.get("content-type", "").startswith("text/event-stream"):
                    await self._drop()
                    raise ProtocolError(
                        f"GET {request.url} answered {response.headers.get('content-type')!r},"
                        " not text/event-stream"
                    )
                return
            error = await _error_of(response, request)
            if first or response.status_code not in _RETRYABLE:
                raise error
            self._strikes += 1
            last_error, floor_s = error, error.retry_after_s


async def _error_of(response: httpx.Response, request: httpx.Request) -> DaemonHttpError:
    try:
        raw = b""
        async for chunk in response.aiter_bytes():
            raw += chunk
            if len(raw) > _MAX_ERROR_BODY:
                break
    except httpx.TransportError:
        raw = b""
    finally:
        await response.aclose()
    try:
        body = msgspec.json.decode(raw) if raw else {}
    except msgspec.DecodeError:
        body = {}
    return error_for_status(
        response.status_code,
        body if isinstance(body, dict) else {},
        method=request.method,
        url=str(request.url),
        retry_after=response.headers.get("retry-after"),
    )
