"""The PermissionMediator actor: owns timers and I/O around the pure voting state machine.

Theory of operation
-------------------
Pending permission requests of every session live in one
:class:`serve.permissions.voting.Mediator` (pure, table-tested). This actor is its only
owner. Sessions send :class:`OpenPermission` (answered with a :class:`Waiter` the session's
request task then awaits; :func:`request_decision` is that whole exchange), HTTP routes
send :class:`CastVote`, sessions send :class:`CancelSessionPermissions` on cancel/close/death
and :class:`CancelPromptPermissions` when a turn ends.

Withdrawn requests leave at once: when the agent withdraws its request (``$/cancel_request``
cancels the waiting task) :func:`request_decision` sends :class:`CancelRequest`, and when a
turn ends the session sends :class:`CancelPromptPermissions`; either resolves the request
``cancelled`` (``permission_resolved {outcome: cancelled}``) and frees its slot, so a looping
agent never fills the per-session (64) or daemon-wide (4096) caps, even with
``--permission-response-timeout-ms 0``. A request opened for a prompt that already ended is
answered ``cancelled`` at once (its ``OpenPermission`` raced the turn's end).

Events (single writer): the mediator never writes a session's log. Every event of a result
becomes a :class:`~serve.events.messages.PublishEvent` posted, in order, to the owning
session actor through an :class:`~actors.outbox.Outbox` (straight into its inbox; when the
inbox is full, into an ordered, bounded spill queue delivered by a courier task, never
blocking this actor). Ordering: one sender, one FIFO per session, so ``permission_request``
precedes its ``permission_resolved``; and a :class:`Waiter` completes with the agent's
answer only once the session has *handled* the ``permission_resolved`` event
(``Waiter.published``), so the agent's updates after the answer come after it in the log.

Elicitations (an agent's ``elicitation/create``, :mod:`serve.permissions.elicitation`) are
requests of the same table: :class:`OpenElicitation` opens one (``elicitation_request``),
:class:`CastElicitation` answers it after a strict check against the request, and every end
above resolves it too (``elicitation_resolved``; the agent gets ``{action: "cancel"}``).
A permission vote never resolves an elicitation, nor the reverse.

A timer task sleeps until the earliest deadline (``--permission-response-timeout-ms``) and
asks the actor to expire what is due. If the actor stops or crashes, ``on_stop`` answers
every outstanding waiter ``cancelled``: an agent is never left hanging. The supervisor
restarts it (permanent) with an empty table.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import msgspec
import trio

from actors import Actor, ActorError, Mailbox, Reply
from actors.actor import Request
from actors.outbox import Outbox
from serve.events.messages import PublishEvent
from serve.permissions import elicitation
from serve.permissions.voting import (
    CancelReason,
    Mediator,
    NotPending,
    OpenRejected,
    PartialVote,
    PermissionEvent,
    PermissionOption,
    Policy,
    Resolved,
    Selected,
    Vote,
    VoteResult,
)

log = logging.getLogger(__name__)

CANCELLED_RESPONSE: dict[str, Any] = {"outcome": {"outcome": "cancelled"}}
ELICIT_CANCELLED: dict[str, Any] = {"action": "cancel"}
#: Resolved elicitation ids remembered (as the voting machine remembers resolved requests).
RESOLVED_MEMORY = 512
#: Ended prompts remembered per mediator (an OpenPermission racing its turn's end).
MAX_ENDED_PROMPTS = 4096
#: Seconds a requester waits for the session to have published the resolution.
PUBLISHED_WAIT_S = 10.0


def _now_ms() -> int:
    return int(time.time() * 1000)


class Waiter(Reply[dict[str, Any]]):
    """One-shot: the agent's answer for one permission request.

    ``published`` completes once the session handled the resolution's last event."""

    __slots__ = ("published", "request_id")

    def __init__(self, request_id: str) -> None:
        super().__init__()
        self.request_id = request_id
        self.published: Reply[object] | None = None

    async def answer(self) -> dict[str, Any]:
        """The answer, returned once its events are in the session's log (bounded)."""
        response = await self.wait()
        published = self.published
        if published is not None:
            with trio.move_on_after(PUBLISHED_WAIT_S):
                try:
                    await published.wait()
                except Exception:  # dropped or the session is gone: answer anyway
                    pass
        return response


