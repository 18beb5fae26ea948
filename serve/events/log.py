"""The per-session event log: a ring of pre-encoded SSE frames read through cursors.

Theory of operation
-------------------
Every event a client may care about is published once: it gets the next id (monotonic
from 1 per log, never reused, never burnt by a rejected event), is encoded once into its
complete SSE frame (``id: N`` / ``event: T`` / ``data: <envelope JSON>``) and stored in a
ring of ``ring_size`` frames addressed by id (``frames[id % ring_size]``). Publishing is
O(1) in the number of subscribers: it stores the frame and sets one shared wake-up event.

The ring is bounded in frames (``ring_size``) and in bytes (``ring_bytes``): publishing past
the byte bound evicts the oldest frames until the frames held fit (the newest frame is
always kept, whatever its size). Evicted ids are gone as if the ring had wrapped: a replay
from before them gets ``state_resync_required {reason:"ring_evicted"}``. A frame is built
with one ``join`` of its parts; ``data`` may be :class:`RawParts` (pieces of JSON, e.g.
an agent's update spliced into ``{sessionId, update}``) so a multi-MiB update is copied
once, into its frame, and never re-encoded.

A :class:`Subscriber` is a cursor (the next id it will send) plus its own bounds. It wakes
on the shared event and takes everything between its cursor and the head in one chunk, so
a fast writer sends large batches and a slow one falls behind. Its *lag* (head − cursor,
live frames only: replay does not count) plays the role of the reference's per-subscriber
queue:

* lag ≥ 75 % of ``max_queued`` → one ``slow_client_warning`` frame (no id) before the
  batch; re-armed when the lag falls to 37.5 % or below;
* lag > ``max_queued`` (or the cursor fell out of the ring) → a terminal
  ``client_evicted`` frame and the end of that stream; the client reconnects with
  ``Last-Event-ID``.

Subscribing with ``Last-Event-ID`` replays from the ring (qwen-serve-spec §5.3):
``state_resync_required`` when the epoch differs or the id is in the future
(``epoch_reset``, whole ring replayed), when the ring is empty but the id is behind
(``seeded_replay_not_in_ring``), or when the ring no longer holds the next id
(``ring_evicted``); replay is cut at 8 MiB (``replay_budget_exceeded``); a
``replay_complete`` frame always follows a replay. Synthetic frames carry no id.

Closing the log (after a terminal ``session_died`` / ``session_closed``) lets every
subscriber drain what is left and then end.

A ``sink`` callback (the durable journal) sees every frame after it is encoded and before
subscribers are woken; then a ``tap`` (the webhooks service, ``serve/webhooks``), which must
not block either.

Everything here runs on the trio thread; nothing blocks.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
import trio

RETRY_FRAME = b"retry: 3000\n\n"
HEARTBEAT_FRAME = b": heartbeat\n\n"
REPLAY_BUDGET_BYTES = 8 * 1024 * 1024
MAX_SUBSCRIBERS = 64
DEFAULT_MAX_QUEUED = 256
MIN_MAX_QUEUED, MAX_MAX_QUEUED = 16, 2048
#: Frames handed to a writer in one chunk at most (keeps one write bounded).
MAX_BATCH_FRAMES = 1024

#: Default byte bound of a ring (``--event-ring-bytes``).
DEFAULT_RING_BYTES = 32 * 1024 * 1024

_encoder = msgspec.json.Encoder()

Sink = Callable[[int, str, bytes], None]
#: A tap (the webhooks service) sees ``(session id, event id, type, frame)`` after the sink.
Tap = Callable[[str, int, str, bytes], None]


class SubscriberLimitExceeded(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"EventBus subscriber limit reached ({limit})")
        self.limit = limit


def _now_ms() -> int:
    return int(time.time() * 1000)


class RawParts(tuple[bytes | msgspec.Raw | memoryview, ...]):
    """A JSON value given as consecutive buffers (bytes, ``msgspec.Raw``, memoryview) that
    are only ever joined into the frame: ``RawParts((b'{"a":', raw, b"}"))``."""

    __slots__ = ()


def _envelope_parts(
    event_id: int | None,
    event_type: str,
    data: object,
    *,
    prompt_id: str | None = None,
    originator: str | None = None,
    meta: dict[str, Any] | None = None,
) -> list[bytes | msgspec.Raw | memoryview]:
    parts: list[bytes | msgspec.Raw | memoryview] = [b"{"]
    if event_id is not None:
        parts.append(b'"id":%d,' % event_id)
    parts.append(b'"v":1,"type":')
    parts.append(_encoder.encode(event_type))
    parts.append(b',"data":')
    if isinstance(data, RawParts):
        parts.extend(data)
    elif isinstance(data, msgspec.Raw):
        parts.append(data)
    else:
        parts.append(_encoder.encode(data))
    if prompt_id is not None:
        parts.append(b',"promptId":')
        parts.append(_encoder.encode(prompt_id))
    if originator is not None:
        parts.append(b',"originatorClientId":')
        parts.append(_encoder.encode(originator))
    meta_obj = {"serverTimestamp": _now_ms(), **(meta or {})}
    parts.append(b',"_meta":')
    parts.append(_encoder.encode(meta_obj))
    parts.append(b"}")
    return parts


def encode_envelope(
    event_id: int | None,
    event_type: str,
    data: object,
    *,
    prompt_id: str | None = None,
    originator: str | None = None,
    meta: dict[str, Any] | None = None,
) -> bytes:
    """The envelope JSON ``{id?, v, type, data, promptId?, originatorClientId?, _meta}``.

    ``data`` may be ``msgspec.Raw`` or :class:`RawParts` (agent bytes relayed untouched) or
    any encodable value.
    """
    return b"".join(
        _envelope_parts(
            event_id, event_type, data, prompt_id=prompt_id, originator=originator, meta=meta
        )
    )


def _frame_head(event_id: int | None, event_type: str) -> bytes:
    head = b"id: %d\n" % event_id if event_id is not None else b""
    return head + b"event: " + event_type.encode() + b"\ndata: "


def sse_frame(event_id: int | None, event_type: str, envelope: bytes) -> bytes:
    return _frame_head(event_id, event_type) + envelope + b"\n\n"


def build_frame(
    event_id: int | None,
    event_type: str,
    data: object,
    *,
    prompt_id: str | None = None,
    originator: str | None = None,
) -> bytes:
    """The complete SSE frame in one ``join`` (the only copy of a large ``data``)."""
    parts = _envelope_parts(event_id, event_type, data, prompt_id=prompt_id, originator=originator)
    parts.insert(0, _frame_head(event_id, event_type))
    parts.append(b"\n\n")
    return b"".join(parts)


def synthetic(event_type: str, data: dict[str, Any]) -> bytes:
    """A frame without an id (stream lifecycle: warnings, evictions, replay markers)."""
    return sse_frame(None, event_type, encode_envelope(None, event_type, data))


class EventLog:
    """One session's log. See the module docstring."""

    def __init__(
        self,
        session_id: str,
        *,
        ring_size: int = 8000,
        ring_bytes: int = DEFAULT_RING_BYTES,
        epoch: str | None = None,
        next_id: int = 1,
        sink: Sink | None = None,
    ) -> None:
        self.session_id = session_id
        self.ring_size = ring_size
        self.ring_bytes = ring_bytes
        self.epoch = epoch or str(uuid.uuid4())
        self.next_id = next_id
        self._frames: list[bytes | None] = [None] * ring_size
        self._sizes: list[int] = [0] * ring_size
        self._starts: list[int] = [0] * ring_size  # bytes_published before each frame
        # Lowest id stored in this incarnation of the ring, raised by byte evictions.
        self._lowest = next_id
        self.held_bytes = 0  # bytes of the frames in the ring (<= ring_bytes + newest frame)
        self.bytes_published = 0  # running total, for byte pressure (see max_pressure)
        self.byte_evictions = 0  # frames evicted by the byte bound
        self._wake = trio.Event()
        self._drained = trio.Event()
        self._closed = False
        self.subscribers: set[Subscriber] = set()
        self.sink = sink
        self.tap: Tap | None = None
        self.published = 0
        self.evictions = 0
        self.warnings = 0

    # ---- publishing --------------------------------------------------------------------

    @property
    def last_id(self) -> int:
        return self.next_id - 1

    @property
    def first_id(self) -> int | None:
        """Oldest id still in the ring, or None when the ring is empty."""
        if self.next_id == self._lowest:
            return None
        return max(self._lowest, self.next_id - self.ring_size)

    @property
    def closed(self) -> bool:
        return self._closed

    def publish(
        self,
        event_type: str,
        data: object,
        *,
        prompt_id: str | None = None,
        originator: str | None = None,
    ) -> int | None:
        """Append one event; returns its id (None when the log is closed or unencodable)."""
        if self._closed:
            return None
        event_id = self.next_id
        try:
            frame = build_frame(
                event_id, event_type, data, prompt_id=prompt_id, originator=originator
            )
        except (TypeError, msgspec.EncodeError):
            return None
        self.next_id = event_id + 1
        self._store(event_id, frame)
        self.published += 1
        if self.sink is not None:
            self.sink(event_id, event_type, frame)
        if self.tap is not None:
            self.tap(self.session_id, event_id, event_type, frame)
        self._wake.set()
        return event_id

    def restore(self, event_id: int, frame: bytes) -> None:
        """Put an already-encoded frame back (journal replay after a daemon restart)."""
        if event_id < self.next_id:
            return
        if self.next_id == self._lowest:
            self._lowest = event_id
        self.next_id = event_id + 1
        self._store(event_id, frame)

    def _store(self, event_id: int, frame: bytes) -> None:
        """Put ``frame`` in its slot, then evict the oldest frames past ``ring_bytes``."""
        size = self.ring_size
        slot = event_id % size
        self.held_bytes += len(frame) - self._sizes[slot]  # the slot's old frame is gone
        self._frames[slot] = frame
        self._sizes[slot] = len(frame)
        self._starts[slot] = self.bytes_published
        self.bytes_published += len(frame)
        if self.held_bytes <= self.ring_bytes:
            return
        oldest = max(self._lowest, event_id + 1 - size)
        while self.held_bytes > self.ring_bytes and oldest < event_id:
            old = oldest % size
            self.held_bytes -= self._sizes[old]
            self._sizes[old] = 0
            self._frames[old] = None
            self.byte_evictions += 1
            oldest += 1
        self._lowest = oldest

    def close(self) -> None:
        """No more events; subscribers drain what is left and end."""
        self._closed = True
        self._wake.set()

    # ---- flow control ------------------------------------------------------------------

    def max_pressure(self, incoming_bytes: int = 0) -> float:
        """Highest pressure among subscribers busy writing (0.0 if none), in [0, 1].

        Two measures, the worse counts: frames published since the subscriber last took a
        batch over its ``max_queued``, and bytes of the frames it has not taken yet over
        ``ring_bytes`` (capped at 1.0: one frame larger than the ring is pressure enough,
        the next publish would evict it). A subscriber busy writing that is already past
        its ``max_queued``, or whose cursor left the ring, is evicted here and now: its
        writer may be blocked on a socket nobody reads, which would hold the stream (and
        its connection slot) until that write returned; it must not slow the session for
        everyone either. Its writer gets the ``client_evicted`` frame if it comes back,
        and ``--writer-idle-timeout-ms`` cuts the socket if it does not."""
        head = self.next_id
        first = self.first_id
        published = self.bytes_published
        ring_bytes = self.ring_bytes
        size = self.ring_size
        starts = self._starts
        worst = 0.0
        stalled: list[Subscriber] = []
        for sub in self.subscribers:
            if sub._parked:
                continue
            ratio = (head - sub._mark) / sub.max_queued
            if ratio > 1.0:
                stalled.append(sub)
                continue
            cursor = sub.cursor
            if cursor < head and first is not None:
                if cursor < first:
                    stalled.append(sub)
                    continue
                pending = published - starts[cursor % size] + incoming_bytes
                ratio = max(ratio, min(1.0, pending / ring_bytes))
            if ratio > worst:
                worst = ratio
        for sub in stalled:
            sub._final = sub.evict("queue_overflow")
        return worst

    async def wait_drained(
        self, threshold: float = 0.5, max_wait_s: float = 0.25, *, incoming_bytes: int = 0
    ) -> None:
        """Pace the publisher: wait (at most ``max_wait_s``) while a subscriber that is
        busy writing has more than ``threshold`` of its ``max_queued`` pending.

        Called by the agent reader between chunks: a reader that keeps up is never
        evicted because the agent outran the daemon's own scheduling, while a stuck
        one costs the publisher at most ``max_wait_s`` per chunk until it is evicted.
        O(subscribers) per chunk read from the agent, never per event.
        """
        if not self.subscribers or self.max_pressure(incoming_bytes) <= threshold:
            return
        with trio.move_on_after(max_wait_s):
            while self.max_pressure(incoming_bytes) > threshold:
                if self._drained.is_set():
                    self._drained = trio.Event()
                await self._drained.wait()

    def frame(self, event_id: int) -> bytes | None:
        first = self.first_id
        if first is None or event_id < first or event_id >= self.next_id:
            return None
        return self._frames[event_id % self.ring_size]

    def _take_wake(self) -> trio.Event:
        if self._wake.is_set() and not self._closed:
            self._wake = trio.Event()
        return self._wake

    # ---- subscribing -------------------------------------------------------------------

    def subscribe(
        self,
        *,
        last_event_id: int | None = None,
        epoch: str | None = None,
        max_queued: int = DEFAULT_MAX_QUEUED,
        snapshot: dict[str, Any] | None = None,
    ) -> Subscriber:
        """Register a cursor; replay is computed now, so nothing slips between.

        ``snapshot``: the data of a ``session_snapshot`` frame sent after the replay
        (``?snapshot=1``), before live events."""
        if len(self.subscribers) >= MAX_SUBSCRIBERS:
            raise SubscriberLimitExceeded(MAX_SUBSCRIBERS)
        sub = Subscriber(self, max_queued)
        sub._pending = self._replay_frames(last_event_id, epoch)
        if snapshot is not None:
            sub._pending.append(synthetic("session_snapshot", snapshot))
        sub.cursor = self.next_id
        self.subscribers.add(sub)
        return sub

    def _replay_frames(self, last: int | None, epoch: str | None) -> list[bytes]:
        if last is None:
            return []
        frames: list[bytes] = []
        first = self.first_id
        start = last + 1
        if (epoch is not None and epoch != self.epoch) or last >= self.next_id:
            data: dict[str, Any] = {"reason": "epoch_reset"}
            if epoch is not None and epoch != self.epoch:
                data["detail"] = "epoch_mismatch"
            data.update(lastDeliveredId=last, earliestAvailableId=first or self.next_id)
            frames.append(synthetic("state_resync_required", data))
            start = first or self.next_id
        elif first is None:
            if last < self.next_id - 1:
                frames.append(
                    synthetic(
                        "state_resync_required",
                        {
                            "reason": "seeded_replay_not_in_ring",
                            "lastDeliveredId": last,
                            "earliestAvailableId": self.next_id,
                        },
                    )
                )
        elif first > start:
            frames.append(
                synthetic(
                    "state_resync_required",
                    {
                        "reason": "ring_evicted",
                        "lastDeliveredId": last,
                        "earliestAvailableId": first,
                    },
                )
            )
            start = first
        replayed = 0
        budget = 0
        last_replayed: int | None = None
        event_id = max(start, first or self.next_id)
        while event_id < self.next_id:
            frame = self._frames[event_id % self.ring_size]
            assert frame is not None
            if replayed and budget + len(frame) > REPLAY_BUDGET_BYTES:
                frames.append(
                    synthetic(
                        "state_resync_required",
                        {
                            "reason": "replay_budget_exceeded",
                            "lastDeliveredId": last_replayed if last_replayed is not None else last,
                            "earliestAvailableId": event_id,
                        },
                    )
                )
                break
            frames.append(frame)
            budget += len(frame)
            replayed += 1
            last_replayed = event_id
            event_id += 1
        done: dict[str, Any] = {"replayedCount": replayed}
        if last_replayed is not None:
            done["lastReplayedEventId"] = last_replayed
            done["lastEventId"] = last_replayed
        frames.append(synthetic("replay_complete", done))
        return frames

    def statistics(self) -> dict[str, Any]:
        return {
            "lastEventId": self.last_id,
            "epoch": self.epoch,
            "ringSize": self.ring_size,
            "ringBytes": self.ring_bytes,
            "heldBytes": self.held_bytes,
            "byteEvictions": self.byte_evictions,
            "subscribers": len(self.subscribers),
            "published": self.published,
            "evictions": self.evictions,
            "slowClientWarnings": self.warnings,
        }


