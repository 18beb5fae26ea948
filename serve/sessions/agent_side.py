"""The session's side of the ACP connection: what the agent sends it and asks of it.

:class:`AgentSide` is the connection's :class:`acp.handler.ClientHandler` for one session:
an object the session actor composes, reaching the session only through :class:`SidePort`:

* ``session/update`` notifications are relayed untouched into the log as ``session_update``
  events (``{sessionId, update}``, encoded once), stamped with the running prompt's id and
  originator; updates before the session id is known are kept and relayed once it is;
  a replay of history the log already holds (``session/load`` after a restart) is dropped;
* ``fs/*`` and ``terminal/create`` go through the Host's effect gate when one is installed;
* ``session/request_permission``: the approval policy answers first
  (``screen_agent_permission``); otherwise :meth:`AgentSide._mediate_permission` asks the
  session's clients through the PermissionMediator;
* ``elicitation/create`` (and ``elicitation/complete``): :mod:`.elicitation_side`, brokered
  through the same mediator.

These run in the connection's tasks, not in the actor's inbox, and only read the session's
state or append to its log (the actor's own log: the connection is the actor's). The gate
and the mediator are given the session itself (its identity keys the gate's
per-incarnation token, and the mediator's events go to its inbox).
"""

from __future__ import annotations

from collections import OrderedDict
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

import msgspec

from acp import telemetry
from acp.handler import BaseClientHandler
from acp.schema import (
    CancelledPermissionOutcome,
    CreateTerminalParams,
    PermissionOutcome,
    ReadTextFileParams,
    RequestPermissionParams,
    SelectedPermissionOutcome,
    WriteTextFileParams,
)
from actors import ActorError
from serve.events import RawParts
from serve.permissions.effect_session import EffectSession
from serve.permissions.mediator import OpenPermission, request_decision
from serve.permissions.voting import PermissionOption
from serve.sessions import elicitation_side

if TYPE_CHECKING:
    from serve.events import EventLog
    from serve.permissions.effects import EffectGate
    from serve.permissions.mediator import PermissionMediator
    from serve.permissions.modes import AgentModes
    from serve.sessions.agent_link import AgentLink
    from serve.sessions.clients import ClientTable
    from serve.sessions.prompt_queue import PromptQueue

_encoder = msgspec.json.Encoder()


class _PermissionHead(msgspec.Struct, frozen=True, rename="camel"):
    tool_call: msgspec.Raw
    options: msgspec.Raw


_permission_head = msgspec.json.Decoder(_PermissionHead)


class SidePort(EffectSession, Protocol):
    """What the agent side needs of its session (the session actor implements it); the
    session is also what the effect gate reads (:class:`EffectSession`)."""

    session_id: str
    log: EventLog
    prompts: PromptQueue
    mediator: PermissionMediator
    clients: ClientTable
    closing: bool
    link: AgentLink
    effects: EffectGate | None
    current_mode: str | None

    def agent_modes(self) -> AgentModes: ...

    def on_usage(self, update: msgspec.Raw) -> None:
        """A ``usage_update`` was relayed (the session's budget, serve/sessions/budget.py)."""
        ...


