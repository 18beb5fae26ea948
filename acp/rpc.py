"""A JSON-RPC 2.0 peer over a pair of byte streams (the I/O half of :mod:`acp.jsonrpc`).

Theory of operation
-------------------
An :class:`RpcChannel` has two long-lived tasks, started with :meth:`RpcChannel.start` in a
nursery its owner provides:

* the **reader** frames the receive stream into lines (bounded by ``max_line_bytes``), and for
  each line, in order (letting the loop run every :data:`LINES_PER_STEP` lines, and between
  decoding and dispatching a line of :data:`SPLIT_LINE_BYTES` or more): resolves the
  pending call a *response* answers; hands a *notification* to
  ``dispatcher.on_notification`` synchronously (so ordering is exactly the wire order: the
  updates ``session/load`` replays are delivered before its response resolves the call); starts
  a *request* in its own task in the nursery. It never awaits a handler. Garbage, oversized
  lines and unknown response ids are dropped (counted in :meth:`statistics`); invalid and
  oversized lines are logged through a :class:`ThrottledWarning` each (the first at once,
  then at most one line per :data:`DROP_LOG_INTERVAL_S` with the count), and an oversized
  line is also reported to the dispatcher's ``on_oversized_line`` when it has one; a
  request that is not valid JSON-RPC but has an id is answered ``-32600``.
* the **writer** owns the send stream: every outgoing line goes through a bounded memory
  channel (``write_queue_messages``) and the writer sends whatever is queued in one write.
  Callers never touch the stream, so a cancelled caller cannot leave half a line behind.

Calls: :meth:`call` registers a slot in the pending table, queues the request and waits for the
slot (optionally with a deadline -> :class:`~acp.errors.RequestTimeout`). On timeout or
cancellation the slot is dropped and ``$/cancel_request`` is sent best-effort; a late answer is
then ignored.

Incoming requests run in handler tasks (at most ``max_concurrent_requests``; beyond that the
request is answered ``-32603`` at once rather than blocking the reader). ``$/cancel_request``
from the peer cancels the matching task, which then answers ``-32800``. A handler raising
:class:`~acp.errors.HandlerError` answers with its code; ``msgspec.ValidationError`` gives
``-32602``; anything else ``-32603`` (and is logged).

Closing: :meth:`close` (idempotent, synchronous) fails every pending call with the given
:class:`~acp.errors.ChannelClosed`, makes every later call fail the same way at once, cancels
handler tasks, and lets the writer flush what is queued and stop. The reader ends on EOF or a
broken stream and then calls ``on_read_closed`` (the owner decides when to :meth:`close`,
typically after learning the child's exit status).
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Final, Protocol

import msgspec
import trio
import trio.lowlevel
from msgspec import Raw

from acp import jsonrpc, telemetry
from acp.errors import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    REQUEST_CANCELLED,
    ChannelClosed,
    HandlerError,
    RemoteError,
    RequestTimeout,
)
from acp.jsonrpc import (
    Invalid,
    LineFramer,
    Notification,
    OversizedLine,
    Request,
    RequestId,
    Response,
    TypedNotification,
)

log = logging.getLogger(__name__)

CANCEL_REQUEST: Final = "$/cancel_request"
DEFAULT_MAX_CONCURRENT_REQUESTS: Final = 64
DEFAULT_WRITE_QUEUE_MESSAGES: Final = 1024
READ_CHUNK_BYTES: Final = 256 * 1024
#: Lines at least this long are decoded and dispatched in two loop steps.
SPLIT_LINE_BYTES: Final = 1024 * 1024
#: The reader lets the loop run after this many lines of one chunk.
LINES_PER_STEP: Final = 256
#: Dropped lines (invalid, oversized) are logged at most once per this many seconds each.
DROP_LOG_INTERVAL_S: Final = 10.0


class ThrottledWarning:
    """One log line for the first occurrence, then at most one per ``interval_s`` with the
    count of the ones in between, so a peer writing 100k bad lines costs a few log lines.

    ``note()`` is O(1) and cheap when suppressed; ``flush()`` reports what is still
    uncounted (the reader calls it when it ends)."""

    __slots__ = ("_last", "_next_at", "_suppressed", "interval_s", "name", "total", "what")

    def __init__(self, name: str, what: str, interval_s: float = DROP_LOG_INTERVAL_S) -> None:
        self.name = name
        self.what = what
        self.interval_s = interval_s
        self.total = 0
        self._suppressed = 0
        self._last = ""
        self._next_at = 0.0

    def note(self, detail: str) -> None:
        self.total += 1
        now = time.monotonic()
        if now < self._next_at:
            self._suppressed += 1
            self._last = detail
            return
        self._next_at = now + self.interval_s
        if self._suppressed:
            self._report(1, detail)
        else:
            log.warning("%s sent %s; dropped: %s", self.name, self.what, detail)

    def flush(self) -> None:
        if self._suppressed:
            self._report(0, self._last)
        self._next_at = 0.0

    def _report(self, extra: int, detail: str) -> None:
        log.warning(
            "%s sent %d more %s in the last %g s (%d in all); dropped, the last: %s",
            self.name,
            self._suppressed + extra,
            self.what,
            self.interval_s,
            self.total,
            detail,
        )
        self._suppressed = 0


class Dispatcher(Protocol):
    """What the channel needs from its owner."""

    def on_notification(self, method: str, params: Raw | msgspec.Struct) -> None:
        """Called from the reader, in wire order; must not block or raise. ``params`` is
        the Struct given in ``typed_notifications`` for such methods."""

    async def on_request(self, method: str, params: Raw) -> object:
        """Answer a peer request; return the result (anything msgspec encodes)."""


class DropObserver(Protocol):
    """A dispatcher may also hear of every line dropped for its size: ``on_oversized_line``
    is called from the reader (synchronously, must not block or raise) with the line's
    size and the cap, both in bytes, and an excerpt: the line's first and last
    :data:`~acp.jsonrpc.EXCERPT_BYTES` joined by ``\n`` (which no line contains)."""

    def on_oversized_line(self, size: int, limit: int, excerpt: bytes) -> None: ...


class FlowControlled(Protocol):
    """A dispatcher may also pace the reader: ``flow_control(incoming_bytes)`` is awaited
    after each chunk read from the peer has been dispatched, with the bytes of the line
    still being received (what the next message will at least weigh). While it waits,
    nothing more is read, the pipe fills and the peer blocks on its writes (bounded by what
    the owner decides)."""

    async def flow_control(self, incoming_bytes: int) -> None: ...


class RpcStatistics(msgspec.Struct, frozen=True, kw_only=True):
    pending_calls: int
    inflight_requests: int
    queued_writes: int
    max_queued_writes: int
    lines_in: int
    bytes_in: int
    lines_out: int
    dropped_oversized: int
    dropped_invalid: int
    unknown_responses: int


class _Slot:
    __slots__ = ("error", "event", "method", "result")

    def __init__(self, method: str) -> None:
        self.method = method
        self.event = trio.Event()
        self.result: Raw | None = None
        self.error: Exception | None = None


class _Inflight:
    __slots__ = ("cancelled_by_peer", "scope")

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.cancelled_by_peer = False


def _with_traceparent(params: object, traceparent: str) -> object:
    """``params`` with ``_meta.traceparent`` set, when they are (or convert to) an object."""
    if isinstance(params, msgspec.Struct):
        try:
            params = msgspec.to_builtins(params)
        except (TypeError, ValueError):
            return params
    if isinstance(params, dict):
        return telemetry.with_traceparent(params, traceparent)
    return params


class RpcChannel:
    """One JSON-RPC connection; see the module docstring."""

    def __init__(
        self,
        send_stream: trio.abc.SendStream,
        receive_stream: trio.abc.ReceiveStream,
        dispatcher: Dispatcher,
        *,
        name: str = "agent",
        max_line_bytes: int = jsonrpc.DEFAULT_MAX_LINE_BYTES,
        max_concurrent_requests: int = DEFAULT_MAX_CONCURRENT_REQUESTS,
        write_queue_messages: int = DEFAULT_WRITE_QUEUE_MESSAGES,
        on_read_closed: Callable[[str], Awaitable[None]] | None = None,
        typed_notifications: Mapping[str, type[msgspec.Struct]] | None = None,
    ) -> None:
        self.name = name
        self._typed = jsonrpc.typed_decoders(typed_notifications) if typed_notifications else None
        self._send_stream = send_stream
        self._receive_stream = receive_stream
        self._dispatcher = dispatcher
        self._flow_control: Callable[[int], Awaitable[None]] | None = getattr(
            dispatcher, "flow_control", None
        )
        self._on_oversized: Callable[[int, int, bytes], None] | None = getattr(
            dispatcher, "on_oversized_line", None
        )
        self._framer = LineFramer(max_line_bytes)
        self._max_inflight = max_concurrent_requests
        self._out_send, self._out_recv = trio.open_memory_channel[bytes](write_queue_messages)
        self._max_queued = write_queue_messages
        self._on_read_closed = on_read_closed
        self._ids = itertools.count(1)
        self._pending: dict[int, _Slot] = {}
        self._inflight: dict[RequestId, _Inflight] = {}
        self._nursery: trio.Nursery | None = None
        self._closed: ChannelClosed | None = None
        self._reader_scope = trio.CancelScope()
        self.reader_done = trio.Event()
        self.writer_done = trio.Event()
        self._lines_in = 0
        self._bytes_in = 0
        self._lines_out = 0
        self._dropped_oversized = 0
        self._dropped_invalid = 0
        self._unknown_responses = 0
        self._invalid_log = ThrottledWarning(name, "invalid lines")
        self._oversized_log = ThrottledWarning(name, "oversized lines")

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self, nursery: trio.Nursery) -> None:
        """Start the reader and writer in ``nursery`` (which also hosts the handler tasks)."""
        self._nursery = nursery
        nursery.start_soon(self._reader, name=f"acp-reader-{self.name}")
        nursery.start_soon(self._writer, name=f"acp-writer-{self.name}")

    @property
    def closed(self) -> bool:
        return self._closed is not None

    @property
    def close_reason(self) -> ChannelClosed | None:
        return self._closed

    def close(self, exc: ChannelClosed) -> None:
        """Fail pending calls with ``exc``, refuse new ones, stop handlers; flush, then stop the
        writer. Idempotent (the first reason wins)."""
        if self._closed is not None:
            return
        self._closed = exc
        pending, self._pending = self._pending, {}
        for slot in pending.values():
            slot.error = exc
            slot.event.set()
        for inflight in self._inflight.values():
            inflight.scope.cancel()
        self._out_send.close()

    def cancel_reader(self) -> None:
        """Stop reading (used when the peer is gone but something still holds its pipe)."""
        self._reader_scope.cancel()

    def statistics(self) -> RpcStatistics:
        return RpcStatistics(
            pending_calls=len(self._pending),
            inflight_requests=len(self._inflight),
            queued_writes=self._out_send.statistics().current_buffer_used,
            max_queued_writes=self._max_queued,
            lines_in=self._lines_in,
            bytes_in=self._bytes_in,
            lines_out=self._lines_out,
            dropped_oversized=self._dropped_oversized,
            dropped_invalid=self._dropped_invalid,
            unknown_responses=self._unknown_responses,
        )

    # -- outgoing -----------------------------------------------------------------------------

    async def _send(self, line: bytes) -> None:
        if self._closed is not None:
            raise self._closed
        try:
            await self._out_send.send(line)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise self._closed or ChannelClosed("writer stopped")

    def _send_nowait(self, line: bytes) -> bool:
        if self._closed is not None:
            return False
        try:
            self._out_send.send_nowait(line)
            return True
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            return False

    async def notify(self, method: str, params: object, timeout_s: float | None = None) -> None:
        """Queue a notification. Raises ChannelClosed when the channel is closed, and
        RequestTimeout if the write queue stays full (peer not reading) for ``timeout_s``."""
        line = jsonrpc.encode_notification(method, params)
        if timeout_s is None:
            await self._send(line)
            return
        with trio.move_on_after(timeout_s):
            await self._send(line)
            return
        raise RequestTimeout(method, timeout_s)

    async def call(self, method: str, params: object, timeout_s: float | None = None) -> Raw:
        """Send a request and wait for its result (raw bytes).

        Raises RemoteError (the peer answered with an error), RequestTimeout, ChannelClosed."""
        if self._closed is not None:
            raise self._closed
        if not telemetry.enabled():
            return await self._call(method, params, timeout_s)
        attributes = {"rpc.system": "jsonrpc", "rpc.method": method, "acp.peer": self.name}
        with telemetry.span(method, kind="client", attributes=attributes) as span:
            traceparent = span.traceparent
            if traceparent is not None:  # the agent joins the trace (ACP ``_meta``)
                params = _with_traceparent(params, traceparent)
            return await self._call(method, params, timeout_s)

    async def _call(self, method: str, params: object, timeout_s: float | None) -> Raw:
        request_id = next(self._ids)
        line = jsonrpc.encode_request(request_id, method, params)
        slot = _Slot(method)
        self._pending[request_id] = slot
        answered = False
        try:
            # The deadline covers queueing too: a peer that stops reading fills the pipe and
            # then the write queue.
            with trio.move_on_after(math.inf if timeout_s is None else timeout_s):
                await self._send(line)
                await slot.event.wait()
            answered = slot.event.is_set()
        finally:
            self._pending.pop(request_id, None)
            if not answered and self._closed is None:
                self._send_nowait(
                    jsonrpc.encode_notification(CANCEL_REQUEST, {"requestId": request_id})
                )
        if slot.error is not None:
            raise slot.error
        if not answered:
            assert timeout_s is not None
            raise RequestTimeout(method, timeout_s)
        assert slot.result is not None
        return slot.result

    # -- reader -------------------------------------------------------------------------------

    async def _reader(self) -> None:
        reason = f"{self.name} closed its stdout"
        try:
            with self._reader_scope:
                while True:
                    data = await self._receive_stream.receive_some(READ_CHUNK_BYTES)
                    if not data:
                        break
                    self._bytes_in += len(data)
                    for n, line in enumerate(self._framer.feed(data), 1):
                        if isinstance(line, OversizedLine) or len(line) < SPLIT_LINE_BYTES:
                            self._dispatch_line(line)
                            if not n % LINES_PER_STEP:  # a chunk of many short lines
                                await trio.lowlevel.checkpoint()
                            continue
                        # A large line: decode it, let the loop run, then dispatch it, so
                        # the two costly halves are two short steps, not one long one.
                        self._lines_in += 1
                        msg = jsonrpc.parse_line(line, self._typed)
                        await trio.lowlevel.checkpoint()
                        self._dispatch_message(msg, line)
                        await trio.lowlevel.checkpoint()
                    if self._flow_control is not None:
                        await self._flow_control(self._framer.buffered_bytes)
            if self._reader_scope.cancelled_caught:
                reason = f"stopped reading from {self.name}"
        except trio.BrokenResourceError as exc:
            reason = f"{self.name} stdout broke: {exc}"
        except trio.ClosedResourceError:
            reason = f"{self.name} stdout was closed"
        finally:
            self._invalid_log.flush()
            self._oversized_log.flush()
            self.reader_done.set()
        if self._on_read_closed is not None:
            await self._on_read_closed(reason)
        else:
            self.close(ChannelClosed(reason))

    def _dispatch_line(self, line: bytes | bytearray | OversizedLine) -> None:
        if isinstance(line, OversizedLine):
            self._dropped_oversized += 1
            limit = self._framer.max_line_bytes
            self._oversized_log.note(f"{line.size}-byte line over the {limit}-byte cap")
            if self._on_oversized is not None:
                try:
                    self._on_oversized(line.size, limit, line.head + b"\n" + line.tail)
                except Exception:
                    log.exception("on_oversized_line of %s failed", self.name)
            return
        self._lines_in += 1
        self._dispatch_message(jsonrpc.parse_line(line, self._typed), line)

    def _dispatch_message(
        self, msg: jsonrpc.Message | TypedNotification, line: bytes | bytearray
    ) -> None:
        try:
            if isinstance(msg, TypedNotification):
                self._dispatcher.on_notification(msg.method, msg.params)
            elif isinstance(msg, Notification):
                if msg.method == CANCEL_REQUEST:
                    self._on_cancel_request(msg.params)
                else:
                    self._dispatcher.on_notification(msg.method, msg.params)
            elif isinstance(msg, Response):
                self._on_response(msg)
            elif isinstance(msg, Request):
                self._on_request(msg)
            else:
                self._on_invalid(msg, line)
        except Exception:
            log.exception("error handling a message from %s; dropped: %.200r", self.name, line)

    def _on_response(self, msg: Response) -> None:
        rid = msg.id
        if isinstance(rid, str) and rid.isdigit():
            rid = int(rid)
        slot = self._pending.pop(rid, None) if isinstance(rid, int) else None
        if slot is None:
            self._unknown_responses += 1
            log.debug("%s answered unknown or abandoned request id %r", self.name, msg.id)
            return
        if msg.error is not None:
            slot.error = jsonrpc.remote_error(msg.error, slot.method)
        else:
            slot.result = msg.result
        slot.event.set()

    def _on_invalid(self, msg: Invalid, line: bytes | bytearray) -> None:
        self._dropped_invalid += 1
        self._invalid_log.note(f"{msg.reason[:200]}: {line[:120]!r}")
        if msg.id is not msgspec.UNSET and msg.code == INVALID_REQUEST:
            self._send_nowait(jsonrpc.encode_error(msg.id, INVALID_REQUEST, msg.reason))

    def _on_cancel_request(self, params: Raw) -> None:
        try:
            request_id = msgspec.json.decode(params, type=dict[str, int | str])["requestId"]
        except (msgspec.DecodeError, KeyError):
            log.debug("%s sent a malformed %s: %r", self.name, CANCEL_REQUEST, bytes(params))
            return
        inflight = self._inflight.get(request_id)
        if inflight is not None:
            inflight.cancelled_by_peer = True
            inflight.scope.cancel()

    def _on_request(self, msg: Request) -> None:
        if self._closed is not None or self._nursery is None:
            return
        if msg.id in self._inflight:
            self._send_nowait(
                jsonrpc.encode_error(msg.id, INVALID_REQUEST, "duplicate request id in flight")
            )
            return
        if len(self._inflight) >= self._max_inflight:
            log.warning("%s: too many concurrent requests; refusing %s", self.name, msg.method)
            self._send_nowait(
                jsonrpc.encode_error(
                    msg.id,
                    INTERNAL_ERROR,
                    f"client busy: more than {self._max_inflight} concurrent requests",
                )
            )
            return
        inflight = _Inflight()
        self._inflight[msg.id] = inflight
        self._nursery.start_soon(self._serve, msg, inflight, name=f"acp-handler-{msg.method}")

    async def _serve(self, msg: Request, inflight: _Inflight) -> None:
        reply: bytes | None = None
        try:
            with inflight.scope:
                try:
                    result = await self._dispatcher.on_request(msg.method, msg.params)
                    reply = jsonrpc.encode_result(msg.id, result)
                except HandlerError as exc:
                    reply = jsonrpc.encode_error(msg.id, exc.code, exc.message, exc.data)
                except RemoteError as exc:  # a handler relaying another peer's error
                    reply = jsonrpc.encode_error(msg.id, exc.code, exc.message, exc.data)
                except msgspec.ValidationError as exc:
                    reply = jsonrpc.encode_error(
                        msg.id, INVALID_PARAMS, f"Invalid params: {exc}", {"method": msg.method}
                    )
                except Exception as exc:
                    log.exception("client handler for %s failed", msg.method)
                    reply = jsonrpc.encode_error(
                        msg.id,
                        INTERNAL_ERROR,
                        f"client handler failed: {type(exc).__name__}: {exc}",
                        {"method": msg.method},
                    )
            if inflight.scope.cancelled_caught and inflight.cancelled_by_peer:
                reply = jsonrpc.encode_error(msg.id, REQUEST_CANCELLED, "Request cancelled")
        finally:
            self._inflight.pop(msg.id, None)
        if reply is not None and self._closed is None:
            try:
                await self._send(reply)
            except ChannelClosed:
                pass

    # -- writer -------------------------------------------------------------------------------

    async def _writer(self) -> None:
        try:
            async with self._out_recv:
                async for line in self._out_recv:
                    batch = [line]
                    while len(batch) < 256:
                        try:
                            batch.append(self._out_recv.receive_nowait())
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
                    await self._send_stream.send_all(
                        batch[0] if len(batch) == 1 else b"".join(batch)
                    )
                    self._lines_out += len(batch)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            # The peer is going away; the owner learns why from the reader / the exit and
            # closes the channel with that reason. Later sends fail with "writer stopped".
            log.debug("%s: writer stopped: %s", self.name, type(exc).__name__)
        finally:
            self.writer_done.set()
