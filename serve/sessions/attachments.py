"""Who is attached to a session: registered clients and open event streams.

``Attach`` registers a client (reusing a known ``X-Qwen-Client-Id``, else minting one;
serve/sessions/clients.py keeps them, expiring when idle); ``Subscribe`` opens an SSE
cursor on the session's log (a registered client streaming its events stays active);
``Detach`` lets a client go, and the last one gone with nothing pending closes the session
(``last_client_detached``); ``ReapIfIdle`` closes a session nobody used for the idle
timeout (``idle_timeout``). Functions of the session's inbox (one trio thread).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from serve.journal import SharedJournal
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


#: The meta attribute naming the clients registered on a session of a shared journal
#: (``--journal-url``), so a daemon that takes the session over (serve/cluster) knows them:
#: JSON ``{clientId: principalId}``, the last :data:`MAX_JOURNALED_CLIENTS` registered.
CLIENTS_ATTR = "clients"
#: Clients remembered in the journal per session (ids).
MAX_JOURNALED_CLIENTS = 64


def journaled_clients(session: SessionCore) -> dict[str, str]:
    """The clients a shared journal's meta names (``{}``: none, or unreadable)."""
    raw = session.journal_link.attrs.get(CLIENTS_ATTR)
    if not raw:
        return {}
    try:
        found = json.loads(raw)
    except ValueError:
        return {}
    if not isinstance(found, dict):
        return {}
    return {str(k): v for k, v in found.items() if isinstance(v, str)}


async def register_client(
    session: SessionCore,
    requested: str | None,
    peer: str | None,
    voter: bool = True,
    principal: str = OPERATOR_ID,
) -> str:
    """Reuse ``requested`` if ``principal`` registered it here (or, on a shared journal,
    on the daemon that owned the session before), else mint a fresh id (another principal's
    id is, to this one, an unknown id)."""
    shared = isinstance(session.journal_link.journal, SharedJournal)
    journaled = journaled_clients(session) if shared else {}
    known = requested is not None and (
        session.clients.owned_by(requested, principal) or journaled.get(requested) == principal
    )
    client_id = requested if known and requested is not None else f"client_{uuid.uuid4()}"
    session.clients.register(client_id, peer, voter, principal)
    if shared and journaled.get(client_id) != principal:
        journaled.pop(client_id, None)
        journaled[client_id] = principal
        while len(journaled) > MAX_JOURNALED_CLIENTS:
            journaled.pop(next(iter(journaled)))
        await session.journal_link.remember({CLIENTS_ATTR: json.dumps(journaled)})
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
