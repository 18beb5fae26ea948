"""Sans-IO state of a resumable event stream: what to deliver, where to resume, when to wait.

Theory of operation
-------------------
:class:`StreamCursor` sees every decoded envelope of a session's stream, across any
number of connections, in order, and answers one :class:`Verdict` per envelope:

=========================================  ===========  ====================================
envelope                                   verdict      state change
=========================================  ===========  ====================================
stream already done                        ``SKIP``     —
``id`` ≤ last delivered id (a duplicate)   ``SKIP``     —
``id`` > last delivered id                 ``DELIVER``  last id := id
``session_closed`` / ``session_died``      ``STOP``     last id := id; done
``state_resync_required`` epoch_reset      ``DELIVER``  last id := None (the daemon replays
                                                        its whole ring: ids restart)
other synthetic frame (no id)              ``DELIVER``  —
=========================================  ===========  ====================================

``resume_headers()`` are the headers of the next connection: ``Last-Event-ID`` (the last
delivered id) and ``X-Qwen-Event-Epoch`` (the epoch the daemon named on the last
successful connection), so a reconnect replays exactly what was missed (spec §5.3), and
a daemon with a new epoch answers ``state_resync_required``. A stream that started live
(no id) and has delivered nothing resumes live.

:class:`Backoff` is the bounded reconnect schedule: ``base_s · 2^(n-1)`` capped at
``max_s`` and by the daemon's ``retry:`` hint, raised to a ``Retry-After`` when one was
given (bounded by ``max_s`` too), at most
``max_attempts`` consecutive failed attempts. A connection that yielded at least one
frame or comment resets the count.
"""

from __future__ import annotations

import enum

import msgspec

from serve.client.types import TERMINAL_EVENT_TYPES, Event

__all__ = ["Backoff", "StreamCursor", "Verdict"]


class Verdict(enum.Enum):
    DELIVER = "deliver"
    SKIP = "skip"
    STOP = "stop"  # deliver, then end the stream


class StreamCursor:
    """Delivery and resume state of one logical stream (see the module docstring)."""

    def __init__(self, last_event_id: int | None = None, epoch: str | None = None) -> None:
        self.last_event_id = last_event_id
        self.epoch = epoch
        self.done = False
        self.delivered = 0

    def connected(self, epoch: str | None) -> None:
        """A connection opened; ``epoch`` is its ``X-Qwen-Event-Epoch`` header."""
        if epoch:
            self.epoch = epoch

    def observe(self, event: Event) -> Verdict:
        if self.done:
            return Verdict.SKIP
        if event.id is not None:
            if self.last_event_id is not None and event.id <= self.last_event_id:
                return Verdict.SKIP
            self.last_event_id = event.id
        elif event.type == "state_resync_required" and event.data.get("reason") == "epoch_reset":
            self.last_event_id = None
        self.delivered += 1
        if event.type in TERMINAL_EVENT_TYPES:
            self.done = True
            return Verdict.STOP
        return Verdict.DELIVER

    def resume_headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        if self.last_event_id is not None:
            headers["Last-Event-ID"] = str(self.last_event_id)
            if self.epoch:
                headers["X-Qwen-Event-Epoch"] = self.epoch
        return headers


class Backoff(msgspec.Struct, frozen=True):
    """Reconnect schedule of an event stream (seconds)."""

    base_s: float = 0.1
    max_s: float = 5.0
    max_attempts: int = 8

    def delay(
        self, attempt: int, *, cap_s: float | None = None, floor_s: float | None = None
    ) -> float:
        """The wait before attempt number ``attempt`` (1-based) of a reconnect.

        ``cap_s`` is the daemon's SSE ``retry:`` hint (never wait longer than it asks),
        ``floor_s`` a ``Retry-After`` (never come back sooner than it asks); both are
        bounded by ``max_s``.
        """
        ceiling = self.max_s if cap_s is None else min(cap_s, self.max_s)
        delay = min(self.base_s * 2.0 ** max(attempt - 1, 0), ceiling)
        if floor_s is not None:
            delay = max(delay, min(floor_s, self.max_s))
        return delay

    def exhausted(self, attempt: int) -> bool:
        return attempt > self.max_attempts