class AgentSide(BaseClientHandler):
    """The session's ClientHandler (see the module docstring), behind :class:`SidePort`.

    It owns what only the connection's tasks touch (early updates, the encoded update head,
    the replay flag, the last ``available_commands_update``, url elicitation ids, the update
    count); it writes the session only through the port (its log, ``current_mode``)."""

    def __init__(self, session: SidePort) -> None:
        BaseClientHandler.__init__(self)
        self.s = session
        self._early: list[tuple[str, msgspec.Raw]] = []
        #: The journal of a new session is being opened: updates wait in ``_early`` (else
        #: the first ones, e.g. available_commands_update, could miss the journal).
        self.journal_pending = False
        self._update_head: bytes | None = None
        #: True while the agent replays history the session's log already holds.
        self.drop_updates = False
        self.available_commands: msgspec.Raw | None = None
        self.elicitation_url_ids: OrderedDict[str, None] = OrderedDict()
        #: ``session/update``s the agent sent for this session (serve/sessions/steering.py).
        self.agent_updates = 0

    def flush_early_updates(self) -> None:
        """The session id is known: relay what the agent sent before it."""
        for kind, update in self._early:
            self.relay(kind, update)
        self._early.clear()

    async def flow_control(self, incoming_bytes: int = 0) -> None:
        """Between chunks read from the agent: let lagging SSE writers catch up."""
        await self.s.log.wait_drained(incoming_bytes=incoming_bytes)

    def on_oversized_line(self, size: int, limit: int, session_id: str | None = None) -> None:
        """The agent wrote a line over ``--max-agent-line-bytes``: it was dropped, say so
        (on a shared child only the session the line names hears of it: ``acp/mux.py``)."""
        active = self.s.prompts.running
        self.s.log.publish(
            "agent_output_dropped",
            {
                "sessionId": self.s.session_id,
                "reason": "line_too_long",
                "sizeBytes": size,
                "maxBytes": limit,
            },
            prompt_id=active.prompt_id if active else None,
            originator=active.client_id if active else None,
        )

    def on_session_update(self, session_id: str, kind: str, update: msgspec.Raw) -> None:
        if self.drop_updates:
            return  # history replayed by session/load after a restart: already in the log
        if not self.s.session_id:
            self._early.append((kind, update))
            return
        if session_id != self.s.session_id:
            return
        self.agent_updates += 1  # a steered turn is over once this stops growing
        if self.journal_pending:  # a new session's journal is opening: keep them for it
            self._early.append((kind, update))
            return
        self.relay(kind, update)

    def relay(self, kind: str, update: msgspec.Raw) -> None:
        if kind == "available_commands_update":
            self.available_commands = update
        elif kind == "current_mode_update":
            try:
                self.s.current_mode = msgspec.json.decode(bytes(update)).get("currentModeId")
            except (msgspec.DecodeError, AttributeError):
                pass
        elif kind == "config_option_update":  # a mode option the agent changed itself
            modes = self.s.agent_modes()
            if modes.source == "config" and modes.current is not None:
                self.s.current_mode = modes.current
        elif kind in ("tool_call", "tool_call_update") and self.s.effects is not None:
            self.s.effects.note_tool_call(self.s, update)  # paths an approval may name by id
        head = self._update_head
        if head is None:  # encoded once: the session id never changes after set-up
            head = self._update_head = b'{"sessionId":' + _encoder.encode(self.s.session_id)
        data = RawParts((head, b',"update":', update, b"}"))  # joined once, into the frame
        active = self.s.prompts.running
        self.s.log.publish(
            "session_update",
            data,
            prompt_id=active.prompt_id if active else None,
            originator=active.client_id if active else None,
        )
        if kind == "usage_update":
            self.s.on_usage(update)

    # Effects the agent asks of the Host go through the daemon's EffectGate (grants,
    # approval policy, the workspace boundary) when one is installed.

    def _traced(self, name: str, kind: str = "server") -> AbstractContextManager[telemetry.Span]:
        """The span of one request of the agent, under its turn's ``prompt.agent``."""
        active = self.s.prompts.running
        return telemetry.span(
            name,
            parent=active.agent_trace if active is not None else None,
            kind=kind,
            attributes={"rpc.method": name, "acp_serve.session_id": self.s.session_id},
        )

    async def read_text_file(self, params: ReadTextFileParams) -> str:
        gate = self.s.effects
        with self._traced("fs/read_text_file"):
            if gate is None:
                return await BaseClientHandler.read_text_file(self, params)
            return await gate.read_text_file(self.s, params)

    async def write_text_file(self, params: WriteTextFileParams) -> None:
        gate = self.s.effects
        with self._traced("fs/write_text_file"):
            if gate is None:
                return await BaseClientHandler.write_text_file(self, params)
            await gate.write_text_file(self.s, params)

    async def terminal_create(self, params: CreateTerminalParams) -> str:
        gate = self.s.effects
        with self._traced("terminal/create"):
            if gate is not None:
                await gate.check_terminal(self.s, params)
            return await BaseClientHandler.terminal_create(self, params)

    async def ext_request(self, method: str, params: msgspec.Raw) -> object:
        with self._traced(method):
            if method == elicitation_side.METHOD:
                return await elicitation_side.broker(self.s, self.elicitation_url_ids, params)
            return await BaseClientHandler.ext_request(self, method, params)

    def on_notification(self, method: str, params: msgspec.Raw) -> None:
        if method == elicitation_side.COMPLETE:
            elicitation_side.on_complete(self.s, self.elicitation_url_ids, params)
            return
        BaseClientHandler.on_notification(self, method, params)

    async def request_permission(
        self, params: RequestPermissionParams, raw: msgspec.Raw
    ) -> PermissionOutcome:
        if params.session_id != self.s.session_id or self.s.closing:
            return CancelledPermissionOutcome()
        gate = self.s.effects
        if gate is not None:  # the approval policy first: deny/auto answer without asking
            screened = await gate.screen_agent_permission(self.s, params)
            if screened is not None:
                return screened
        with self._traced("permission.wait", "internal") as span:
            outcome = await self._mediate_permission(params, raw)
            selected = isinstance(outcome, SelectedPermissionOutcome)
            span.set_attribute("acp_serve.outcome", "selected" if selected else "cancelled")
        if isinstance(outcome, SelectedPermissionOutcome) and gate is not None:
            # an allowed tool call's own fs/terminal effect: ask once
            gate.note_agent_permission(self.s, params, outcome)
        return outcome

    async def _mediate_permission(
        self, params: RequestPermissionParams, raw: msgspec.Raw
    ) -> PermissionOutcome:
        """Ask the session's clients through the PermissionMediator actor."""
        head = _permission_head.decode(bytes(raw))
        active = self.s.prompts.running
        options = tuple(
            PermissionOption(option_id=o.option_id, kind=o.kind, name=o.name)
            for o in params.options
        )
        try:
            response = await request_decision(
                self.s.mediator,
                OpenPermission(
                    session_id=self.s.session_id,
                    session=self.s,
                    tool_call=head.tool_call,
                    options=head.options,
                    option_list=options,
                    prompt_id=active.prompt_id if active else None,
                    originator=active.client_id if active else None,
                    session_clients=self.s.clients.voters(),
                ),
                timeout_s=10,
            )
        except ActorError:
            return CancelledPermissionOutcome()
        outcome = response.get("outcome", {})
        if outcome.get("outcome") == "selected":
            return SelectedPermissionOutcome(option_id=outcome["optionId"])
        return CancelledPermissionOutcome()