class Subscriber:
    """A cursor over an :class:`EventLog`; one per SSE connection.

    Overflow is judged on *pressure*: frames that arrived while this subscriber was away
    writing its previous chunk. Frames that arrived while it was parked, caught up and
    waiting, are backlog it has not had a chance to read yet, not slowness, so a burst
    published in one scheduling round never evicts a reader that keeps up; the backlog is
    handed over in batches of :data:`MAX_BATCH_FRAMES`. A cursor that falls out of the
    ring is evicted whatever the pressure.
    """

    def __init__(self, log: EventLog, max_queued: int) -> None:
        self.log = log
        self.max_queued = max_queued
        self.cursor = log.next_id
        self._mark = log.next_id
        self._pending: list[bytes] = []
        self._warned = False
        self._done = False
        self._parked = False
        self._final: bytes | None = None  # the eviction frame for a writer evicted away
        self.sent_frames = 0
        #: Called once when the subscriber ends (closed, evicted, or drained to the end):
        #: the stream's owner releases what it counts for the stream there.
        self.on_close: Callable[[], None] | None = None

    @property
    def lag(self) -> int:
        return self.log.next_id - self.cursor

    @property
    def finished(self) -> bool:
        return self._done

    def close(self) -> None:
        self._done = True
        self.log.subscribers.discard(self)
        self.log._drained.set()
        on_close, self.on_close = self.on_close, None
        if on_close is not None:
            on_close()

    def evict(self, reason: str, **extra: object) -> bytes:
        """Terminal ``client_evicted`` frame; the subscriber is finished afterwards."""
        self.log.evictions += 1
        frame = synthetic(
            "client_evicted",
            {
                "reason": reason,
                "droppedAfter": self.cursor - 1,
                "queueSize": self.lag,
                "maxQueued": self.max_queued,
                **extra,
            },
        )
        self.close()
        return frame

    def take_nowait(self) -> bytes | None:
        """Everything available now (b"" when nothing); None when the stream is over."""
        out = self.frames_nowait()
        if out is None:
            return None
        return out[0] if len(out) == 1 else b"".join(out)

    def frames_nowait(self) -> list[bytes] | None:
        """As :meth:`take_nowait`, frame by frame: the ring's own ``bytes`` objects, shared
        with every other reader (nothing is copied); None when the stream is over."""
        if self._done:
            final, self._final = self._final, None
            return None if final is None else [final]
        log = self.log
        out = self._pending
        self._pending = []
        head = log.next_id
        backlog = head - self.cursor
        pressure = head - self._mark
        first = log.first_id
        if pressure > self.max_queued or (backlog and first is not None and self.cursor < first):
            out.append(self.evict("queue_overflow"))
            return out
        if not self._warned and pressure >= self.max_queued * 0.75:
            self._warned = True
            log.warnings += 1
            out.append(
                synthetic(
                    "slow_client_warning",
                    {
                        "queueSize": pressure,
                        "maxQueued": self.max_queued,
                        "lastEventId": log.last_id,
                        "threshold": "frames",
                    },
                )
            )
        elif self._warned and pressure <= self.max_queued * 0.375:
            self._warned = False
        if backlog:
            end = min(head, self.cursor + MAX_BATCH_FRAMES)
            size = log.ring_size
            frames = log._frames
            for event_id in range(self.cursor, end):
                frame = frames[event_id % size]
                assert frame is not None
                out.append(frame)
            self.sent_frames += end - self.cursor
            self.cursor = end
        self._mark = head
        log._drained.set()
        if not out and log.closed and self.cursor >= head:
            self.close()
            return None
        return out

    async def next_chunk(self, timeout_s: float = float("inf")) -> bytes | None:
        """Wait for frames; b"" on timeout (time for a heartbeat); None at the end."""
        frames = await self.next_frames(timeout_s)
        if frames is None:
            return None
        return frames[0] if len(frames) == 1 else b"".join(frames)

    async def next_frames(self, timeout_s: float = float("inf")) -> list[bytes] | None:
        """:meth:`next_chunk` frame by frame (see :meth:`frames_nowait`); [] on timeout."""
        with trio.move_on_after(timeout_s):
            while True:
                wake = self.log._take_wake()
                frames = self.frames_nowait()
                if frames is None or frames:
                    return frames
                self._parked = True
                try:
                    await wake.wait()
                finally:
                    self._parked = False
                # Parked and caught up: what arrived meanwhile is backlog, not pressure.
                self._mark = self.log.next_id
        return []
