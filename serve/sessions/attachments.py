"""Who is attached to a session: registered clients and open event streams.

``Attach`` registers a client (reusing a known ``X-Qwen-Client-Id``, else minting one;
serve/sessions/clients.py keeps them, expiring when idle); ``Subscribe`` opens an SSE
cursor on the session's log (a registered client streaming its events stays active);
``Detach`` lets a client go, and the last one gone with nothing pending closes the session
(``last_client_detached``); ``ReapIfIdle`` closes a session nobody used for the idle
timeout (``idle_timeout``). Functions of the session's inbox (one trio thread).
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from serve.sessions.clients import OPERATOR_ID
from serve.sessions.messages import CloseSession, Detached, Subscription

if TYPE_CHECKING:
    from serve.sessions.core import SessionCore
    from serve.sessions.messages import ReapIfIdle, Subscribe

log = logging.getLogger(__name__)


def now_ms() -> int:
    return int(time.time() * 1000)


def iso_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def register_client(
    session: SessionCore,
    requested: str | None,
    peer: str | None,
    voter: bool = True,
    principal: str = OPERATOR_ID,
) -> str:
    """Reuse ``requested`` if ``principal`` registered it here, else mint a fresh id
    (another principal's id is, to this one, an unknown id)."""
    client_id = (
        requested
        if requested is not None and session.clients.owned_by(requested, principal)
        else f"client_{uuid.uuid4()}"
    )
    session.clients.register(client_id, peer, voter, principal)
    return client_id


async def detach(session: SessionCore, client_id: str | None) -> Detached:
    if session.closing:
        return Detached(closed=False)
    if client_id is not None:
        session.clients.release(client_id)
    if not session.clients and session.subscribers == 0 and session.pending_count == 0:
        await session.close_session(CloseSession(reason="last_client_detached"))
        return Detached(closed=True)
    return Detached(closed=False)


def subscribe(session: SessionCore, msg: Subscribe) -> Subscription:
    snapshot = None
    if msg.snapshot:
        snapshot = {
            "sessionId": session.session_id,
            "currentModelId": session.current_model,
            "currentApprovalMode": session.current_mode,
        }
    sub = session.log.subscribe(
        last_event_id=msg.last_event_id,
        epoch=msg.epoch,
        max_queued=msg.max_queued,
        snapshot=snapshot,
    )
    # a registered client streaming its events stays active (serve/sessions/clients.py)
    named = msg.client_id
    streaming = named is not None and session.clients.stream_opened(named, msg.principal)
    session.streams[sub] = named if streaming else None
    return Subscription(sub, session.log.epoch)


async def reap_if_idle(session: SessionCore, msg: ReapIfIdle) -> bool:
    now = now_ms()
    if (
        not session.closing
        and session.subscribers == 0
        and session.pending_count == 0
        and session.calls.exclusive is None
        and session.mediator.pending_count(session.session_id) == 0
        and now - session.last_seen_ms >= msg.idle_timeout_ms
        and now - session.last_settled_ms >= msg.settled_grace_ms
    ):
        log.info("reaping idle session %s", session.session_id)
        await session.close_session(CloseSession(reason="idle_timeout"))
        return True
    return False
