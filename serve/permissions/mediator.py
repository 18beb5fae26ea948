"""The PermissionMediator actor: owns timers and I/O around the pure voting state machine.

Theory of operation
-------------------
Pending permission requests of every session live in one
:class:`serve.permissions.voting.Mediator` (pure, table-tested). This actor is its only
owner. Sessions send :class:`OpenPermission` (answered with a :class:`Waiter` the session's
request task then awaits), HTTP routes send :class:`CastVote`, sessions send
:class:`CancelSessionPermissions` on cancel/close/death. Every result's events are published
on the owning session's :class:`~serve.events.EventLog` in order; a resolution then
completes the waiter with the ACP answer for the agent.

A timer task sleeps until the earliest deadline (``--permission-response-timeout-ms``) and
asks the actor to expire what is due. If the actor stops or crashes, ``on_stop`` answers
every outstanding waiter ``cancelled``: an agent is never left hanging. The supervisor
restarts it (permanent) with an empty table.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import msgspec
import trio

from actors import Actor, Reply
from serve.events import EventLog
from serve.permissions.voting import (
    Mediator,
    OpenRejected,
    PermissionEvent,
    PermissionOption,
    Resolved,
    VoteResult,
    vote_http_response,
)

log = logging.getLogger(__name__)

CANCELLED_RESPONSE: dict[str, Any] = {"outcome": {"outcome": "cancelled"}}


def _now_ms() -> int:
    return int(time.time() * 1000)


class Waiter(Reply[dict[str, Any]]):
    """One-shot: the agent's answer for one permission request."""

    __slots__ = ("request_id",)

    def __init__(self, request_id: str) -> None:
        super().__init__()
        self.request_id = request_id


class OpenPermission(msgspec.Struct, frozen=True):
    session_id: str
    log: Any  # EventLog (not a wire type; messages between actors in one process)
    tool_call: msgspec.Raw
    options: msgspec.Raw
    option_list: tuple[PermissionOption, ...]
    prompt_id: str | None
    originator: str | None
    session_clients: frozenset[str]


class CastVote(msgspec.Struct, frozen=True):
    request_id: str
    session_id: str | None  # None: the legacy POST /permission/:requestId route
    body: Any
    client_id: str | None
    from_loopback: bool


class CancelSessionPermissions(msgspec.Struct, frozen=True):
    session_id: str
    reason: str = "session_closed"
    forget: bool = False  # the session is gone: drop its log too


class CancelRequest(msgspec.Struct, frozen=True):
    request_id: str


class Expire(msgspec.Struct, frozen=True):
    pass


class SessionOf(msgspec.Struct, frozen=True):
    request_id: str


MediatorMsg = (
    OpenPermission | CastVote | CancelSessionPermissions | CancelRequest | Expire | SessionOf
)


