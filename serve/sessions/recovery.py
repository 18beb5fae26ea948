"""A session restored from its journal: its prompts on record, ended and remembered.

Theory of operation
-------------------
A load or resume rebuilds the session's log from its journal (serve/sessions/journal_load.py,
:meth:`~serve.sessions.journal_link.JournalLink.restore`). What the journal says about the
session's prompts is read from the same records by :func:`scan` (sans-IO): each
``promptId`` an event's envelope carries, whether it waited in the queue
(``pending_prompt_added``), whether its turn began, and its one terminal (``turn_complete``
/ ``turn_error``) when that is on record. The journal link keeps that
:class:`PromptsOnRecord` until :func:`settle` takes it, right after the restored log is in
place and journaled, before anything else happens on the session (its inbox has not
started; on the eager path the agent has not been asked to load yet):

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

Bounds: the scan reads the records the restore reads (the journal's last
``--event-ring-size`` events) and keeps at most one entry per prompt id among them. A
prompt whose events did not reach the journal before a crash (at most
``flush_interval_ms``, 50 ms, of them) is not on record: unknown to the new owner.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final, Protocol

import msgspec
import trio

from serve.sessions.messages import Admission
from serve.sessions.prompt_events import publish_terminal
from serve.sessions.prompt_queue import MAX_REMEMBERED_PROMPTS

if TYPE_CHECKING:
    from serve.journal import Replay
    from serve.sessions.core import SessionCore

log = logging.getLogger(__name__)

#: A prompt's one terminal.
TERMINALS: Final = frozenset({"turn_complete", "turn_error"})
#: Events of a prompt that has not begun to run (a queued one).
_NOT_STARTED: Final = frozenset(
    {"pending_prompt_added", "pending_prompt_updated", "prompt_steered", "prompt_cancelled"}
)
#: Events that follow a prompt's terminal (its turn is over even if the terminal itself
#: fell out of the journal's tail).
_AFTER_TERMINAL: Final = frozenset({"pending_prompt_completed", "followup_suggestion"})
#: The code (and errorKind) of the terminal that ends a dead owner's turn.
OWNER_LOST: Final = "owner_lost"


class _Head(msgspec.Struct):
    """The envelope fields the scan reads (``data`` only for the events that need it)."""

    type: str = ""
    promptId: str | None = None
    originatorClientId: str | None = None


class _Full(msgspec.Struct):
    data: dict[str, Any] | None = None


_head = msgspec.json.Decoder(_Head)
_full = msgspec.json.Decoder(_Full)


class PromptOnRecord(msgspec.Struct, kw_only=True):
    """One prompt as the journal has it."""

    prompt_id: str
    first_id: int  # its first event in the journal's tail
    client_id: str | None = None  # the originator its events name
    text: str = ""  # what pending_prompt_added said it was (a queued prompt)
    queued: bool = False  # it waited behind another prompt
    started: bool = False  # its turn began
    ended: bool = False  # its terminal, or what follows one, is on record
    terminal: tuple[str, dict[str, Any]] | None = None  # (kind, data) when on record


class PromptsOnRecord(msgspec.Struct, kw_only=True):
    """What :func:`scan` found: the prompts in order of their first event, and whether the
    journal was closed cleanly."""

    prompts: list[PromptOnRecord]
    clean: bool

    @property
    def open(self) -> list[PromptOnRecord]:
        """Prompts admitted on record whose turn never ended there."""
        return [p for p in self.prompts if not p.ended]


def _frame_json(frame: bytes) -> bytes | None:
    """The envelope JSON of an SSE frame (``id: N\\nevent: T\\ndata: {...}\\n\\n``)."""
    start = frame.find(b"\ndata: ")
    return None if start < 0 else frame[start + 7 :].rstrip(b"\n")


def scan(replay: Replay) -> PromptsOnRecord:
    """The prompts the journal's records name (see the module docstring); sans-IO."""
    found: dict[str, PromptOnRecord] = {}
    for event_id, event_type, frame in replay:
        if b'"promptId"' not in frame:
            continue  # names no prompt: not decoded
        raw = _frame_json(frame)
        if raw is None:
            continue
        try:
            head = _head.decode(raw)
        except msgspec.DecodeError:
            continue
        pid = head.promptId
        if pid is None:
            continue
        prompt = found.get(pid)
        if prompt is None:
            prompt = found[pid] = PromptOnRecord(
                prompt_id=pid, first_id=event_id, client_id=head.originatorClientId
            )
        kind = head.type or event_type
        if kind in TERMINALS:
            if prompt.terminal is None:
                prompt.terminal = (kind, _data(raw))
            prompt.ended = True
        elif kind in _AFTER_TERMINAL:
            prompt.ended = True
        elif kind == "pending_prompt_added":
            prompt.queued = True
            text = _data(raw).get("text")
            prompt.text = text if isinstance(text, str) else ""
        elif kind not in _NOT_STARTED:
            prompt.started = True
    return PromptsOnRecord(prompts=list(found.values()), clean=replay.clean)


def _data(raw: bytes) -> dict[str, Any]:
    try:
        data = _full.decode(raw).data
    except (msgspec.DecodeError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


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

    async def flush(self) -> None: ...


async def settle(session: SessionCore, journal_link: RecordKeeper) -> None:
    """End the dead owner's turns and remember the prompts on record (module docstring);
    nothing when the log was not restored from a journal."""
    record, journal_link.on_record = journal_link.on_record, None
    if record is None:
        return
    epoch = session.log.epoch
    cut = 0
    for prompt in record.prompts[-MAX_REMEMBERED_PROMPTS:]:
        if not prompt.ended and not record.clean:
            terminal = session.prompts.remember_ended(
                prompt.prompt_id,
                client_id=prompt.client_id,
                text=prompt.text,
                queued=prompt.queued,
                started=prompt.started,
                kind="turn_error",
                data=owner_lost(session.session_id),
            )
            if terminal is None:
                continue
            publish_terminal(session, terminal)
            cut += 1
        elif prompt.terminal is not None:
            kind, data = prompt.terminal
            terminal = session.prompts.remember_ended(
                prompt.prompt_id,
                client_id=prompt.client_id,
                text=prompt.text,
                queued=prompt.queued,
                started=prompt.started,
                kind=kind,
                data=dict(data),
            )
            if terminal is None:
                continue
        else:
            continue
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


__all__ = [
    "OWNER_LOST",
    "PromptOnRecord",
    "PromptsOnRecord",
    "RecordKeeper",
    "owner_lost",
    "scan",
    "settle",
]
