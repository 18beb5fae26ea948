"""A prompt as the fronts receive it: its body validated in one place, and its outcome.

Sans-IO. :func:`parse_prompt` checks a ``POST /session/:id/prompt`` body (``/acp``
``session/prompt`` params have the same fields) in the order the reference checks them —
the content blocks, the ``_meta`` forwarded to the agent, ``steer``, ``promptId``,
``deadlineMs`` — and answers a typed :class:`PromptBody`, or raises
:class:`~serve.sessions.errors.InvalidRequest` (400 in the error table; no code for the
content and ``_meta`` refusals, ``invalid_steer`` / ``invalid_prompt_id`` /
``invalid_deadline_ms`` for the others). Only what :func:`serve.sessions.turns.passthrough`
allows (``_meta``) goes on to the agent: a body's ``sessionId``, ``promptId``, ... never do.

:func:`turn_outcome` reads a finished admission's one terminal: a :class:`TurnCompleted`,
or it raises the :class:`~serve.sessions.errors.TurnFailed` whose class says whether a
retry may succeed (the table renders 402 / 404 / 503 with or without Retry-After / 500).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from serve.sessions import turns
from serve.sessions.errors import InvalidRequest, TurnFailed
from serve.sessions.messages import Admission, SubmitPrompt

__all__ = [
    "MAX_DEADLINE_MS",
    "MAX_NON_TEXT_BLOCKS",
    "MAX_PROMPT_ID_CHARS",
    "PromptBody",
    "PromptContent",
    "TurnCompleted",
    "forwarded",
    "parse_prompt",
    "prompt_content",
    "turn_outcome",
]

#: Content blocks other than text one prompt may carry.
MAX_NON_TEXT_BLOCKS: Final = 256
#: Longest client-chosen ``promptId`` (characters).
MAX_PROMPT_ID_CHARS: Final = 128
#: Largest ``deadlineMs`` (milliseconds; a signed 32-bit timer).
MAX_DEADLINE_MS: Final = 2_147_483_647

_PROMPT_ERROR: Final = "`prompt` must be a non-empty array of content blocks"


@dataclass(frozen=True)
class PromptContent:
    """The content blocks as raw JSON, and their text parts joined by newlines."""

    blocks: msgspec.Raw
    text: str


@dataclass(frozen=True)
class PromptBody:
    """A validated prompt body; :meth:`request` is the session's ``SubmitPrompt``."""

    content: PromptContent
    #: What goes on to the agent's ``session/prompt`` (``_meta`` only).
    extra: dict[str, Any]
    steer: bool = False
    prompt_id: str | None = None
    deadline_ms: int | None = None

    def request(self, client_id: str | None) -> SubmitPrompt:
        content = self.content
        return SubmitPrompt(
            content.blocks,
            content.text,
            client_id,
            self.extra or None,
            self.prompt_id,
            self.deadline_ms,
        )


def prompt_content(value: object) -> PromptContent:
    """``prompt``: a non-empty array of content blocks, text blocks with a string ``text``,
    at most :data:`MAX_NON_TEXT_BLOCKS` others."""
    if not isinstance(value, list) or not value:
        raise InvalidRequest(_PROMPT_ERROR)
    texts: list[str] = []
    non_text = 0
    for block in value:
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise InvalidRequest(_PROMPT_ERROR)
        if block["type"] == "text":
            text = block.get("text")
            if not isinstance(text, str):
                raise InvalidRequest("text content blocks need a string `text`")
            texts.append(text)
        else:
            non_text += 1
    if non_text > MAX_NON_TEXT_BLOCKS:
        raise InvalidRequest(f"at most {MAX_NON_TEXT_BLOCKS} non-text content blocks per prompt")
    return PromptContent(msgspec.Raw(msgspec.json.encode(value)), "\n".join(texts))


def forwarded(body: Mapping[str, Any]) -> dict[str, Any]:
    """The body's fields the agent gets (an allow-list: ``_meta``, a JSON object)."""
    try:
        return turns.passthrough(body)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None


def _steer(body: Mapping[str, Any]) -> bool:
    steer = body.get("steer")
    if steer is None:
        return False
    if not isinstance(steer, bool):
        raise InvalidRequest("`steer` must be a boolean", "invalid_steer")
    return steer


def _prompt_id(body: Mapping[str, Any]) -> str | None:
    prompt_id = body.get("promptId")
    if prompt_id is None:
        return None
    if not isinstance(prompt_id, str) or not 0 < len(prompt_id) <= MAX_PROMPT_ID_CHARS:
        raise InvalidRequest(
            f"`promptId` must be a non-empty string of at most {MAX_PROMPT_ID_CHARS} characters",
            "invalid_prompt_id",
        )
    return prompt_id


def _deadline_ms(body: Mapping[str, Any]) -> int | None:
    deadline = body.get("deadlineMs")
    if deadline is None:
        return None
    if (
        isinstance(deadline, bool)
        or not isinstance(deadline, int)
        or not 0 < deadline <= MAX_DEADLINE_MS
    ):
        raise InvalidRequest("`deadlineMs` must be a positive integer", "invalid_deadline_ms")
    return deadline


def parse_prompt(body: Mapping[str, Any], *, steering: bool = True) -> PromptBody:
    """The whole prompt body, checked in the reference's order (see the module doc).
    ``steering`` False: a front whose prompt method never steers (``/acp``
    ``session/prompt``; it has ``_session/steering``) ignores a ``steer`` field."""
    content = prompt_content(body.get("prompt"))
    extra = forwarded(body)
    steer = _steer(body) if steering else False
    return PromptBody(content, extra, steer, _prompt_id(body), _deadline_ms(body))


@dataclass(frozen=True)
class TurnCompleted:
    """A turn that ended with ``turn_complete``: its stop reason and, when the agent
    reported one, where it can be branched (``fields``: ``{"branchPoint": ...}``)."""

    prompt_id: str
    stop_reason: object
    fields: dict[str, Any] = field(default_factory=dict)


def turn_outcome(admission: Admission) -> TurnCompleted:
    """The finished admission's terminal: completed, or :class:`TurnFailed` raised."""
    terminal = admission.job.terminal
    assert terminal is not None, "the admission's done event is set after its terminal"
    data: dict[str, Any] = terminal.data
    if terminal.kind != "turn_complete":
        raise TurnFailed.of(admission.prompt_id, data)
    fields = {"branchPoint": data["branchPoint"]} if "branchPoint" in data else {}
    return TurnCompleted(admission.prompt_id, data["stopReason"], fields)
