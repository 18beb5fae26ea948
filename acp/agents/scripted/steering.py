"""The scripted agent's steering: ``_session/steering`` as codex-acp and claude-agent-acp
answer it (advertised as ``InitializeResponse._meta.steering.supported``; not ``--legacy``).

``_session/steering {sessionId, prompt: ContentBlock[], _meta?}``:

* a turn is running: the steer's text is a script too, run in that turn after what is left
  of the turn's own (its updates stream in the turn, the prompt response comes after them):
  ``{"outcome": "injected"}``;
* ``[steer-late]`` ran in the turn: steers run in a thread of their own instead, so the turn's
  prompt response (``end_turn``) can come while steered work still streams (the case a
  client must not take for the end of the turn);
* ``[steer-closed]`` ran in the turn: the turn takes no more steers, as one that is ending
  (``promptRequired``, below);
* ``[steer-fail]`` ran in the turn: ``{"outcome": "failed"}`` (codex-acp's answer when it
  cannot take the input);
* no turn is running (or it is being cancelled): ``{"outcome": "promptRequired", "reason":
  "noRunningTurn"}`` (what claude-agent-acp answers to ``idleBehavior: "promptRequired"``;
  the scripted agent never starts a turn on its own).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

from acp.jsonrpc import RequestId

#: The ``_meta`` of the scripted agent's initialize answer.
INITIALIZE_META = {"steering": {"supported": True}}


class SteerInbox:
    """The steers of one turn, taken by the turn's thread (or run late, in their own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[str] = []
        self._open = True
        #: Set by ``[steer-late]``: runs a steer's text in a thread of its own.
        self.late: Callable[[str], None] | None = None
        #: Set by ``[steer-fail]``: steers of this turn are answered ``failed``.
        self.fail = False

    def offer(self, text: str) -> bool:
        """Into the running turn (False: the turn is over, it cannot take it)."""
        with self._lock:
            if not self._open:
                return False
            if self.late is None:
                self._pending.append(text)
                return True
            late = self.late
        late(text)
        return True

    def next(self) -> str | None:
        """The next steer for the turn's thread; None closes the inbox (the turn ends)."""
        with self._lock:
            if self._pending:
                return self._pending.pop(0)
            self._open = False
            return None

    def close(self) -> None:
        with self._lock:
            self._open = False


class _Turn(Protocol):
    @property
    def cancel(self) -> threading.Event: ...

    @property
    def steers(self) -> SteerInbox: ...


class _Session(Protocol):
    @property
    def turn(self) -> _Turn | None: ...


class ScriptedAgent(Protocol):
    """What :func:`steer` uses of :class:`~acp.agents.scripted.agent.ScriptedAgent` (a
    Protocol: that module imports this one)."""

    def _session(self, params: dict[str, Any]) -> _Session: ...


def steer(agent: ScriptedAgent, rid: RequestId, params: dict[str, Any]) -> object:
    """The ``_session/steering`` method of :class:`~acp.agents.scripted.agent.ScriptedAgent`
    (a ``ValueError`` is answered -32602 Invalid params)."""
    session = agent._session(params)
    blocks = params.get("prompt")
    if not isinstance(blocks, list) or not blocks:
        raise ValueError("prompt must be a non-empty list of content blocks")
    text = "\n".join(
        str(b.get("text", "")) for b in blocks if isinstance(b, dict) and b.get("type") == "text"
    )
    turn = session.turn
    if turn is not None and turn.steers.fail:
        return {"outcome": "failed"}
    if turn is not None and not turn.cancel.is_set() and turn.steers.offer(text):
        return {"outcome": "injected"}
    return {"outcome": "promptRequired", "reason": "noRunningTurn"}