class OpenPermission(msgspec.Struct, Request[Waiter], frozen=True):
    session_id: str
    session: object  # the session actor (receives PublishEvent); messages within one process
    tool_call: msgspec.Raw
    options: msgspec.Raw
    option_list: tuple[PermissionOption, ...]
    prompt_id: str | None
    originator: str | None
    session_clients: frozenset[str]
    request_id: str | None = None  # chosen by the requester, so it can withdraw it early


class CastVote(msgspec.Struct, Request[VoteResult], frozen=True):
    request_id: str
    session_id: str | None  # None: the legacy POST /permission/:requestId route
    body: object  # the client's JSON, checked by the vote
    client_id: str | None
    from_loopback: bool


class OpenElicitation(msgspec.Struct, Request[Waiter], frozen=True):
    """An agent's ``elicitation/create`` (validated): held and voted like a permission."""

    session_id: str
    session: object  # as OpenPermission's
    spec: elicitation.Spec
    prompt_id: str | None
    originator: str | None
    session_clients: frozenset[str]
    request_id: str | None = None


class CastElicitation(msgspec.Struct, Request[VoteResult | str], frozen=True):
    """A client's answer ``{action, content?, _meta?}`` to an elicitation (a vote)."""

    request_id: str
    session_id: str | None
    body: object  # the client's JSON, checked by the vote
    client_id: str | None
    from_loopback: bool


class CancelSessionPermissions(msgspec.Struct, frozen=True):
    session_id: str
    reason: CancelReason = "session_closed"
    forget: bool = False  # the session is gone: drop its log too


class CancelRequest(msgspec.Struct, frozen=True):
    request_id: str


class CancelPromptPermissions(msgspec.Struct, frozen=True):
    """A turn ended: its still-pending requests resolve ``cancelled`` (``turn_ended``)."""

    session_id: str
    prompt_id: str


class Expire(msgspec.Struct, frozen=True):
    pass


class SessionOf(msgspec.Struct, frozen=True):
    request_id: str


MediatorMsg = (
    OpenPermission
    | OpenElicitation
    | CastElicitation
    | CastVote
    | CancelSessionPermissions
    | CancelRequest
    | CancelPromptPermissions
    | Expire
    | SessionOf
)


