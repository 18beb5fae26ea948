"""What a session's journal says about its prompts (sans-IO): :func:`scan`.

Read from the records a restore reads (serve/sessions/journal_load.py,
:meth:`~serve.sessions.journal_link.JournalLink.restore`): each ``promptId`` an event's
envelope carries, in the order of its first event, whether it waited in the queue
(``pending_prompt_added``), whether its turn began, and its one terminal (``turn_complete``
/ ``turn_error``) when that is on record. serve/sessions/recovery.py acts on it. Bounded by
the records it is given (one entry per prompt id among them); only the frames that name a
prompt are decoded, and only the envelope fields it reads (``data`` only for terminals and
``pending_prompt_added``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import msgspec

if TYPE_CHECKING:
    from serve.journal import Replay

#: A prompt's one terminal.
TERMINALS: Final = frozenset({"turn_complete", "turn_error"})
#: Events of a prompt that has not begun to run (a queued one).
_NOT_STARTED: Final = frozenset(
    {"pending_prompt_added", "pending_prompt_updated", "prompt_steered", "prompt_cancelled"}
)
#: Events that follow a prompt's terminal (its turn is over even if the terminal itself
#: fell out of the journal's tail).
_AFTER_TERMINAL: Final = frozenset({"pending_prompt_completed", "followup_suggestion"})


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


__all__ = ["TERMINALS", "PromptOnRecord", "PromptsOnRecord", "scan"]
