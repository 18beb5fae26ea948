"""The WorkspaceHub actor: workspace-wide events fanned out to every session, by message.

Theory of operation
-------------------
Some events concern a whole workspace, not one session: a client wrote a file
(``workspace_file_changed``), changed the memory or the settings (``memory_changed``,
``settings_changed``, ``settings_reloaded``), initialised the workspace or toggled a tool,
and the device-flow poller's ``auth_device_flow_*`` events (daemon-wide). Each live session
of the workspace must see them in its own event log, and a session's log has one writer,
its session actor. So the producers send the hub one :class:`Broadcast`; the hub looks up
the live sessions of the workspace (``sessions_for(workspace)``; ``None`` = every
workspace) and posts each a :class:`~serve.events.messages.PublishEvent` through its
:class:`~actors.outbox.Outbox`; with no live session there is nobody to tell and nothing is
stored (as before).

The reply to a ``Broadcast`` ask is a :class:`Fanout`: the per-session delivery Replies.
:meth:`WorkspaceHub.broadcast` (what the HTTP routes call) awaits them, bounded by
:data:`DELIVERY_WAIT_S`, so when a route answers its event is already in every responsive
session's log, as when the routes wrote the logs themselves. Fire-and-forget producers
(the device-flow poller, from inside its own handler) use :meth:`WorkspaceHub.tell_nowait`.

Bounds and failure: the inbox holds :data:`INBOX_SIZE` broadcasts (a full inbox refuses a
``tell_nowait``: the event is dropped with a log line; an ask waits, bounded). Per session,
delivery is ordered and never blocks the hub (the Outbox spills a full session inbox into
a bounded FIFO). A session that is closing simply does not get it. The hub holds no state
of its own besides the Outbox; a crash is restarted by the root supervisor with nothing
lost but the broadcasts in flight.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Final

import msgspec
import trio

from actors import Actor, ActorError, Mailbox, Reply
from actors.actor import Request
from actors.outbox import Outbox
from serve.events.messages import PublishEvent

log = logging.getLogger(__name__)

__all__ = [
    "DELIVERY_WAIT_S",
    "HUB_SERVICE",
    "INBOX_SIZE",
    "Broadcast",
    "Fanout",
    "WorkspaceHub",
]

#: The root supervisor's name for the hub.
HUB_SERVICE: Final = "workspace-hub"

#: Broadcasts queued in the hub's inbox.
INBOX_SIZE: Final = 1024
#: Seconds :meth:`WorkspaceHub.broadcast` waits for the sessions to have the event.
DELIVERY_WAIT_S: Final = 2.0
#: Seconds :meth:`WorkspaceHub.broadcast` waits for the hub itself.
ASK_TIMEOUT_S: Final = 5.0


class Broadcast(msgspec.Struct, Request["Fanout"], frozen=True):
    """Publish ``event_type``/``data`` on every live session of ``workspace`` (None: all)."""

    workspace: str | None
    event_type: str
    data: object  # the event's JSON body
    originator: str | None = None


class Fanout:
    """The deliveries of one broadcast (one Reply per session)."""

    __slots__ = ("replies",)

    def __init__(self, replies: Sequence[Reply[object]]) -> None:
        self.replies = tuple(replies)

    async def delivered(self, timeout_s: float = DELIVERY_WAIT_S) -> int:
        """How many sessions had the event in their log within ``timeout_s``."""
        count = 0
        with trio.move_on_after(timeout_s):
            for reply in self.replies:
                try:
                    if await reply.wait() is not None:
                        count += 1
                except Exception:  # gone, closing or dropped: not ours to report
                    pass
        return count


class WorkspaceHub(Actor[Broadcast]):
    """See the module docstring. ``sessions_for(workspace)`` lists live session actors."""

    def __init__(
        self, sessions_for: Callable[[str | None], Sequence[Mailbox[PublishEvent]]]
    ) -> None:
        super().__init__("workspace-hub", inbox_size=INBOX_SIZE)
        self._sessions_for = sessions_for
        self.outbox = Outbox("workspace-hub")

    async def run(
        self, *, task_status: trio.TaskStatus[Actor[Broadcast]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with trio.open_nursery() as nursery:
            self.outbox.bind(nursery)
            try:
                await super().run(task_status=task_status)
            finally:
                self.outbox.bind(None)
            nursery.cancel_scope.cancel()

    async def handle(self, msg: Broadcast) -> Fanout:
        event = PublishEvent(msg.event_type, msg.data, originator=msg.originator)
        try:
            sessions = list(self._sessions_for(msg.workspace))
        except Exception:
            log.exception("workspace hub: listing the sessions of %s failed", msg.workspace)
            sessions = []
        return Fanout([self.outbox.post(session, event) for session in sessions])

    async def broadcast(
        self, workspace: str | None, event_type: str, data: object, originator: str | None
    ) -> int:
        """Fan the event out and wait (bounded) until the sessions have it; how many do."""
        try:
            fanout: Fanout = await self.ask(
                Broadcast(workspace, event_type, data, originator), timeout_s=ASK_TIMEOUT_S
            )
        except ActorError as exc:
            log.warning("workspace hub unavailable; %s not published: %r", event_type, exc)
            return 0
        return await fanout.delivered()

    def statistics(self) -> dict[str, int]:
        return {**super().statistics(), "spilled": self.outbox.spilled()}
