"""Editing the prompt queue before a prompt starts.

``GET /session/:id/pending-prompts`` lists it and ``DELETE .../pending-prompts/:promptId``
withdraws a queued prompt (``serve/sessions/actor.py``); :func:`replace_pending` is ``PUT
.../pending-prompts/:promptId``: a queued prompt gets new content and keeps its id, its place
in the FIFO, its deadline and its client; ``pending_prompt_updated {sessionId, promptId,
text, queuedAt}`` says so. A running prompt cannot be edited (``PromptRunning``; steer it or
cancel it), and one that already ended is not queued (None).
"""

from __future__ import annotations

from typing import Protocol

from serve.events import EventLog
from serve.sessions.messages import PendingReplaced, ReplacePending
from serve.sessions.prompt_queue import PromptQueue


class _Session(Protocol):  # the part of the SessionActor this reads and writes
    session_id: str
    prompts: PromptQueue
    log: EventLog


def replace_pending(session: _Session, msg: ReplacePending) -> PendingReplaced | None:
    job = session.prompts.replace(msg.prompt_id, msg.request)  # PromptRunning: refused
    if job is None:
        return None
    session.log.publish(
        "pending_prompt_updated",
        {
            "sessionId": session.session_id,
            "promptId": job.prompt_id,
            "text": job.text,
            "queuedAt": job.queued_at,
        },
        prompt_id=job.prompt_id,
        originator=msg.request.client_id,
    )
    return PendingReplaced(job.prompt_id, job.text, job.queued_at)
