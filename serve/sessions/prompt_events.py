"""A prompt's life on the session's log, outside its turn: admitted, removed, ended.

The seam: :class:`~serve.sessions.prompt_queue.PromptQueue` decides (sans-IO) which prompt is
admitted, queued, removed or ended, and :mod:`.turn_worker` runs a turn; this module is
where those decisions become the events clients see and wake what must act on them. It
changes when the queue's wire events change (``pending_prompt_added``,
``prompt_cancelled {reason: "removed_from_queue"}``, ``pending_prompt_completed``, the one
terminal per prompt), not when the inbox or a turn does:

* :func:`admit` (``SubmitPrompt``, and a steer that becomes a prompt): refused with 402
  when the budget is spent (:func:`refuse_if_exhausted`) and with the link's refusal (e.g.
  503 ``memory_budget_exceeded``) when the agent is released and cannot bind now; a
  re-sent ``promptId`` answers its first admission; a fresh one that waits is announced
  (``pending_prompt_added``), and its :class:`~serve.sessions.messages.Admission` carries
  the log position the caller streams from. Then the worker is woken and an agent bound.
* :func:`remove_pending` (``DELETE .../pending-prompts/:id``): a queued prompt goes with
  ``prompt_cancelled`` and its terminal; the running one is refused (409).
* :func:`finish` / :func:`publish_terminal`: a prompt's one terminal (``turn_complete`` or
  ``turn_error``), then, for one that waited, ``pending_prompt_completed {state: completed |
  removed}``; the agent counts as used and the session as settled
  (``--session-prompt-settled-close-grace-ms``); a turn that ran has the permission
  requests it left open withdrawn.

Functions of the session's inbox and its nursery's tasks (one trio thread), over
:class:`~serve.sessions.core.SessionCore`.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import trio

from acp import telemetry
from actors import ActorError
from serve.permissions.mediator import CancelPromptPermissions
from serve.sessions.attachments import iso_now, now_ms
from serve.sessions.errors import BudgetExhausted
from serve.sessions.messages import Admission
from serve.sessions.prompt_queue import PromptRunning

if TYPE_CHECKING:
    from serve.sessions.core import SessionCore
    from serve.sessions.prompt_queue import Job, PromptRequest, Terminal

log = logging.getLogger(__name__)


def refuse_if_exhausted(session: SessionCore) -> None:
    budget = session.budget
    dim = budget.exhausted
    if dim is not None:
        limits = budget.limits
        spent = budget.tokens if dim == "tokens" else budget.cost or 0.0
        limit = limits.max_tokens if dim == "tokens" else limits.max_cost
        raise BudgetExhausted(session.session_id, dim, spent, float(limit or 0))


def admit(session: SessionCore, msg: PromptRequest, *, front: bool = False) -> Admission:
    attributes = {"acp_serve.session_id": session.session_id}
    with telemetry.span("prompt.admission", parent=msg.trace, attributes=attributes) as span:
        admission = _admit(session, msg, front)
        span.set_attribute("acp_serve.prompt_id", admission.prompt_id)
        return admission


def _admit(session: SessionCore, msg: PromptRequest, front: bool) -> Admission:
    refuse_if_exhausted(session)
    if session.binding.released and not session.binding.rebinding:
        refusal = session.link.refusal()  # e.g. 503 memory_budget_exceeded
        if refusal is not None:
            raise refusal
    admitted = session.prompts.admit(msg, now=trio.current_time(), queued_at=iso_now(), front=front)
    job: Job = admitted.job
    if not admitted.fresh:
        # The same turn, not a second one. Job.token is its Admission (Any: the queue
        # module sits below the messages that define Admission).
        return job.token  # type: ignore[no-any-return]
    done = trio.Event()
    job.notify = done.set
    watermark = session.log.last_id
    if job.queued:
        session.log.publish(
            "pending_prompt_added",
            {
                "sessionId": session.session_id,
                "promptId": job.prompt_id,
                "text": job.text,
                "queuedAt": iso_now(),
            },
            prompt_id=job.prompt_id,
            originator=job.client_id,
        )
    job.token = Admission(job.prompt_id, watermark, session.log.epoch, job, done)
    session.work.set()  # wake the worker
    session.binding.ensure_bound("prompt")
    return job.token  # type: ignore[no-any-return]  # the Admission just set


def remove_pending(session: SessionCore, prompt_id: str, client_id: str | None) -> bool:
    """Remove a queued prompt (True), False when unknown; running ones are refused."""
    running = session.prompts.running
    if running is not None and running.prompt_id == prompt_id:
        raise PromptRunning(prompt_id)
    if not any(j.prompt_id == prompt_id for j in session.prompts.queued):
        return False
    session.log.publish(
        "prompt_cancelled",
        {"sessionId": session.session_id, "reason": "removed_from_queue"},
        prompt_id=prompt_id,
        originator=client_id,
    )
    terminal = session.prompts.remove(
        prompt_id, {"sessionId": session.session_id, "stopReason": "cancelled"}
    )
    publish_terminal(session, terminal)
    return True


def finish(session: SessionCore, job: Job, event_type: str, data: dict[str, Any]) -> None:
    """End ``job`` with its one terminal event (idempotent)."""
    publish_terminal(session, session.prompts.finish(job, event_type, data))


def publish_terminal(session: SessionCore, terminal: Terminal | None) -> None:
    if terminal is None:
        return
    job: Job = terminal.job
    data = {"sessionId": session.session_id, **terminal.data}
    session.log.publish(terminal.kind, data, prompt_id=job.prompt_id, originator=job.client_id)
    session.binding.used()
    if job.queued:
        state = "completed" if terminal.started else "removed"
        session.log.publish(
            "pending_prompt_completed",
            {"sessionId": session.session_id, "promptId": job.prompt_id, "state": state},
            prompt_id=job.prompt_id,
        )
    session.last_settled_ms = now_ms()
    if terminal.started:
        _log_turn(session, job, terminal)
        _turn_ended(session, job)


def _log_turn(session: SessionCore, job: Job, terminal: Terminal) -> None:
    """One line a person reads per turn: how it ended, how long it took, the tokens."""
    data = terminal.data
    how = data.get("stopReason") or data.get("code") or terminal.kind
    took = "" if job.started_at is None else f" after {time.monotonic() - job.started_at:.1f} s"
    usage = session.turn_usage
    tokens = usage.get("totalTokens") if isinstance(usage, dict) else None
    log.info(
        "session %s: turn %s ended: %s%s%s",
        session.session_id,
        job.prompt_id,
        how,
        took,
        f", {tokens} tokens" if isinstance(tokens, int) else "",
    )


def _turn_ended(session: SessionCore, job: Job) -> None:
    """Withdraw the permission requests the finished turn left open."""
    try:
        session.mediator.tell_nowait(CancelPromptPermissions(session.session_id, job.prompt_id))
    except ActorError:  # full or stopped: the response timeout still applies
        log.warning("session %s: could not withdraw permissions of its turn", session.session_id)
