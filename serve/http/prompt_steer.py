"""``POST /session/:id/prompt {"steer": true}``: the field and the answer's ``steer`` part.

A steer is admitted by the session's :class:`~serve.sessions.steering.Steering` (the wire
contract is in README.md "Steering and the editable queue"). The answer is the prompt
route's, for the turn the steer went into, plus ``steer: {via, outcome?, reason?,
cancelledPromptId?}``. A steer that joined another caller's running turn (``via:
"native"``) does not own it: a blocking steer whose POST goes away leaves that turn alone.
"""

from __future__ import annotations

from typing import Any

from serve.http.errors import bad_request
from serve.sessions.messages import Admission, Steered


def steer_flag(body: dict[str, Any]) -> bool:
    """The body's ``steer`` (absent: False); anything but a boolean is ``400 invalid_steer``."""
    steer = body.get("steer")
    if steer is None:
        return False
    if not isinstance(steer, bool):
        raise bad_request("`steer` must be a boolean", "invalid_steer")
    return steer


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


def owns_turn(extra: dict[str, Any]) -> bool:
    """Whether a dropped blocking POST may cancel the turn (not one a steer joined)."""
    return bool(extra.get("steer", {}).get("via") != "native")
