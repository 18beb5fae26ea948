"""Exceptions of the actor runtime.

The tree says who failed (the trio convention of ``ClosedResourceError`` vs
``BrokenResourceError``)::

    ActorError
    ├── ActorStopped      the actor is gone (stopped, or crashed and not restarted);
    │                     an ask or tell can no longer be delivered
    ├── ActorCrashed      the actor crashed while handling *your* ask (cause chained)
    ├── AskTimeout        no reply within the caller's timeout
    ├── InboxFull         ``tell_nowait`` found the bounded inbox full
    └── SupervisorGaveUp  restart intensity exceeded; the supervisor failed

``Crash`` is not an ``ActorError``: a handler raises it (or a subclass) to say "this
actor's state is broken, stop me", which the supervisor then sees as an abnormal exit.
Any other exception raised while handling an ask is returned to the asking caller as-is
and the actor keeps running.
"""

from __future__ import annotations


class ActorError(Exception):
    """Base of every error the runtime itself raises."""


class ActorStopped(ActorError):
    """The actor is not running and will not handle the message."""

    def __init__(self, actor: str, detail: str = "stopped") -> None:
        super().__init__(f"actor {actor!r} {detail}")
        self.actor = actor


class ActorCrashed(ActorError):
    """The actor crashed while it was handling this caller's ask."""

    def __init__(self, actor: str, cause: BaseException) -> None:
        super().__init__(f"actor {actor!r} crashed: {cause!r}")
        self.actor = actor
        self.__cause__ = cause


class AskTimeout(ActorError):
    """The actor did not reply within the caller's deadline."""

    def __init__(self, actor: str, message: str, timeout_s: float) -> None:
        super().__init__(f"actor {actor!r} did not answer {message} within {timeout_s:g} s")
        self.actor = actor
        self.timeout_s = timeout_s


class InboxFull(ActorError):
    """A non-blocking tell found the actor's bounded inbox full."""

    def __init__(self, actor: str, capacity: int) -> None:
        super().__init__(f"inbox of actor {actor!r} is full ({capacity} messages)")
        self.actor = actor
        self.capacity = capacity


class SupervisorGaveUp(ActorError):
    """More restarts than the intensity allows happened within the period."""

    def __init__(self, supervisor: str, child: str, restarts: int, period_s: float) -> None:
        super().__init__(
            f"supervisor {supervisor!r} gave up: child {child!r} needed more than "
            f"{restarts} restarts in {period_s:g} s"
        )
        self.supervisor = supervisor
        self.child = child


class Crash(Exception):
    """Raised by a handler to crash its actor on purpose (state is unrecoverable)."""
