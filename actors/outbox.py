"""The Outbox: an actor's ordered, bounded, never-blocking mail to other actors.

Theory of operation
-------------------
An actor that tells other actors things from inside its handler (the permission mediator
asking a session to publish an event) may neither wait on the destination's inbox (two
actors asking each other deadlock; a wedged destination would wedge the sender) nor
reorder its messages. ``Outbox.post(dest, msg)`` returns at once with a :class:`Reply`
that completes once ``dest`` has *handled* ``msg`` (the handler's answer, or its error):
the hook a sender uses to act only after its message took effect (the mediator answers
an agent only once ``permission_resolved`` is in the session's log).

The fast path is ``dest.post(msg)``: straight into the destination's bounded inbox. When
that inbox is full the message *spills* into a per-destination FIFO, and every later
message for that destination follows it there until the FIFO drains, so order is kept.
One courier task per spilled destination (in the nursery given to :meth:`Outbox.bind`,
the sender's own) delivers the FIFO in order with ``await dest.ask(msg)``.

Bounds and failure: a spill FIFO holds at most ``limit`` messages; a message posted to a
full FIFO is dropped, counted (``dropped``) and logged once per spill, its Reply failed
with :class:`InboxFull`. One spilled delivery waits at most ``ask_timeout_s``; after that
the message still sits in the destination's inbox (handled late, in order) and the courier
moves on. A destination that stopped gets nothing more (Replies fail with its
``ActorError``). Without a bound nursery a full inbox drops at once. Everything runs on
the trio thread.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

import trio

from actors.actor import Mailbox, Reply
from actors.errors import ActorError, AskTimeout, InboxFull

log = logging.getLogger(__name__)

#: Messages spilled per destination before new ones are dropped.
DEFAULT_LIMIT = 4096
#: Seconds one spilled delivery may wait for the destination to handle it.
DEFAULT_ASK_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class _Item:
    """One spilled message: its delivery (``dest.ask(msg)``, bound when it was posted, so
    a FIFO needs no type of its destination's messages), its Reply and its kind (for logs)."""

    deliver: Callable[[], Awaitable[object]]
    reply: Reply[object]
    kind: str


class Outbox:
    """Ordered, bounded mail to other actors (see the module docstring)."""

    def __init__(
        self,
        name: str,
        *,
        limit: int = DEFAULT_LIMIT,
        ask_timeout_s: float = DEFAULT_ASK_TIMEOUT_S,
    ) -> None:
        if limit <= 0 or ask_timeout_s <= 0:
            raise ValueError("Outbox bounds must be positive")
        self.name = name
        self.limit = limit
        self.ask_timeout_s = ask_timeout_s
        self._nursery: trio.Nursery | None = None
        # Keyed by the destination actor itself (by identity).
        self._spilled: dict[object, deque[_Item]] = {}
        self._warned: set[object] = set()
        self.dropped = 0
        self.spills = 0

    def bind(self, nursery: trio.Nursery | None) -> None:
        """Couriers run in ``nursery`` (None: unbound; a full inbox then drops)."""
        self._nursery = nursery

    def spilled(self) -> int:
        """Messages waiting in spill FIFOs (for status pages)."""
        return sum(len(q) for q in self._spilled.values())

    def post[M](self, dest: Mailbox[M], msg: M) -> Reply[object]:
        """Send ``msg`` to ``dest`` behind everything posted to it before; never blocks."""
        queue = self._spilled.get(dest)
        if queue is None:
            try:
                return dest.post(msg)
            except InboxFull:
                queue = self._spill(dest)
            except ActorError as exc:
                return _failed(exc)
            if queue is None:
                self.dropped += 1
                log.warning("%s: %s's inbox is full; dropped %s", self.name, dest.name, _kind(msg))
                return _failed(InboxFull(dest.name, dest.inbox_size))
        reply: Reply[object] = Reply()
        if len(queue) >= self.limit:
            self.dropped += 1
            if dest not in self._warned:
                self._warned.add(dest)
                log.warning(
                    "%s: %d messages spilled for %s (the limit); dropping %s",
                    self.name,
                    len(queue),
                    dest.name,
                    _kind(msg),
                )
            reply.fail(InboxFull(dest.name, dest.inbox_size))
            return reply
        deliver = partial(dest.ask, msg, timeout_s=self.ask_timeout_s)
        queue.append(_Item(deliver, reply, _kind(msg)))
        return reply

    def _spill[M](self, dest: Mailbox[M]) -> deque[_Item] | None:
        if self._nursery is None:
            return None
        queue: deque[_Item] = deque()
        try:
            self._nursery.start_soon(self._courier, dest, queue, name=f"outbox-{self.name}")
        except RuntimeError:  # the nursery is closing
            return None
        self._spilled[dest] = queue
        self.spills += 1
        return queue

    async def _courier[M](self, dest: Mailbox[M], queue: deque[_Item]) -> None:
        try:
            while queue:
                item = queue[0]
                reply = item.reply
                try:
                    reply.set(await item.deliver())
                except AskTimeout as exc:
                    log.warning("%s: %s slow to handle %s", self.name, dest.name, item.kind)
                    reply.fail(exc)
                except ActorError as exc:
                    self._fail_all(queue, exc)
                    return
                except Exception as exc:  # the destination's handler refused it
                    reply.fail(exc)
                queue.popleft()
        finally:
            if self._spilled.get(dest) is queue:
                del self._spilled[dest]
            self._warned.discard(dest)
            self._fail_all(queue, ActorError(f"{self.name} stopped before delivering"))

    def _fail_all(self, queue: deque[_Item], error: BaseException) -> None:
        while queue:
            item = queue.popleft()
            self.dropped += 1
            item.reply.fail(error)


def _failed(error: BaseException) -> Reply[object]:
    reply: Reply[object] = Reply()
    reply.fail(error)
    return reply


def _kind(msg: object) -> str:
    return getattr(msg, "event_type", None) or type(msg).__name__
