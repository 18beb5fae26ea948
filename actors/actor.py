"""The actor: a bounded inbox, one ``run()`` loop, ``tell`` and ``ask``.

Theory of operation
-------------------
An :class:`Actor` owns a trio memory channel (its inbox, bounded to ``inbox_size``
messages) and handles one message at a time in :meth:`Actor.run`. Messages are frozen
``msgspec.Struct`` values; the envelope around each one carries an optional one-shot
:class:`Reply` slot.

* ``tell(msg)`` enqueues and returns; it waits while the inbox is full (back-pressure).
  ``tell_nowait`` raises :class:`InboxFull` instead.
* ``post(msg)`` enqueues at once with a reply slot and returns the :class:`Reply` (raises
  :class:`InboxFull` when full): the sender learns later, if it wants, that the message was
  handled, without ever waiting on the inbox (an actor telling another from its handler).
* ``ask(msg, timeout_s=...)`` enqueues with a reply slot and waits for the answer. The
  handler's return value is the answer. A message that declares its reply type (a
  :class:`Request` ``[R]``: ``class Describe(msgspec.Struct, Request[SessionView])``) is
  answered, for the type checker, with an ``R``; other messages with an ``object`` (a
  caller that needs the answer's type declares it on the message).
  An exception raised by the handler is re-raised in the caller (the same object, so
  callers catch their own domain types) and the actor keeps running. If the handler raises
  :class:`Crash` (or a ``BaseException`` other than cancellation), the actor stops: the
  asking caller gets :class:`ActorCrashed` and the exception propagates out of ``run()``
  for the supervisor to classify.
* The inbox outlives a single ``run()``: when a supervisor restarts the actor, messages
  queued during the crash are handled by the new incarnation, and references held by
  callers stay valid. :meth:`close` ends the actor for good; queued and later asks then
  fail with :class:`ActorStopped`.

Memory: the loop keeps no reference to a message once it is handled (nor to its answer).

Ownership and cancellation: ``run()`` is the only task that receives from the inbox and
must run in a nursery owned by a supervisor. Cancelling ``run()`` fails the in-flight ask
with :class:`ActorStopped` and leaves queued messages for the next incarnation. An asking
caller that is cancelled (or times out) simply abandons its slot; a late answer is dropped.
"""

from __future__ import annotations

import logging
from typing import Protocol, cast, overload

import trio

from actors.errors import ActorCrashed, ActorStopped, AskTimeout, Crash, InboxFull

log = logging.getLogger(__name__)


class Request[R]:
    """A mixin for a message that declares the type ``R`` of its answer: ``await
    actor.ask(msg)`` is an ``R`` to the type checker (the handler must answer one)."""

    __slots__ = ()


class Reply[T]:
    """A one-shot reply slot: set (or failed) once, awaited by whoever holds it.

    The ask/answer primitive of the runtime, also used by actors whose answer comes from
    a task they spawned (the answer arrives after the handler returned)."""

    __slots__ = ("_error", "_event", "_value")

    _value: T  # set before the event fires, unless it failed

    def __init__(self) -> None:
        self._event = trio.Event()
        self._error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self._event.is_set()

    def set(self, value: T) -> None:
        if not self._event.is_set():
            self._value = value
            self._event.set()

    def fail(self, error: BaseException) -> None:
        if not self._event.is_set():
            self._error = error
            self._event.set()

    async def wait(self) -> T:
        await self._event.wait()
        if self._error is not None:
            raise self._error
        return self._value


class Mailbox[M](Protocol):
    """What a sender needs of an actor that takes ``M`` among its messages: an
    ``Actor[SessionMsg]`` is a ``Mailbox[PublishEvent]`` to a party that only ever sends it
    a ``PublishEvent`` (``M`` is contravariant: an actor that takes more takes this one)."""

    @property
    def name(self) -> str: ...

    @property
    def inbox_size(self) -> int: ...

    def post(self, msg: M) -> Reply[object]: ...

    async def ask(self, msg: M, *, timeout_s: float = 30.0) -> object: ...


class _Envelope[M]:
    __slots__ = ("msg", "reply")

    def __init__(self, msg: M, reply: Reply[object] | None) -> None:
        self.msg = msg
        self.reply = reply


