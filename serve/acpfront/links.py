"""Session links and their pumps: how a connection owns a session and streams its log.

A connection owns a session through a :class:`~serve.acpfront.connections.SessionLink`
(:func:`own`): it is a registered client of the session actor (``Attach`` → ``Attached``)
and a *pump* task (:func:`_pump`) reads the session's :class:`~serve.events.EventLog`
through the subscriber a ``Subscribe`` answered, exactly as ``GET /session/:id/events``
does (``StreamEnded`` when it stops), translating every frame (:mod:`.translate`) into the
session's outbox (:func:`serve.acpfront.routing.push_session`). Sessions are admitted
under :data:`~serve.acpfront.connections.MAX_SESSIONS` before one is made or restored
(:func:`reserve`); one made for a call that then cannot own it is closed again
(:func:`own_made`).

Backpressure: while a reader is attached and draining, a full outbox makes the pump wait
(at most :data:`~serve.acpfront.connections.WRITER_STALL_S`); otherwise the stream is
evicted (:mod:`.routing`) and :func:`session_outbox` resumes it from the ring.

Ending: a session stream that ends (``session/close``, ``_qwen/session/detach``, the
session's end) lets its registration go with ``Detach`` (:func:`finish_link`), which, as
on REST, closes an idle session whose last client that was. The reply to ``session/close``
and ``_qwen/session/detach`` (:class:`Replied`) is delivered *before* the session stream
ends (on the session stream for ACP clients; on the connection stream for the qwen SDK).

Nothing here reads a session's attributes: the view, the client id and the subscriber are
the actor's replies.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from actors import ActorError, ActorStopped, InboxFull
from serve.acpfront import access as acp_access
from serve.acpfront import jsonrpc
from serve.acpfront.connections import (
    ASK_TIMEOUT_S,
    MAX_SERVER_REQUESTS,
    MAX_SESSIONS,
    PUMP_MAX_QUEUED,
    WRITER_STALL_S,
    Connection,
    Connections,
    SessionLink,
    let_go,
)
from serve.acpfront.errors import (
    not_found,
    not_owned,
    params_error,
    session_limit,
    to_rpc,
)
from serve.acpfront.jsonrpc import RESOURCE_NOT_FOUND, RpcError
from serve.acpfront.outbox import Outbox
from serve.acpfront.routing import Inline, push_session, reply_conn
from serve.acpfront.translate import notify, translate_frame
from serve.events import Subscriber
from serve.sessions.actor import SessionActor
from serve.sessions.messages import (
    Attach,
    Attached,
    CloseSession,
    Describe,
    SessionGone,
    SessionView,
    StreamEnded,
    Subscribe,
    Subscription,
)

__all__ = [
    "Replied",
    "caught_up",
    "caught_up_now",
    "finish_link",
    "own",
    "own_made",
    "owned",
    "reserve",
    "session_outbox",
]

log = logging.getLogger(__name__)


def owned(conn: Connection, params: dict[str, Any]) -> SessionLink:
    """The link of the session ``params.sessionId`` names, which ``conn`` must own."""
    sid = params.get("sessionId")
    if not isinstance(sid, str) or not sid:
        raise params_error("`sessionId` must be a non-empty string")
    link = conn.sessions.get(sid)
    if link is None:
        raise not_owned(sid)
    if link.ended:
        raise not_found(sid)
    return link


def reserve(conn: Connection, session_id: str | None = None) -> int:
    """Admit one more owned session under :data:`MAX_SESSIONS` *before* anything is
    made or restored (1: a slot is reserved, the caller gives it back; 0: ``session_id``
    is owned already and needs none)."""
    existing = conn.sessions.get(session_id) if session_id is not None else None
    if existing is not None and not existing.ended:
        return 0
    owned_now = sum(1 for link in conn.sessions.values() if not link.ended)
    if owned_now + conn.reserved_sessions >= MAX_SESSIONS:
        raise session_limit(MAX_SESSIONS)
    conn.reserved_sessions += 1
    return 1


async def own(
    front: Connections, conn: Connection, session: SessionActor, *, replay: bool
) -> tuple[SessionLink, SessionView]:
    """Make ``conn`` a client of ``session`` and start its pump (idempotent); returns
    the link and the session's view as of now."""
    existing = next(
        (link for link in conn.sessions.values() if link.session is session and not link.ended),
        None,
    )
    if existing is not None:
        view: SessionView = await session.call(Describe(), timeout_s=ASK_TIMEOUT_S)
        return existing, view
    # Ended links stay until their stream is drained; drop the drained ones, and past
    # twice the limit the oldest ended ones (a client that never reads them).
    for key, old in list(conn.sessions.items()):
        if old.ended and old.outbox.ended and not len(old.outbox):
            del conn.sessions[key]
    ended = [key for key, old in conn.sessions.items() if old.ended]
    while ended and len(conn.sessions) >= 2 * MAX_SESSIONS:
        del conn.sessions[ended.pop(0)]
    if sum(1 for old in conn.sessions.values() if not old.ended) >= MAX_SESSIONS:
        raise session_limit(MAX_SESSIONS)
    voter = acp_access.may_vote(front.host, conn, session)
    who = conn.principal.id
    attach = Attach(None, None, voter, who)
    attached: Attached = await session.call(attach, timeout_s=ASK_TIMEOUT_S)
    outbox = Outbox(max_messages=conn.max_messages, max_bytes=conn.max_bytes)
    link = SessionLink(session, attached.client_id, outbox, attached.view, who)
    sid = link.session_id
    conn.sessions[sid] = link
    try:
        await start_pump(front, conn, link, 0 if replay else None, None)
    except BaseException:
        # No stream for it: the registration is let go again.
        if conn.sessions.get(sid) is link:
            del conn.sessions[sid]
        link.ended = True
        link.outbox.end()
        front.background(let_go, link, False)
        raise
    return link, attached.view


