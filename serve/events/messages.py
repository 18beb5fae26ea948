"""Messages about a session's event log that other actors send to its owner.

A session's :class:`~serve.events.EventLog` has one writer, its session actor
(:mod:`serve.sessions.actor`). Everyone else — the permission mediator, the effect gate,
the MCP pool, the workspace hub (file / settings / memory routes, device flow) — sends the
session a :class:`PublishEvent` and the actor appends it. The type lives here, below both
``serve.sessions`` and the packages that send it, so neither imports the other.
"""

from __future__ import annotations

import msgspec

__all__ = ["PublishEvent"]


class PublishEvent(msgspec.Struct, frozen=True):
    """Another party's event for this session's log (the session actor is its only writer).

    The mediator, the MCP pool, the device-flow fan-out, the workspace routes and the effect
    gate send this instead of writing into ``session.log``; the reply is the event id (None
    when the log is closed or the event cannot be encoded).
    """

    event_type: str
    data: object
    prompt_id: str | None = None
    originator: str | None = None
