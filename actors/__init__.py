"""The actor runtime: bounded-inbox actors and OTP-style supervisors on trio.

Knows nothing of HTTP or ACP. Public surface:

* :class:`Actor` with ``tell`` / ``tell_nowait`` / ``ask`` and a ``run()`` loop, and
  :class:`Mailbox`, what a sender needs of one;
* :class:`Supervisor`, :class:`ChildSpec`, :class:`Restart`, :class:`SupervisorEvent`;
* the error tree rooted at :class:`ActorError`, plus :class:`Crash`.
"""

from actors.actor import Actor, Mailbox, Reply
from actors.errors import (
    ActorCrashed,
    ActorError,
    ActorStopped,
    AskTimeout,
    Crash,
    InboxFull,
    SupervisorGaveUp,
)
from actors.supervisor import (
    ChildSpec,
    EventKind,
    Restart,
    RestartWindow,
    Supervisor,
    SupervisorEvent,
    unwrap_group,
)

__all__ = [
    "Actor",
    "ActorCrashed",
    "ActorError",
    "ActorStopped",
    "AskTimeout",
    "ChildSpec",
    "Crash",
    "EventKind",
    "InboxFull",
    "Mailbox",
    "Reply",
    "Restart",
    "RestartWindow",
    "Supervisor",
    "SupervisorEvent",
    "SupervisorGaveUp",
    "unwrap_group",
]
