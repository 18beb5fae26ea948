"""Reply routing and eviction: which outbox a message goes to, and what overflow does.

The HTTP transport has one connection stream plus one stream per owned session; the
WebSocket transport has one socket for everything. Replies to :data:`SESSION_REPLIES`
go to the session's outbox (the qwen SDK accepts them only from there); every other reply,
and every ownership error, to the connection's (:func:`reply`).

Inline replies (:class:`Inline`): the published qwen SDK's HTTP transport (``clientInfo.name``
:data:`INLINE_CLIENT`) registers the reply it waits for only once its POST's 202 has
arrived and silently drops a reply whose id it does not know yet. When the SDK's process
reads the 202 and an already-open stream in one wake-up (a busy machine, a GC pause), it
handles the stream first, drops the reply and fails 30 s later with ``TimeoutError`` (or,
for a prompt, never returns); no order of the daemon's writes prevents that. The SDK also
accepts the reply as the POST's own answer (200, ``application/json``), which cannot race:
its connections get every reply that way (:attr:`Connection.inline_replies`).

Overflow (:func:`push_session`): a connection outbox (or a WebSocket's) that overflows
ends the connection. A session outbox that overflows is *evicted*: its queued events are
dropped, an id-less ``_qwen/notify client_evicted`` is queued, and its pump stops;
reopening the stream resumes from ``Last-Event-ID`` (or from the first dropped event)
through the log's ring (:func:`serve.acpfront.links.session_outbox`).
"""

from __future__ import annotations

import logging

import trio

from serve.acpfront.connections import Connection, Connections, SessionLink
from serve.acpfront.translate import Deferred, notify

__all__ = ["INLINE_CLIENT", "SESSION_REPLIES", "Inline", "push_session", "reply", "reply_conn"]

log = logging.getLogger(__name__)

#: Replies routed to the session stream (the qwen SDK accepts these five only from there).
SESSION_REPLIES = frozenset(
    {
        "session/prompt",
        "session/cancel",
        "session/set_mode",
        "session/set_model",
        "session/set_config_option",
    }
)


#: The ``clientInfo.name`` of the published qwen SDK's transports (see Inline replies above).
INLINE_CLIENT = "qwen-code-sdk"


class Inline:
    """The reply of one request answered in its own HTTP POST: set once (the first reply
    wins), ``done`` also when the request ended without one (its connection closed)."""

    def __init__(self) -> None:
        self.payload: bytes | None = None
        self.done = trio.Event()

    def __call__(self, payload: bytes) -> None:
        if not self.done.is_set():
            self.payload = payload
            self.done.set()


def reply(
    front: Connections,
    conn: Connection,
    method: str,
    sid: object,
    payload: bytes,
    inline: Inline | None = None,
) -> None:
    """Queue the reply to a ``method`` request about session ``sid`` where it belongs
    (``inline``: the request's POST answers it)."""
    if (
        inline is None
        and conn.transport == "http"
        and method in SESSION_REPLIES
        and isinstance(sid, str)
    ):
        link = conn.sessions.get(sid)
        if link is not None and not link.outbox.ended:
            push_session(front, conn, link, None, payload)
            return
    reply_conn(front, conn, payload, inline)


def reply_conn(
    front: Connections, conn: Connection, payload: bytes, inline: Inline | None = None
) -> None:
    """Queue on the connection stream (``inline``: the POST answers it instead); an overflow
    ends the connection."""
    if inline is not None:
        inline(payload)
        return
    if not conn.outbox.push(None, payload):
        log.warning("ACP connection %s: outbox full, closing the connection", conn.id)
        front.evictions += 1
        front.close(conn)


def push_session(
    front: Connections,
    conn: Connection,
    link: SessionLink,
    event_id: int | None,
    payload: bytes | Deferred,
) -> bool:
    """Queue an event (``event_id``) or a reply (None) on ``link``'s stream; False when
    it did not fit (the stream was evicted, or the connection closed)."""
    outbox = link.outbox if conn.transport == "http" else conn.outbox
    if outbox.push(event_id, payload):
        if event_id is not None:
            link.last_pushed = event_id
        return True
    if conn.transport == "ws":
        front.evictions += 1
        front.close(conn)
        return False
    # Evict this session stream's queued events; the client resumes from the ring.
    front.evictions += 1
    dropped, lowest = outbox.drop_events()
    if event_id is not None and (lowest is None or event_id < lowest):
        lowest = event_id
    link.evicted = True
    link.resume_from = (lowest - 1) if lowest is not None else outbox.last_taken
    if link.pump_scope is not None:
        link.pump_scope.cancel()
    outbox.push(
        None,
        notify(
            "client_evicted",
            {
                "sessionId": link.session_id,
                "reason": "queue_overflow",
                "droppedAfter": link.resume_from,
                "dropped": dropped,
                "maxQueued": outbox.max_messages,
            },
        ),
    )
    if event_id is None:
        return outbox.push(None, payload)
    return False
