"""``_session/steering`` at ``/acp``: acp-serve steers like the agents that invented it.

The daemon advertises ``InitializeResponse._meta.steering.supported: true`` to its own ACP
clients and answers ``_session/steering {sessionId, prompt, _meta?}`` with the session's
steer (``serve/sessions/steering.py``), whatever its agent supports:

* the agent took it into the running turn: ``{"outcome": "injected"}`` (or the agent's own
  answer, e.g. ``startedNewTurn``); the client's ``session/prompt`` answers at the turn's end;
* the daemon cancelled the running turn (an agent without native steering; the client's
  ``session/prompt`` answers ``cancelled``) or no turn ran: the steer is a turn the daemon
  started, ``{"outcome": "startedNewTurn"}``, streamed on the session stream as any turn;
* ``_meta.steering.idleBehavior: "promptRequired"`` and no turn to join: nothing is sent,
  ``{"outcome": "promptRequired", "reason": "noRunningTurn"}`` (the message is the
  client's to send as a prompt), as claude-agent-acp answers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from serve.acpfront.jsonrpc import INVALID_PARAMS, RpcError
from serve.sessions import turns
from serve.sessions.messages import Steered, SteerPrompt, SubmitPrompt
from serve.sessions.steering import NoRunningTurn

if TYPE_CHECKING:
    import msgspec

    from serve.sessions.actor import SessionActor

#: The top-level ``_meta`` of the daemon's ``initialize`` answer at ``/acp``.
INITIALIZE_META: Final = {"steering": {"supported": True}}


async def steer(
    session: SessionActor,
    client_id: str | None,
    blocks: msgspec.Raw,
    text: str,
    params: dict[str, Any],
    timeout_s: float,
) -> dict[str, Any]:
    meta = params.get("_meta")
    steering = meta.get("steering") if isinstance(meta, dict) else None
    idle = steering.get("idleBehavior") if isinstance(steering, dict) else None
    try:
        extra = turns.passthrough(params)  # an allow-list: `_meta` only
    except ValueError as exc:
        raise RpcError(INVALID_PARAMS, str(exc), {"httpStatus": 400}) from None
    request = SubmitPrompt(blocks, text, client_id, extra or None)
    when_idle = "refuse" if idle == "promptRequired" else "prompt"
    try:
        steered: Steered = await session.call(SteerPrompt(request, when_idle), timeout_s=timeout_s)
    except NoRunningTurn:
        return {"outcome": "promptRequired", "reason": "noRunningTurn"}
    if steered.via == "native":
        return {"outcome": steered.outcome or "injected"}
    return {"outcome": "startedNewTurn"}
