"""The session's side of the agent binding: :class:`SessionBindingPort` implements
:class:`~serve.sessions.binding.BindingOwner` over the session (:class:`SessionCore`).

The binding (serve/sessions/binding.py) decides restarts, releases and rebinds; what it
asks of the session is answered here, in the session's own terms: whether anything is
pending, ending the running or waiting prompts, ending the session, asking its inbox to
release the agent, recording a supervision event. Nothing here decides anything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from actors import EventKind
from serve.sessions import cancelling, endings, link_port, prompt_events
from serve.sessions.messages import ReleaseAgent

if TYPE_CHECKING:
    from acp.process import ExitInfo
    from acp.schema import SessionSetup
    from serve.sessions.core import SessionCore


class SessionBindingPort:
    """What the binding asks of one session (see the module docstring)."""

    __slots__ = ("s",)

    def __init__(self, session: SessionCore) -> None:
        self.s = session

    @property
    def session_id(self) -> str:
        return self.s.session_id

    @property
    def closing(self) -> bool:
        return self.s.closing

    @property
    def stopped(self) -> bool:
        return self.s.stopping or self.s.ended.is_set()

    @property
    def has_ended(self) -> bool:
        return self.s.ended.is_set()

    def has_running_prompt(self) -> bool:
        return self.s.prompts.running is not None

    def has_queued_prompts(self) -> bool:
        return bool(self.s.prompts.queued)

    def idle(self) -> bool:
        s = self.s
        return (
            s.pending_count == 0
            and s.calls.exclusive is None
            and s.mediator.pending_count(s.session_id) == 0
        )

    def publish(self, event_type: str, data: dict[str, Any]) -> None:
        self.s.log.publish(event_type, data)

    def adopt_setup(self, setup: SessionSetup | None) -> None:
        link_port.adopt_setup(self.s, setup)

    def end_running_turn(self, data: dict[str, Any]) -> None:
        running = self.s.prompts.running
        if running is not None:
            prompt_events.finish(self.s, running, "turn_error", data)

    def fail_waiting(self, data: dict[str, Any]) -> None:
        for terminal in self.s.prompts.abort_all("turn_error", data):
            prompt_events.publish_terminal(self.s, terminal)

    def cancel_turn_request(self) -> None:
        if self.s.turn_scope is not None:
            self.s.turn_scope.cancel()

    async def cancel_permissions(self) -> None:
        await cancelling.cancel_permissions(self.s)

    async def die(self, reason: str, exit_info: ExitInfo | None = None) -> None:
        await endings.abort_everything(self.s, reason, died=True, exit_info=exit_info)

    def stop(self) -> None:
        self.s.stopping = True
        self.s.close()

    async def request_release(self, reason: str) -> None:
        await self.s.call(ReleaseAgent(reason), timeout_s=30)

    def record_supervision(self, kind: str, reason: str, attempt: int) -> None:
        supervisor = self.s.supervisor
        if supervisor is not None:
            supervisor.record(self.s.name, EventKind(kind), reason, attempt)