class Actor[M]:
    """Base class of every actor. Subclasses implement :meth:`handle`.

    ``on_start`` runs at the beginning of every incarnation (first start and each
    restart) before readiness is reported; ``on_stop`` runs when ``run()`` leaves for any
    reason, inside a shielded scope, and must be quick and bounded.
    """

    def __init__(self, name: str, *, inbox_size: int = 64) -> None:
        self.name = name
        self.inbox_size = inbox_size
        self._send, self._recv = trio.open_memory_channel[_Envelope[M]](inbox_size)
        self._closed = False
        self.handled = 0

    # ---- subclass hooks ----------------------------------------------------------------

    async def on_start(self) -> None:
        """Prepare state for a new incarnation."""

    async def handle(self, msg: M) -> object:
        """Handle one message; the return value answers an ask (for a :class:`Request`
        ``[R]``, an ``R``)."""
        raise NotImplementedError

    async def on_stop(self) -> None:
        """Release resources; runs shielded when ``run()`` exits."""

    # ---- the loop ----------------------------------------------------------------------

    async def run(
        self, *, task_status: trio.TaskStatus[Actor[M]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve the inbox until :meth:`close` is called or a handler crashes."""
        current: _Envelope[M] | None = None
        try:
            await self.on_start()
            task_status.started(self)
            async for envelope in self._recv:
                current = envelope
                await self._dispatch(envelope)
                # Drop the message (and its answer) now: a loop local would keep the last
                # one, and all it refers to, alive until the next message arrives.
                current = None
                del envelope
        except BaseException as exc:
            if current is not None and current.reply is not None:
                if isinstance(exc, trio.Cancelled):
                    current.reply.fail(ActorStopped(self.name, "was stopped while handling"))
                else:
                    current.reply.fail(ActorCrashed(self.name, exc))
            raise
        finally:
            with trio.CancelScope(shield=True):
                await self.on_stop()
            if self._closed:
                self._fail_queued()

    async def _dispatch(self, envelope: _Envelope[M]) -> None:
        self.handled += 1
        reply = envelope.reply
        if reply is None:
            try:
                await self.handle(envelope.msg)
            except Crash:
                raise
            except Exception:
                # A tell has nobody to answer: log it, keep the actor alive.
                log.exception("actor %s failed handling %s", self.name, type(envelope.msg).__name__)
            return
        try:
            result = await self.handle(envelope.msg)
        except Crash:
            raise
        except Exception as exc:
            reply.fail(exc)
        else:
            reply.set(result)

    def _fail_queued(self) -> None:
        while True:
            try:
                envelope = self._recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return
            if envelope.reply is not None:
                envelope.reply.fail(ActorStopped(self.name))

    # ---- the public surface ------------------------------------------------------------

    async def tell(self, msg: M) -> None:
        """Enqueue ``msg``, waiting while the inbox is full."""
        try:
            await self._send.send(_Envelope(msg, None))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise ActorStopped(self.name) from None

    def tell_nowait(self, msg: M) -> None:
        """Enqueue ``msg`` or raise :class:`InboxFull` at once."""
        try:
            self._send.send_nowait(_Envelope(msg, None))
        except trio.WouldBlock:
            raise InboxFull(self.name, self.inbox_size) from None
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise ActorStopped(self.name) from None

    def post(self, msg: M) -> Reply[object]:
        """Enqueue ``msg`` with a reply slot at once (:class:`InboxFull` when full)."""
        reply: Reply[object] = Reply()
        try:
            self._send.send_nowait(_Envelope(msg, reply))
        except trio.WouldBlock:
            raise InboxFull(self.name, self.inbox_size) from None
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise ActorStopped(self.name) from None
        return reply

    @overload
    async def ask[R](self, msg: Request[R], *, timeout_s: float = 30.0) -> R: ...

    @overload
    async def ask(self, msg: M, *, timeout_s: float = 30.0) -> object: ...

    async def ask(self, msg: M | Request[object], *, timeout_s: float = 30.0) -> object:
        """Send ``msg`` and wait for the handler's answer (or its exception).

        ``timeout_s`` bounds the whole exchange, queueing included; ``math.inf`` waits
        forever. Raises :class:`AskTimeout`, :class:`ActorStopped`, :class:`ActorCrashed`
        or whatever the handler raised.
        """
        reply: Reply[object] = Reply()
        with trio.move_on_after(timeout_s) as scope:
            try:
                # A Request is one of the actor's messages: M names them all.
                await self._send.send(_Envelope(cast(M, msg), reply))
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                raise ActorStopped(self.name) from None
            return await reply.wait()
        assert scope.cancelled_caught
        raise AskTimeout(self.name, type(msg).__name__, timeout_s)

    def close(self) -> None:
        """End the actor for good: ``run()`` returns once the inbox is drained."""
        self._closed = True
        self._send.close()

    def reopen(self) -> None:
        """Make a closed actor runnable again, with a fresh, empty inbox: for a supervisor
        that restarts a long-lived service it had stopped (its parent gave up and is being
        restarted). Messages sent while it was closed were refused with
        :class:`ActorStopped`. Call it only when ``run()`` is not running."""
        if not self._closed:
            return
        self._recv.close()
        self._send, self._recv = trio.open_memory_channel[_Envelope[M]](self.inbox_size)
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def statistics(self) -> dict[str, int]:
        """Inbox fill level, for status pages."""
        stats = self._send.statistics()
        return {
            "queued": stats.current_buffer_used,
            "capacity": self.inbox_size,
            "handled": self.handled,
        }