async def own_made(
    front: Connections, conn: Connection, session: SessionActor, attached: bool, *, replay: bool
) -> tuple[SessionLink, SessionView]:
    """:func:`own` for a session the call made or restored (``attached`` false): if
    owning it fails, it is closed again rather than left alive without a client."""
    try:
        return await own(front, conn, session, replay=replay)
    except BaseException:
        if not attached:
            front.background(_discard, session)
        raise


async def _discard(session: SessionActor) -> None:
    try:
        await session.call(CloseSession(reason="acp_session_refused"), timeout_s=10)
    except (SessionGone, ActorError):
        pass
    except Exception as exc:
        log.info("ACP: closing a refused session failed: %r", exc)


async def start_pump(
    front: Connections,
    conn: Connection,
    link: SessionLink,
    last_event_id: int | None,
    epoch: str | None,
) -> None:
    """(Re)subscribe ``link`` to its session's log and start a pump on it."""
    if link.pump_scope is not None:
        link.pump_scope.cancel()
    scope = trio.CancelScope()
    link.pump_scope = scope  # a later start supersedes this one
    try:
        subscription: Subscription = await link.session.call(
            Subscribe(
                last_event_id=last_event_id,
                epoch=epoch,
                max_queued=PUMP_MAX_QUEUED,
                client_id=link.client_id,
                principal=link.principal,
            ),
            timeout_s=ASK_TIMEOUT_S,
        )
    except Exception as exc:
        # Rendered here, not in the dispatch: a stream request (GET with Acp-Session-Id)
        # reaches this too, and a session/new names no session.
        raise to_rpc(exc, link.session_id) from None
    sub: Subscriber = subscription.subscriber
    if link.pump_scope is not scope or link.ended or conn.closed:
        sub.close()  # superseded, or released, while subscribing
        return
    link.epoch = subscription.epoch
    # What the pump will have queued once it reaches the head (for caught_up): a
    # fresh subscriber starts after the head it saw.
    start = sub.cursor - 1 if last_event_id is None else last_event_id
    link.last_pushed = start if link.last_pushed is None else max(link.last_pushed, start)
    link.evicted = False
    link.pump_done = trio.Event()
    front.spawn(_pump, front, conn, link, sub, scope, link.pump_done)


async def _pump(
    front: Connections,
    conn: Connection,
    link: SessionLink,
    sub: Subscriber,
    scope: trio.CancelScope,
    done: trio.Event,
) -> None:
    requests = not (conn.transport == "ws" and conn.dialect == "qwen")
    finished = False
    try:
        with scope:
            while True:
                frames = await sub.next_frames()
                if frames is None:
                    finished = True
                    break
                for frame in frames:
                    # An event stays the log's frame until a writer takes it (shared
                    # by every connection, not copied into each outbox).
                    msg = translate_frame(
                        frame, requests=requests, elicitation=conn.elicitation_modes
                    )
                    if msg is None:
                        continue
                    if msg.permission is not None:
                        rid, sid, request_id = msg.permission
                        conn.server_requests[rid] = (sid, request_id)
                        while len(conn.server_requests) > MAX_SERVER_REQUESTS:
                            conn.server_requests.popitem(last=False)
                    outbox = link.outbox if conn.transport == "http" else conn.outbox
                    if not outbox.has_room(len(msg.payload)) and outbox.has_reader:
                        # A reader is draining: backpressure, not eviction (the log's
                        # own subscriber bound still evicts a pump that falls behind).
                        with trio.move_on_after(WRITER_STALL_S):
                            await outbox.wait_room(len(msg.payload))
                    if not push_session(front, conn, link, msg.event_id, msg.payload):
                        return
                    if msg.event_type == "client_evicted":
                        link.evicted = True
                        return
                    if msg.event_type == "replay_complete" and link.deferred:
                        deferred, link.deferred = link.deferred, []
                        for queued in deferred:
                            push_session(front, conn, link, None, queued)
                link.pushed.set()
                link.pushed = trio.Event()
    finally:
        sub.close()
        done.set()
        try:  # the session counts the stream's end as being seen
            link.session.tell_nowait(StreamEnded())
        except (InboxFull, ActorStopped):
            pass
        if finished and link.pump_scope is scope and not link.hold_end:
            # The session's log closed: its stream drains and ends; the link is released.
            finish_link(front, conn, link)


