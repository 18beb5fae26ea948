"""``POST /session/:id/prompt {"steer": true}``: the answer's ``steer`` part (the field is
checked with the rest of the body by :func:`serve.api.parse_prompt`).

A steer is admitted by the session's :class:`~serve.sessions.steering.Steering` (the wire
contract is in docs/reference/steering.md). The answer is the prompt
route's, for the turn the steer went into, plus ``steer: {via, outcome?, reason?,
cancelledPromptId?}``. A steer that joined another caller's running turn (``via:
"native"``) does not own it: a blocking steer whose POST goes away leaves that turn alone.
"""

from __future__ import annotations

from typing import Any

from serve.sessions.messages import Admission, Steered


def unpack(answer: Admission | Steered) -> tuple[Admission, dict[str, Any]]:
    """The admission whose turn answers the POST, and the answer's extra fields."""
    if not isinstance(answer, Steered):
        return answer, {}
    steer: dict[str, Any] = {"via": answer.via}
    if answer.outcome is not None:
        steer["outcome"] = answer.outcome
    if answer.reason is not None:
        steer["reason"] = answer.reason
    if answer.cancelled_prompt_id is not None:
        steer["cancelledPromptId"] = answer.cancelled_prompt_id
    return answer.admission, {"steer": steer}
