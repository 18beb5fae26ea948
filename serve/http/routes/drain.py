"""``POST /daemon/drain``: make the daemon safe to suspend, and say when it is.

For agent-sandbox's ``operatingMode: Suspended`` (the pod goes, its volume stays) or any
planned stop: the caller drains first, then suspends. Body (optional)
``{"timeoutMs": N}`` (default ``--drain-timeout-ms``, at most :data:`MAX_DRAIN_MS`).

1. The daemon starts draining, as on SIGTERM: ``/readyz`` answers 503 ``draining``, new
   sessions and prompts get ``503 daemon_draining``; reads, event streams, votes and
   cancels keep working.
2. Admitted prompts may finish within the timeout. Past it, what still runs is cancelled
   (each turn ends with its terminal event, queued prompts are cancelled in turn), bounded
   by ``--cancel-grace-ms`` + :data:`CANCEL_MARGIN_S`.
3. The journal is flushed (every event accepted so far is on disk).
4. In a cluster (``--journal-url``), the sessions move (serve/api/handover.py): each is
   handed over with no final event, its agent stopped and its journal closed cleanly (its
   lease released), so another daemon restores it on the next request for it.

Answers ``200 {"drained": true, "sessions", "busyAtStart", "cancelledSessions",
"journalFlushed", "movedSessions"}``
once all of that is true: suspending now loses nothing; after the resume, sessions are
restored from the journal with their history (``POST /session/:id/load``). If turns
outlived even the cancel bound the answer is ``503 drain_incomplete`` (with
``activePrompts``); call it again. The daemon stays draining until it stops (drain is not
undone: a suspend called off is a restart). A strict route.
"""

from __future__ import annotations

import logging

import msgspec
import trio
from quart import Blueprint, Response

from serve.api.handover import hand_over_idle
from serve.http.capabilities import Feature
from serve.http.context import daemon
from serve.http.errors import ApiError, bad_request
from serve.http.wire import json_body, json_response
from serve.journal import JournalIOError
from serve.sessions.actor import SessionActor
from serve.sessions.messages import CancelTurn

log = logging.getLogger(__name__)

blueprint = Blueprint("drain", __name__)

FEATURES: tuple[Feature, ...] = (Feature("daemon_drain", (("POST", "/daemon/drain"),)),)

#: Longest ``timeoutMs`` accepted (10 minutes).
MAX_DRAIN_MS = 600_000
#: Seconds past ``--cancel-grace-ms`` that cancelled turns get to end.
CANCEL_MARGIN_S = 2.0
_POLL_S = 0.05
#: Seconds the sessions handed over in a cluster get to be gone (agents stopped, journals
#: closed).
HAND_OVER_S = 10.0


@blueprint.post("/daemon/drain")
async def post_drain() -> Response:
    d = daemon()
    body = await json_body()
    unknown = set(body) - {"timeoutMs"}
    if unknown:
        raise bad_request(f"Unknown field: {sorted(unknown)[0]}", "invalid_drain")
    timeout_ms = body.get("timeoutMs", d.settings.drain_timeout_ms)
    if (
        not isinstance(timeout_ms, int)
        or isinstance(timeout_ms, bool)
        or not (0 <= timeout_ms <= MAX_DRAIN_MS)
    ):
        raise bad_request(f"timeoutMs must be an integer in [0, {MAX_DRAIN_MS}]", "invalid_drain")
    if not d.lifecycle.draining:
        log.info("draining on request (POST /daemon/drain): no new sessions or prompts")
    d.lifecycle.draining = True

    def busy() -> list[SessionActor]:
        return [s for s in d.registry.live() if s.pending_count]

    busy_at_start = len(busy())
    with trio.move_on_after(timeout_ms / 1000):
        while busy():  # noqa: ASYNC110 (the sessions own their queues; we only watch)
            await trio.sleep(_POLL_S)
    cancelled: set[str] = set()
    with trio.move_on_after(d.settings.cancel_grace_ms / 1000 + CANCEL_MARGIN_S):
        while sessions := busy():
            for session in sessions:
                cancelled.add(session.session_id)
                try:
                    session.tell_nowait(CancelTurn(None))
                except Exception:  # gone or full: it is ending anyway, or we ask again
                    pass
            await trio.sleep(0.2)
    still = busy()
    if still:
        raise ApiError(
            503,
            {
                "error": "Some turns did not end within the drain bound; call again",
                "code": "drain_incomplete",
                "activePrompts": len(still),
            },
            {"Retry-After": "1"},
        )
    flushed = False
    if d.journal is not None:
        try:
            await d.journal.flush()
            flushed = True
        except JournalIOError as exc:
            raise ApiError(
                503, {"error": f"The journal could not be flushed: {exc}", "code": "journal_io"}
            ) from None
    moved = 0
    if d.settings.journal_url is not None:  # a cluster: the sessions move, not end
        handed = await hand_over_idle(d.registry.live(), timeout_s=HAND_OVER_S)
        moved = handed.moved
    answer = {
        "drained": True,
        "sessions": len(d.registry.live()),
        "busyAtStart": busy_at_start,
        "cancelledSessions": len(cancelled),
        "journalFlushed": flushed,
        "movedSessions": moved,
    }
    log.info("drained on request: %s", msgspec.json.encode(answer).decode())
    return json_response(answer, headers={"Cache-Control": "no-store"})
