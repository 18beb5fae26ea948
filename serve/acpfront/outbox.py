"""A bounded, single-reader FIFO of encoded JSON-RPC messages (one per stream).

Each item is ``(event_id, payload)``: ``event_id`` is the session log's id for a
session-bus message (the SSE ``id:`` line, what ``Last-Event-ID`` resumes from) and None
for a JSON-RPC reply. A payload may be a :class:`~serve.acpfront.translate.Deferred` (the
log's shared frame; counted at the frame's size): :meth:`take` builds its message for the
reader, so a queued event costs the outbox no copy of its own. Bounds: :attr:`max_messages`
items and :attr:`max_bytes` payload bytes; :meth:`push` refuses past either (the owner
decides what to evict); a producer may first :meth:`wait_room` while a reader is attached
and draining. One reader at a time: :meth:`attach` hands out a new reader token and wakes
the previous reader, whose next :meth:`take` returns None (a second GET of a stream ends
the first). :meth:`end` lets the current reader drain what is left, then its ``take``
returns None."""

from __future__ import annotations

from collections import deque

import trio

from serve.acpfront.translate import Deferred

#: Default bounds of one outbox (messages; payload bytes).
DEFAULT_MAX_MESSAGES = 2048
DEFAULT_MAX_BYTES = 8 * 1024 * 1024

Item = tuple[int | None, bytes]
Queued = tuple[int | None, bytes | Deferred]


class Outbox:
    def __init__(
        self, *, max_messages: int = DEFAULT_MAX_MESSAGES, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._items: deque[Queued] = deque()
        self._bytes = 0
        self._wake = trio.Event()
        self._room = trio.Event()
        self._reader = 0
        self._tokens = 0
        self.ended = False
        self.readers_seen = 0
        #: The highest session-bus id handed to a reader (where a resume starts after an
        #: eviction when the client sends no ``Last-Event-ID``).
        self.last_taken: int | None = None

    def __len__(self) -> int:
        return len(self._items)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    @property
    def has_reader(self) -> bool:
        return self._reader != 0

    def has_room(self, size: int) -> bool:
        return len(self._items) < self.max_messages and self._bytes + size <= self.max_bytes

    async def wait_room(self, size: int) -> None:
        """Wait until ``size`` more bytes (one message) fit (the reader took a batch)."""
        while not self.has_room(size) and not self.ended:
            if self._room.is_set():
                self._room = trio.Event()
            await self._room.wait()

    def push(self, event_id: int | None, payload: bytes | Deferred) -> bool:
        """Append one message; False (nothing stored) when a bound would be exceeded."""
        if self.ended:
            return True  # nobody will read it; not an overflow
        if len(self._items) >= self.max_messages or self._bytes + len(payload) > self.max_bytes:
            return False
        self._items.append((event_id, payload))
        self._bytes += len(payload)
        self._wake.set()
        return True

    def drop_events(self) -> tuple[int, int | None]:
        """Remove every session-bus message (keep replies): how many were dropped, and the
        lowest dropped event id (None when none was)."""
        kept = deque(item for item in self._items if item[0] is None)
        ids = [item[0] for item in self._items if item[0] is not None]
        self._items = kept
        self._bytes = sum(len(p) for _, p in kept)
        return len(ids), (min(ids) if ids else None)

    def take_replies(self) -> list[bytes]:
        """Remove and return the queued replies (a resume re-queues them after its replay)."""
        replies = [p for event_id, p in self._items if event_id is None and isinstance(p, bytes)]
        self._items = deque(item for item in self._items if item[0] is not None)
        self._bytes = sum(len(p) for _, p in self._items)
        return replies

    def end(self) -> None:
        self.ended = True
        self._wake.set()
        self._room.set()

    def attach(self) -> int:
        self._tokens += 1
        self._reader = self._tokens
        self.readers_seen += 1
        self._wake.set()
        return self._reader

    def detach(self, token: int) -> None:
        if self._reader == token:
            self._reader = 0

    async def take(self, token: int, timeout_s: float) -> list[Item] | None:
        """Everything queued (``[]`` after ``timeout_s`` with nothing: time for a
        heartbeat); None when this reader was replaced or the outbox ended and is empty."""
        with trio.move_on_after(timeout_s):
            while True:
                if self._reader != token:
                    return None
                if self._items:
                    queued = list(self._items)
                    self._items.clear()
                    self._bytes = 0
                    self._room.set()
                    for event_id, _ in reversed(queued):
                        if event_id is not None:
                            self.last_taken = event_id
                            break
                    out: list[Item] = []
                    for event_id, payload in queued:
                        if isinstance(payload, Deferred):
                            payload = payload.render()
                            if not payload:
                                continue  # an unreadable frame (never one the log wrote)
                        out.append((event_id, payload))
                    return out
                if self.ended:
                    return None
                if self._wake.is_set():
                    self._wake = trio.Event()
                await self._wake.wait()
        return [] if self._reader == token else None