def finish_link(front: Connections, conn: Connection, link: SessionLink) -> None:
    if not link.ended:
        link.ended = True
        front.background(let_go, link, False)
    link.outbox.end()
    if conn.transport == "ws":
        conn.sessions.pop(link.session_id, None)


def cut_links(front: Connections, conn: Connection, reads: Callable[[SessionActor], bool]) -> int:
    """End the links of ``conn`` to the sessions ``reads`` refuses: the pump stops, the
    session stream says ``_qwen/notify {kind: "session_access_revoked", data: {sessionId}}``
    and ends (after what it already queued), the client registration is let go. A later
    message naming the session is answered as for a session not owned."""
    cut = 0
    for link in list(conn.sessions.values()):
        if link.ended or reads(link.session):
            continue
        if link.pump_scope is not None:
            link.pump_scope.cancel()
        notice = notify("session_access_revoked", {"sessionId": link.session_id})
        push_session(front, conn, link, None, notice)
        finish_link(front, conn, link)
        cut += 1
    return cut


async def session_outbox(
    front: Connections,
    conn: Connection,
    session_id: str,
    *,
    last_event_id: int | None,
    epoch: str | None,
) -> tuple[Outbox, str] | None:
    """The outbox of an owned session's stream (None: not owned), resumed from
    ``last_event_id`` when given (or from the last event handed out after an
    eviction). Returns it with the log's epoch."""
    link = conn.sessions.get(session_id)
    if link is None:
        return None
    if link.ended:
        if link.outbox.ended and not len(link.outbox):
            conn.sessions.pop(session_id, None)
            return None
        return link.outbox, link.epoch
    if last_event_id is None and link.evicted:
        last_event_id = link.resume_from if link.resume_from is not None else 0
    if last_event_id is not None:
        link.outbox.drop_events()
        link.deferred.extend(link.outbox.take_replies())
        await start_pump(front, conn, link, last_event_id, epoch)
    return link.outbox, link.epoch


async def caught_up_now(link: SessionLink) -> None:
    """:func:`caught_up` to the session log's head as of now (asked of the session)."""
    try:
        view: SessionView = await link.session.call(Describe(), timeout_s=5)
    except Exception:
        return  # gone or stuck: the reply is not held back for it
    await caught_up(link, view.last_event_id)


async def caught_up(link: SessionLink, event_id: int, max_wait_s: float = 1.0) -> None:
    """Wait (bounded) until the pump has queued ``event_id``: a turn's reply then follows
    its events (``turn_complete`` included) on the stream."""
    with trio.move_on_after(max_wait_s):
        while (link.last_pushed or 0) < event_id and not link.pump_done.is_set():
            await link.pushed.wait()


class Replied:
    """A reply that must be ordered with the end of a session stream (close, detach)."""

    def __init__(self, front: Connections, conn: Connection, link: SessionLink, kind: str) -> None:
        self.front = front
        self.conn = conn
        self.link = link
        self.kind = kind

    async def deliver(self, rid: jsonrpc.Id, inline: Inline | None = None) -> None:
        front, conn, link = self.front, self.conn, self.link
        if conn.dialect == "qwen":
            # The qwen SDK synthesises an HTTP response from the reply, and its
            # closeSession/detachSession accept only 204 or 404 (a 204 cannot carry the
            # body it builds): the REST status it understands as "done" is 404.
            payload = jsonrpc.error_bytes(
                rid,
                RpcError(
                    RESOURCE_NOT_FOUND,
                    f"Session {link.session_id} {'closed' if self.kind == 'close' else 'detached'}",
                    {"httpStatus": 404, "sessionId": link.session_id, "done": self.kind},
                ),
            )
            reply_conn(front, conn, payload, inline)  # (an inline connection is a qwen one)
        elif conn.transport == "http" and not link.outbox.ended:
            # An ACP client reads the reply on the session stream, before it ends.
            push_session(front, conn, link, None, jsonrpc.result_bytes(rid, {}))
        else:
            reply_conn(front, conn, jsonrpc.result_bytes(rid, {}))
        if self.kind == "detach" and link.pump_scope is not None:
            link.pump_scope.cancel()
        finish_link(front, conn, link)
