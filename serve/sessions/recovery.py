"""A session restored from its journal: its prompts on record, ended and remembered.

Theory of operation
-------------------
A load or resume rebuilds the session's log from its journal (serve/sessions/journal_load.py,
:meth:`~serve.sessions.journal_link.JournalLink.restore`); what those records say about the
session's prompts (:func:`serve.sessions.turn_record.scan`: each ``promptId`` on record,
queued or started, its terminal) waits on the journal link until :func:`settle` takes it,
right after the restored log is in place and journaled, before anything else happens on the
session (its inbox has not started; on the eager path the agent has not been asked to load
yet):

* **The dead owner's turn ends.** When the journal was not closed cleanly (``Replay.clean``
  false: the daemon that wrote it crashed, was killed, or lost its lease mid-turn), every
  prompt on record without a terminal gets one now: ``turn_error {code: "owner_lost",
  errorKind: "owner_lost", message}`` (:func:`owner_lost`; retryable, as a turn ended by a
  daemon shutdown is), then ``pending_prompt_completed`` for one that had waited; then the
  journal is flushed. A clean journal has no such prompt (a close ends them all first).
  Once on record the terminal is found by every later restore, so it is published once.
* **A retried promptId is never run twice.** Every prompt on record whose terminal is known
  (those just ended included) is remembered by the prompt queue as ended
  (:meth:`~serve.sessions.prompt_queue.PromptQueue.remember_ended`; the last
  :data:`~serve.sessions.prompt_queue.MAX_REMEMBERED_PROMPTS`, as for live admissions):
  a re-submission answers its first admission (``lastEventId``: the id before its first
  event on record) and, for a blocking caller, its recorded outcome; it does not run.
* **The budget comes back** from the meta's ``session.budget`` attribute (written within
  a second of each turn and each change of the limits: serve/sessions/budget.py), before
  the dead owner's turns end, so a spent budget stays spent.

Bounds: the scan reads the records the restore reads (the journal's last
``--event-ring-size`` events) and keeps at most one entry per prompt id among them. A
prompt whose events did not reach the journal before a crash (at most
``flush_interval_ms``, 50 ms, of them) is not on record: unknown to the new owner.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final, Protocol

import trio

from serve.sessions.budget import ATTR as BUDGET_ATTR
from serve.sessions.messages import Admission
from serve.sessions.prompt_events import publish_terminal
from serve.sessions.prompt_queue import MAX_REMEMBERED_PROMPTS
from serve.sessions.turn_record import PromptsOnRecord

if TYPE_CHECKING:
    from serve.sessions.core import SessionCore

log = logging.getLogger(__name__)

#: The code (and errorKind) of the terminal that ends a dead owner's turn.
OWNER_LOST: Final = "owner_lost"


def owner_lost(session_id: str) -> dict[str, Any]:
    """The terminal data of a turn whose daemon stopped before it ended."""
    return {
        "sessionId": session_id,
        "message": "the daemon running this turn stopped before it ended; the session was "
        "restored from its journal",
        "code": OWNER_LOST,
        "errorKind": OWNER_LOST,
    }


class RecordKeeper(Protocol):
    """Where the scan waits for :func:`settle` (the session's
    :class:`~serve.sessions.journal_link.JournalLink`)."""

    on_record: PromptsOnRecord | None
    attrs: dict[str, str]

    async def flush(self) -> None: ...


async def settle(session: SessionCore, journal_link: RecordKeeper) -> None:
    """End the dead owner's turns and remember the prompts on record (module docstring);
    nothing when the log was not restored from a journal."""
    record, journal_link.on_record = journal_link.on_record, None
    if record is None:
        return
    saved = journal_link.attrs.get(BUDGET_ATTR)
    if saved is not None and not session.budget.restore(saved):
        log.warning("session %s: its saved budget is unreadable: not restored", session.session_id)
    epoch = session.log.epoch
    cut = 0
    for prompt in record.prompts[-MAX_REMEMBERED_PROMPTS:]:
        cut_here = not prompt.ended and not record.clean
        if cut_here:
            kind, data = "turn_error", owner_lost(session.session_id)
        elif prompt.terminal is not None:
            kind, data = prompt.terminal[0], dict(prompt.terminal[1])
        else:
            continue
        terminal = session.prompts.remember_ended(
            prompt.prompt_id,
            client_id=prompt.client_id,
            text=prompt.text,
            queued=prompt.queued,
            started=prompt.started,
            kind=kind,
            data=data,
        )
        if terminal is None:
            continue
        if cut_here:
            publish_terminal(session, terminal)
            cut += 1
        done = trio.Event()
        done.set()
        job = terminal.job
        job.token = Admission(job.prompt_id, prompt.first_id - 1, epoch, job, done)
    if cut:
        log.warning(
            "session %s: %d prompt(s) of the daemon that wrote its journal never ended: "
            "ended with turn_error {code: %s}",
            session.session_id,
            cut,
            OWNER_LOST,
        )
        await journal_link.flush()


__all__ = ["OWNER_LOST", "RecordKeeper", "owner_lost", "settle"]