class PermissionMediator(Actor[MediatorMsg]):
    def __init__(
        self,
        *,
        policy: str = "first-responder",
        consensus_quorum: int | None = None,
        response_timeout_ms: int = 300_000,
    ) -> None:
        super().__init__("permission-mediator", inbox_size=1024)
        self.policy = policy
        self.consensus_quorum = consensus_quorum
        self.response_timeout_ms = response_timeout_ms
        self.state = self._fresh()
        self._waiters: dict[str, Waiter] = {}
        self._logs: dict[str, EventLog] = {}
        self._rearm = trio.Event()

    def _fresh(self) -> Mediator:
        return Mediator(
            policy=self.policy,  # type: ignore[arg-type]
            consensus_quorum=self.consensus_quorum,
            response_timeout_ms=self.response_timeout_ms,
        )

    # ---- lifecycle ---------------------------------------------------------------------

    async def run(
        self, *, task_status: trio.TaskStatus[Actor[MediatorMsg]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._timer)
            await super().run(task_status=task_status)
            nursery.cancel_scope.cancel()

    async def on_start(self) -> None:
        self.state = self._fresh()

    async def on_stop(self) -> None:
        for resolved in self.state.cancel_all("daemon_shutdown"):
            self._apply(resolved)
        for waiter in self._waiters.values():
            waiter.set(CANCELLED_RESPONSE)
        self._waiters.clear()

    async def _timer(self) -> None:
        while True:
            deadline = self.state.next_deadline_ms()
            rearm = self._rearm
            if deadline is None:
                await rearm.wait()
            else:
                with trio.move_on_after(max(0.0, (deadline - _now_ms()) / 1000)):
                    await rearm.wait()
                if not rearm.is_set():
                    await self.tell(Expire())
            if rearm.is_set():
                self._rearm = trio.Event()

    # ---- handling ----------------------------------------------------------------------

    async def handle(self, msg: MediatorMsg) -> Any:
        match msg:
            case OpenPermission():
                return self._open(msg)
            case CastVote():
                result = self.state.vote_body(
                    msg.request_id,
                    msg.body,
                    client_id=msg.client_id,
                    from_loopback=msg.from_loopback,
                    session_id=msg.session_id,
                )
                self._apply(result)
                return vote_http_response(result, legacy=msg.session_id is None)
            case CancelSessionPermissions(session_id=sid, reason=reason, forget=forget):
                for resolved in self.state.cancel_session(sid, reason):  # type: ignore[arg-type]
                    self._apply(resolved)
                if forget:
                    self._logs.pop(sid, None)
                return None
            case CancelRequest(request_id=rid):
                cancelled = self.state.cancel(rid, "agent_cancelled")
                if cancelled is not None:
                    self._apply(cancelled)
                return None
            case Expire():
                for resolved in self.state.expire(_now_ms()):
                    self._apply(resolved)
                return None
            case SessionOf(request_id=rid):
                return self.state.session_of(rid)

    def _open(self, msg: OpenPermission) -> Waiter:
        request_id = str(uuid.uuid4())
        waiter = Waiter(request_id)
        opened = self.state.open(
            request_id=request_id,
            session_id=msg.session_id,
            options=msg.option_list,
            now_ms=_now_ms(),
            originator_client_id=msg.originator,
            session_clients=msg.session_clients,
            prompt_id=msg.prompt_id,
        )
        if isinstance(opened, OpenRejected):
            log.warning("permission request refused: %s", opened.reason)
            waiter.set(CANCELLED_RESPONSE)
            return waiter
        self._logs[msg.session_id] = msg.log
        self._waiters[request_id] = waiter
        data = msgspec.Raw(
            b'{"requestId":"%s","sessionId":%s,"toolCall":%s,"options":%s}'
            % (
                request_id.encode(),
                msgspec.json.encode(msg.session_id),
                bytes(msg.tool_call),
                bytes(msg.options),
            )
        )
        msg.log.publish(
            "permission_request", data, prompt_id=msg.prompt_id, originator=msg.originator
        )
        self._rearm.set()
        return waiter

    def _publish(self, session_id: str, events: tuple[PermissionEvent, ...]) -> None:
        event_log = self._logs.get(session_id)
        if event_log is None:
            return
        for event in events:
            event_log.publish(event.type, event.data, originator=event.originator_client_id)

    def _apply(self, result: VoteResult | Resolved) -> None:
        events = getattr(result, "events", ())
        session_id = getattr(result, "session_id", None)
        if isinstance(result, Resolved):
            session_id = result.request.session_id
        elif session_id is None and events:
            session_id = self.state.session_of(getattr(result, "request_id", ""))
        if session_id is not None and events:
            self._publish(session_id, events)
        if isinstance(result, Resolved):
            waiter = self._waiters.pop(result.request.request_id, None)
            if waiter is not None:
                waiter.set(result.agent_response())

    # ---- read models -------------------------------------------------------------------

    def pending_count(self, session_id: str | None = None) -> int:
        if session_id is None:
            return self.state.pending_count
        return len(self.state.pending_for(session_id))

    def snapshot(self) -> dict[str, Any]:
        return self.state.snapshot()