class PermissionMediator(Actor[MediatorMsg]):
    def __init__(
        self,
        *,
        policy: Policy = "first-responder",
        consensus_quorum: int | None = None,
        response_timeout_ms: int = 300_000,
    ) -> None:
        super().__init__("permission-mediator", inbox_size=1024)
        self.policy = policy
        self.consensus_quorum = consensus_quorum
        self.response_timeout_ms = response_timeout_ms
        self.state = self._fresh()
        self._waiters: dict[str, Waiter] = {}
        self._sessions: dict[str, Mailbox[PublishEvent]] = {}  # session id -> its actor
        self._ended: OrderedDict[tuple[str, str], None] = OrderedDict()
        #: Open elicitations (a subset of the state's pending requests), by request id, and
        #: the last resolved ones (as many as the state remembers resolved requests).
        self._elicitations: dict[str, elicitation.Pending] = {}
        self._elicited: OrderedDict[str, None] = OrderedDict()
        self.outbox = Outbox("permission-mediator")
        self._rearm = trio.Event()

    def _fresh(self) -> Mediator:
        return Mediator(
            policy=self.policy,
            consensus_quorum=self.consensus_quorum,
            response_timeout_ms=self.response_timeout_ms,
        )

    # ---- lifecycle ---------------------------------------------------------------------

    async def run(
        self, *, task_status: trio.TaskStatus[Actor[MediatorMsg]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with trio.open_nursery() as nursery:
            self.outbox.bind(nursery)
            nursery.start_soon(self._timer)
            try:
                await super().run(task_status=task_status)
            finally:
                self.outbox.bind(None)
            nursery.cancel_scope.cancel()

    async def on_start(self) -> None:
        self.state = self._fresh()

    async def on_stop(self) -> None:
        for resolved in self.state.cancel_all("daemon_shutdown"):
            self._apply(resolved)
        for rid, waiter in self._waiters.items():
            waiter.set(ELICIT_CANCELLED if rid in self._elicitations else CANCELLED_RESPONSE)
        self._waiters.clear()
        self._elicitations.clear()

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

    async def handle(self, msg: MediatorMsg) -> object:
        match msg:
            case OpenPermission():
                return self._open(msg)
            case OpenElicitation():
                return self._open_elicitation(msg)
            case CastElicitation():
                return self._cast_elicitation(msg)
            case CastVote():
                if msg.request_id in self._elicitations or msg.request_id in self._elicited:
                    # an elicitation is answered by its own route only
                    return NotPending(msg.request_id, msg.session_id, "unknown")
                result = self.state.vote_body(
                    msg.request_id,
                    msg.body,
                    client_id=msg.client_id,
                    from_loopback=msg.from_loopback,
                    session_id=msg.session_id,
                )
                self._apply(result)
                return result
            case CancelSessionPermissions(session_id=sid, reason=reason, forget=forget):
                for resolved in self.state.cancel_session(sid, reason):
                    self._apply(resolved)
                if forget:
                    self._sessions.pop(sid, None)
                return None
            case CancelPromptPermissions(session_id=sid, prompt_id=pid):
                self._ended[(sid, pid)] = None
                while len(self._ended) > MAX_ENDED_PROMPTS:
                    self._ended.popitem(last=False)
                for resolved in self.state.cancel_prompt(sid, pid):
                    self._apply(resolved)
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

    def _admit(
        self,
        msg: OpenPermission | OpenElicitation,
        *,
        what: str,
        refused: dict[str, Any],
        options: Sequence[PermissionOption],
        option_prefixes: tuple[str, ...] = (),
    ) -> tuple[Waiter, bool]:
        """What a permission and an elicitation request share: its waiter, and whether it is
        pending now (False: ``refused`` is already its answer: its turn ended on the way, its
        id is in use, or the voting machine refused it)."""
        request_id = msg.request_id or str(uuid.uuid4())
        waiter = Waiter(request_id)
        if msg.prompt_id is not None and (msg.session_id, msg.prompt_id) in self._ended:
            waiter.set(refused)  # the turn ended while this was on its way
            return waiter, False
        if self.state.get(request_id) is not None or self.state.session_of(request_id):
            log.warning("%s request id %s reused; refused", what, request_id)
            waiter.set(refused)
            return waiter, False
        opened = self.state.open(
            request_id=request_id,
            session_id=msg.session_id,
            options=options,
            now_ms=_now_ms(),
            originator_client_id=msg.originator,
            session_clients=msg.session_clients,
            prompt_id=msg.prompt_id,
            option_prefixes=option_prefixes,
        )
        if isinstance(opened, OpenRejected):
            log.warning("%s request refused: %s", what, opened.reason)
            waiter.set(refused)
            return waiter, False
        if isinstance(msg.session, Actor):
            self._sessions[msg.session_id] = msg.session
        self._waiters[request_id] = waiter
        self._rearm.set()
        return waiter, True

    def _open(self, msg: OpenPermission) -> Waiter:
        waiter, pending = self._admit(
            msg, what="permission", refused=CANCELLED_RESPONSE, options=msg.option_list
        )
        if pending:
            data = msgspec.Raw(
                b'{"requestId":"%s","sessionId":%s,"toolCall":%s,"options":%s}'
                % (
                    waiter.request_id.encode(),
                    msgspec.json.encode(msg.session_id),
                    bytes(msg.tool_call),
                    bytes(msg.options),
                )
            )
            self._post(
                msg.session_id,
                PublishEvent(
                    "permission_request", data, prompt_id=msg.prompt_id, originator=msg.originator
                ),
            )
            log.info("session %s: permission %s asked", msg.session_id, waiter.request_id)
        return waiter

    def _open_elicitation(self, msg: OpenElicitation) -> Waiter:
        waiter, pending = self._admit(
            msg,
            what="elicitation",
            refused=ELICIT_CANCELLED,
            options=elicitation.OPTIONS,
            option_prefixes=(elicitation.ACCEPT_PREFIX,),
        )
        if pending:
            self._elicitations[waiter.request_id] = elicitation.Pending(msg.spec)
            self._post(
                msg.session_id,
                PublishEvent(
                    "elicitation_request",
                    msg.spec.event_data(waiter.request_id),
                    prompt_id=msg.prompt_id,
                    originator=msg.originator,
                ),
            )
        return waiter

    def _cast_elicitation(self, msg: CastElicitation) -> VoteResult | str:
        """The answer counted: its vote result, or why the answer was refused (a message);
        the fronts render either (``serve/errors/votes.py``)."""
        pending = self._elicitations.get(msg.request_id)
        owner = self.state.session_of(msg.request_id) if pending is not None else None
        if pending is None or (msg.session_id is not None and owner != msg.session_id):
            if pending is None and msg.request_id in self._elicited:
                # resolved already: the voting machine says so (elicitation_already_resolved)
                result = elicitation.vote_events(
                    self.state.vote_body(
                        msg.request_id,
                        {"outcome": {"outcome": "cancelled"}},
                        client_id=msg.client_id,
                        from_loopback=msg.from_loopback,
                        session_id=msg.session_id,
                    )
                )
                self._apply(result)
                return result
            return NotPending(msg.request_id, msg.session_id, "unknown")
        answer = elicitation.parse_answer(pending.spec, msg.body)
        if isinstance(answer, str):
            return answer
        outcome = elicitation.outcome_of(answer)
        result = elicitation.vote_events(
            self.state.vote(
                msg.request_id,
                Vote(msg.client_id, msg.from_loopback, outcome, answer.meta),
                session_id=msg.session_id,
            )
        )
        counted = isinstance(result, Resolved) or (
            isinstance(result, PartialVote) and not result.duplicate
        )
        if counted and isinstance(outcome, Selected):  # one per voter: bounded
            pending.contents.setdefault(outcome.option_id, answer.content)
        self._apply(result)
        return result

    def _post(self, session_id: str, event: PublishEvent) -> None:
        session = self._sessions.get(session_id)
        if session is not None:
            self.outbox.post(session, event)

    def _publish(
        self, session_id: str, events: tuple[PermissionEvent, ...]
    ) -> Reply[object] | None:
        """Post ``events`` to the session in order; the last one's delivery Reply."""
        session = self._sessions.get(session_id)
        if session is None:
            return None
        last: Reply[object] | None = None
        for event in events:
            last = self.outbox.post(
                session,
                PublishEvent(event.type, event.data, originator=event.originator_client_id),
            )
        return last

    def _apply(self, result: VoteResult | Resolved) -> None:
        events = getattr(result, "events", ())
        session_id = getattr(result, "session_id", None)
        pending = None
        if isinstance(result, Resolved):
            session_id = result.request.session_id
            pending = self._elicitations.pop(result.request.request_id, None)
            if pending is not None:
                events = elicitation.resolved_events(result, pending)
                self._elicited[result.request.request_id] = None
                while len(self._elicited) > RESOLVED_MEMORY:
                    self._elicited.popitem(last=False)
        elif session_id is None and events:
            session_id = self.state.session_of(getattr(result, "request_id", ""))
        published = None
        if session_id is not None and events:
            published = self._publish(session_id, events)
        if isinstance(result, Resolved):
            waiter = self._waiters.pop(result.request.request_id, None)
            if waiter is not None:
                waiter.published = published
                waiter.set(
                    result.agent_response()
                    if pending is None
                    else elicitation.agent_response(result, pending)
                )

    # ---- read models -------------------------------------------------------------------

    def pending_count(self, session_id: str | None = None) -> int:
        if session_id is None:
            return self.state.pending_count
        return len(self.state.pending_for(session_id))

    def snapshot(self) -> dict[str, Any]:
        return self.state.snapshot()


async def request_decision(
    mediator: PermissionMediator,
    msg: OpenPermission | OpenElicitation,
    *,
    timeout_s: float = 10.0,
) -> dict[str, Any]:
    """Open ``msg`` and wait for the ACP answer; withdraw the request if we are cancelled.

    The caller's task is cancelled when the agent withdraws its request (``$/cancel_request``)
    or the session goes away; the request then leaves the mediator at once
    (:class:`CancelRequest`, shielded and bounded) instead of waiting for a timeout.
    ``ActorError`` (the mediator is unavailable) propagates.
    """
    if msg.request_id is None:
        msg = msgspec.structs.replace(msg, request_id=str(uuid.uuid4()))
    assert msg.request_id is not None
    answered = False
    try:
        waiter: Waiter = await mediator.ask(msg, timeout_s=timeout_s)
        response = await waiter.answer()
        answered = waiter.done
        return response
    finally:
        if not answered:
            with trio.CancelScope(shield=True), trio.move_on_after(timeout_s):
                try:
                    await mediator.tell(CancelRequest(msg.request_id))
                except ActorError:
                    pass
