"""Multi-client permission voting: the pure state machine behind the PermissionMediator actor.

Theory of operation
-------------------
When an agent asks ``session/request_permission`` and the approval policy says ``prompt``,
the session actor assigns a request id and calls ``Mediator.open(...)``; the request is then
*pending* until exactly one of these resolves it:

* a vote (``Mediator.vote``) that the request's policy accepts as deciding;
* a ``cancelled`` vote, honoured from **any** voter under **every** policy;
* ``expire(now_ms)`` after ``response_timeout_ms`` (0 = never) → cancelled, ``timeout``;
* ``cancel_session`` (session cancel/close/death), ``cancel_prompt`` (one turn ended),
  ``cancel_all`` (daemon shutdown, mediator restart), ``cancel`` (one request).

The policy is frozen into the request when it is opened (spec §7.6):

==================  ===========================================================================
first-responder     the first valid vote resolves.
designated          only the prompt originator's client id resolves; anonymous prompt → as
                    first-responder; anyone else → ``Forbidden(designated_mismatch)``.
consensus           electorate M = client ids registered on the session at request time;
                    outsiders and anonymous voters → ``Forbidden(designated_mismatch)``.
                    quorum = ``consensusQuorum`` capped to ``max(|M|, 1)``, else
                    ``floor(|M|/2)+1``. Each voter counts once (a repeat vote is a recorded
                    no-op). An option whose tally reaches quorum resolves; otherwise
                    ``PartialVote`` (``votesNeeded = max(quorum - max tally, 1)``). With
                    |M| = 0 only cancel/timeout can end it.
local-only          only loopback voters resolve; remote → ``Forbidden(remote_not_allowed)``.
==================  ===========================================================================

Check order for a vote: pending? (else ``NotPending``: ``already_resolved`` if remembered in
the bounded LRU of resolved requests, else ``unknown``; a request of another session is
``unknown``) → a cancel resolves → option valid? (else ``InvalidOption``; the reserved
``__cancelled__`` is never valid) → policy.

Nothing here does I/O or reads a clock: time arrives as ``now_ms`` numbers, and everything
that must become an SSE event is returned as ``PermissionEvent`` data on the result (the
actor publishes them in order, then answers the agent with ``Resolved.agent_response()``).
All tables are bounded: pending per session and in total (``open`` refuses beyond), and the
resolved-request memory (LRU). Caller bugs (duplicate request ids, negative timeouts) raise
``ValueError``; agent protocol violations (an option id equal to the cancel sentinel) are
returned as ``OpenRejected`` so the actor can answer the agent ``cancelled``.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal

import msgspec

from serve.permissions.config import POLICIES, Policy

log = logging.getLogger(__name__)

__all__ = [
    "CANCEL_SENTINEL",
    "META_ERROR",
    "OUTCOME_ERROR",
    "POLICIES",
    "CancelReason",
    "Cancelled",
    "Forbidden",
    "InvalidOption",
    "MalformedOutcome",
    "Mediator",
    "NotPending",
    "OpenRejected",
    "Outcome",
    "PartialVote",
    "PendingRequest",
    "PermissionEvent",
    "PermissionOption",
    "Policy",
    "Resolved",
    "Selected",
    "Vote",
    "VoteResult",
    "consensus_quorum",
    "parse_vote_body",
]

CANCEL_SENTINEL = "__cancelled__"
OUTCOME_ERROR = (
    '`outcome` must be `{ outcome: "cancelled" }` or `{ outcome: "selected", optionId: string }`'
)
META_ERROR = "`_meta` must be an object"
CANCEL_META_KEY = "qwen.daemon.permissionCancelReason"

CancelReason = Literal[
    "voter", "timeout", "agent_cancelled", "session_closed", "turn_ended", "daemon_shutdown"
]
ForbiddenReason = Literal["designated_mismatch", "remote_not_allowed"]


# -- wire-ish types ------------------------------------------------------------------------


class Selected(msgspec.Struct, frozen=True, tag="selected", tag_field="outcome", rename="camel"):
    """``{"outcome": "selected", "optionId": "..."}``"""

    option_id: Annotated[str, msgspec.Meta(min_length=1)]


class Cancelled(msgspec.Struct, frozen=True, tag="cancelled", tag_field="outcome"):
    """``{"outcome": "cancelled"}``"""


Outcome = Selected | Cancelled


class PermissionOption(msgspec.Struct, frozen=True):
    """One option the agent offered (``kind``: ``allow_once``, ``allow_always``, ...)."""

    option_id: str
    kind: str | None = None
    name: str | None = None


class Vote(msgspec.Struct, frozen=True):
    """A vote: who (daemon-issued client id or ``None``), from where, and what.

    ``meta`` is the allowed response metadata forwarded to the agent on resolution (only the
    ACP ``_meta`` object of the body is kept, see ``parse_vote_body``).
    """

    client_id: str | None
    from_loopback: bool
    outcome: Outcome
    meta: dict[str, Any] | None = None


class PendingRequest(msgspec.Struct, frozen=True):
    """A request as opened; immutable (votes live in the mediator)."""

    request_id: str
    session_id: str
    options: tuple[PermissionOption, ...]
    created_at_ms: int
    policy: Policy
    designated_client_id: str | None = None  # the prompt originator (designated policy)
    voters: frozenset[str] = frozenset()  # consensus electorate at request time
    quorum: int = 1
    deadline_ms: int | None = None  # None = waits forever
    prompt_id: str | None = None
    #: Option ids starting with one of these are valid too (an elicitation's
    #: ``accept:<content digest>``, serve/permissions/elicitation.py).
    option_prefixes: tuple[str, ...] = ()

    def option_ids(self) -> tuple[str, ...]:
        return tuple(o.option_id for o in self.options)

    def offers(self, option_id: str) -> bool:
        return option_id in self.option_ids() or option_id.startswith(self.option_prefixes)


class PermissionEvent(msgspec.Struct, frozen=True):
    """An event to publish on the session's bus: ``type``, payload ``data``, envelope origin."""

    type: str
    data: dict[str, Any]
    originator_client_id: str | None = None


def _outcome_wire(outcome: Outcome) -> dict[str, Any]:
    return msgspec.to_builtins(outcome)  # type: ignore[no-any-return]  # msgspec: Any; a dict here


# -- results -------------------------------------------------------------------------------


class Resolved(msgspec.Struct, frozen=True):
    """The request is over. Publish ``events``, then answer the agent ``agent_response()``."""

    request: PendingRequest
    outcome: Outcome
    voter_client_id: str | None
    reason: CancelReason | None  # why it was cancelled; None when an option was selected
    voters: tuple[str, ...] = ()  # clients whose votes decided (consensus: the quorum)
    meta: dict[str, Any] | None = None
    events: tuple[PermissionEvent, ...] = ()

    def agent_response(self) -> dict[str, Any]:
        """The ACP ``session/request_permission`` result for the agent."""
        out: dict[str, Any] = {"outcome": _outcome_wire(self.outcome)}
        meta = dict(self.meta or {})
        if isinstance(self.outcome, Cancelled) and self.reason not in (None, "voter"):
            meta[CANCEL_META_KEY] = self.reason
        if meta:
            out["_meta"] = meta
        return out


class PartialVote(msgspec.Struct, frozen=True):
    """Consensus: the vote was recorded (HTTP 200) but no option has reached quorum."""

    request_id: str
    session_id: str
    votes_received: int
    votes_needed: int
    quorum: int
    option_tallies: dict[str, int]
    duplicate: bool = False  # this voter had already voted: nothing changed, no event
    reachable: bool = True  # False: no option can reach quorum any more (only cancel/timeout)
    events: tuple[PermissionEvent, ...] = ()


class Forbidden(msgspec.Struct, frozen=True):
    """403 ``permission_forbidden``; publish ``events`` (``permission_forbidden``)."""

    request_id: str
    session_id: str
    client_id: str | None
    reason: ForbiddenReason
    events: tuple[PermissionEvent, ...] = ()


class InvalidOption(msgspec.Struct, frozen=True):
    """400 ``invalid_option_id``: not among the request's options, or the cancel sentinel."""

    request_id: str
    session_id: str
    option_id: str


class NotPending(msgspec.Struct, frozen=True):
    """404: unknown, another session's, or already resolved (then ``events`` holds
    ``permission_already_resolved``). ``session_id`` is the session the vote named."""

    request_id: str
    session_id: str | None
    reason: Literal["unknown", "already_resolved"]
    events: tuple[PermissionEvent, ...] = ()


class MalformedOutcome(msgspec.Struct, frozen=True):
    """400: the vote body's ``outcome`` is not a valid outcome object (``field``
    ``outcome``), or its ``_meta`` is not an object (``field`` ``_meta``)."""

    detail: str = ""
    field: Literal["outcome", "_meta"] = "outcome"


VoteResult = Resolved | PartialVote | Forbidden | InvalidOption | NotPending | MalformedOutcome


class OpenRejected(msgspec.Struct, frozen=True):
    """``open`` refused; the actor answers the agent ``cancelled`` at once (no event)."""

    request_id: str
    session_id: str
    reason: Literal["too_many_pending", "capacity", "cancel_sentinel_collision"]


# -- helpers -------------------------------------------------------------------------------


def parse_vote_body(body: object) -> tuple[Outcome, dict[str, Any] | None] | MalformedOutcome:
    """Validate a vote body ``{"outcome": {...}, "_meta"?: {...}}`` → (outcome, meta)."""
    if not isinstance(body, dict) or "outcome" not in body:
        return MalformedOutcome("body must be an object with an `outcome` member")
    try:
        outcome: Outcome = msgspec.convert(body["outcome"], Outcome)
    except msgspec.ValidationError as exc:
        return MalformedOutcome(str(exc))
    meta = body.get("_meta")
    if meta is not None and not isinstance(meta, dict):
        return MalformedOutcome(META_ERROR, "_meta")
    return outcome, (dict(meta) if meta else None)


def consensus_quorum(electorate: int, configured: int | None) -> int:
    """Quorum for an electorate of ``electorate`` clients (spec §7.6)."""
    if configured is not None:
        return max(1, min(configured, max(electorate, 1)))
    return electorate // 2 + 1


class _Entry:
    __slots__ = ("request", "votes")

    def __init__(self, request: PendingRequest) -> None:
        self.request = request
        self.votes: dict[str, str] = {}  # consensus: client id -> option id (first vote only)


class _Remembered(msgspec.Struct, frozen=True):
    session_id: str
    outcome: Outcome


# -- the state machine ---------------------------------------------------------------------


class Mediator:
    """Pending permission requests of every session, and their votes. Pure; not thread-safe
    (owned by one actor task)."""

    def __init__(
        self,
        *,
        policy: Policy = "first-responder",
        consensus_quorum: int | None = None,
        response_timeout_ms: int = 300_000,
        max_pending_per_session: int = 64,
        max_pending_total: int = 4096,
        resolved_memory: int = 512,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown permission policy {policy!r}")
        if consensus_quorum is not None and consensus_quorum < 1:
            raise ValueError(f"consensus quorum must be >= 1, got {consensus_quorum}")
        if response_timeout_ms < 0:
            raise ValueError(f"response timeout must be >= 0 ms, got {response_timeout_ms}")
        self._policy: Policy = policy
        self._quorum = consensus_quorum
        self._timeout_ms = response_timeout_ms
        self._max_per_session = max_pending_per_session
        self._max_total = max_pending_total
        self._memory = resolved_memory
        self._pending: dict[str, _Entry] = {}
        self._by_session: dict[str, dict[str, None]] = {}  # ordered sets of request ids
        self._resolved: OrderedDict[str, _Remembered] = OrderedDict()

    # -- inspection ------------------------------------------------------------------------

    @property
    def policy(self) -> Policy:
        return self._policy

    @property
    def response_timeout_ms(self) -> int:
        return self._timeout_ms

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def get(self, request_id: str) -> PendingRequest | None:
        entry = self._pending.get(request_id)
        return entry.request if entry else None

    def session_of(self, request_id: str) -> str | None:
        """The session of a pending or remembered request (legacy vote route)."""
        entry = self._pending.get(request_id)
        if entry is not None:
            return entry.request.session_id
        rem = self._resolved.get(request_id)
        return rem.session_id if rem else None

    def pending_for(self, session_id: str) -> list[PendingRequest]:
        ids = self._by_session.get(session_id, {})
        return [self._pending[r].request for r in ids]

    def next_deadline_ms(self) -> int | None:
        """The earliest deadline among pending requests (the actor sleeps until then)."""
        deadlines = [
            e.request.deadline_ms
            for e in self._pending.values()
            if e.request.deadline_ms is not None
        ]
        return min(deadlines) if deadlines else None

    def snapshot(self) -> dict[str, Any]:
        """For ``/daemon/status``: ``{"pending", "policy", "requests": [...]}``."""
        return {
            "pending": len(self._pending),
            "policy": self._policy,
            "requests": [
                {
                    "requestId": e.request.request_id,
                    "sessionId": e.request.session_id,
                    "policy": e.request.policy,
                    "createdAtMs": e.request.created_at_ms,
                    "deadlineMs": e.request.deadline_ms,
                    "votesReceived": len(e.votes),
                    "quorum": e.request.quorum,
                }
                for e in self._pending.values()
            ],
        }

    # -- opening ---------------------------------------------------------------------------

    def open(
        self,
        *,
        request_id: str,
        session_id: str,
        options: Sequence[PermissionOption],
        now_ms: int,
        originator_client_id: str | None = None,
        session_clients: Iterable[str] = (),
        prompt_id: str | None = None,
        timeout_ms: int | None = None,
        option_prefixes: tuple[str, ...] = (),
    ) -> PendingRequest | OpenRejected:
        """Register a request. ``session_clients``: client ids registered on the session
        now (the consensus electorate); ``timeout_ms`` overrides the mediator's default."""
        if request_id in self._pending or request_id in self._resolved:
            raise ValueError(f"permission request id {request_id!r} is already in use")
        if any(o.option_id == CANCEL_SENTINEL for o in options):
            return OpenRejected(request_id, session_id, "cancel_sentinel_collision")
        if len(self._by_session.get(session_id, {})) >= self._max_per_session:
            return OpenRejected(request_id, session_id, "too_many_pending")
        if len(self._pending) >= self._max_total:
            return OpenRejected(request_id, session_id, "capacity")
        timeout = self._timeout_ms if timeout_ms is None else timeout_ms
        if timeout < 0:
            raise ValueError(f"timeout must be >= 0 ms, got {timeout}")
        electorate = frozenset(session_clients) if self._policy == "consensus" else frozenset()
        quorum = consensus_quorum(len(electorate), self._quorum)
        req = PendingRequest(
            request_id=request_id,
            session_id=session_id,
            options=tuple(options),
            created_at_ms=now_ms,
            policy=self._policy,
            designated_client_id=originator_client_id,
            voters=electorate,
            quorum=quorum if self._policy == "consensus" else 1,
            deadline_ms=now_ms + timeout if timeout > 0 else None,
            prompt_id=prompt_id,
            option_prefixes=option_prefixes,
        )
        self._pending[request_id] = _Entry(req)
        self._by_session.setdefault(session_id, {})[request_id] = None
        return req

    # -- voting ----------------------------------------------------------------------------

    def vote_body(
        self,
        request_id: str,
        body: object,
        *,
        client_id: str | None,
        from_loopback: bool,
        session_id: str | None = None,
    ) -> VoteResult:
        """Parse an HTTP vote body, then ``vote``. A malformed body is checked first."""
        parsed = parse_vote_body(body)
        if isinstance(parsed, MalformedOutcome):
            return parsed
        outcome, meta = parsed
        return self.vote(
            request_id, Vote(client_id, from_loopback, outcome, meta), session_id=session_id
        )

    def vote(self, request_id: str, vote: Vote, *, session_id: str | None = None) -> VoteResult:
        """Apply one vote. ``session_id``: the session named by the route (None = legacy)."""
        entry = self._pending.get(request_id)
        if entry is None or (session_id is not None and entry.request.session_id != session_id):
            return self._not_pending(request_id, session_id, vote)
        req = entry.request
        if isinstance(vote.outcome, Cancelled):
            return self._resolve(entry, vote.outcome, vote.client_id, "voter", vote.meta)
        option = vote.outcome.option_id
        if option == CANCEL_SENTINEL or not req.offers(option):
            return InvalidOption(request_id, req.session_id, option)

        match req.policy:
            case "first-responder":
                pass
            case "designated":
                designated = req.designated_client_id
                if designated is not None and vote.client_id != designated:
                    return self._forbidden(req, vote.client_id, "designated_mismatch")
            case "local-only":
                if not vote.from_loopback:
                    return self._forbidden(req, vote.client_id, "remote_not_allowed")
            case "consensus":
                return self._consensus(entry, vote, option)
        voters = (vote.client_id,) if vote.client_id else ()
        return self._resolve(entry, vote.outcome, vote.client_id, None, vote.meta, voters)

    def _consensus(self, entry: _Entry, vote: Vote, option: str) -> VoteResult:
        req = entry.request
        if vote.client_id is None or vote.client_id not in req.voters:
            return self._forbidden(req, vote.client_id, "designated_mismatch")
        duplicate = vote.client_id in entry.votes
        if not duplicate:
            entry.votes[vote.client_id] = option
        tallies: dict[str, int] = {}
        for chosen in entry.votes.values():
            tallies[chosen] = tallies.get(chosen, 0) + 1
        best = max(tallies.values())
        if best >= req.quorum:
            winner = next(o for o, n in tallies.items() if n == best)
            voters = tuple(c for c, o in entry.votes.items() if o == winner)
            return self._resolve(entry, Selected(winner), vote.client_id, None, vote.meta, voters)
        remaining = len(req.voters) - len(entry.votes)
        needed = max(req.quorum - best, 1)
        partial = PartialVote(
            request_id=req.request_id,
            session_id=req.session_id,
            votes_received=len(entry.votes),
            votes_needed=needed,
            quorum=req.quorum,
            option_tallies=tallies,
            duplicate=duplicate,
            reachable=best + remaining >= req.quorum,
        )
        if duplicate:
            return partial
        event = PermissionEvent(
            "permission_partial_vote",
            {
                "requestId": req.request_id,
                "sessionId": req.session_id,
                "votesReceived": len(entry.votes),
                "votesNeeded": needed,
                "quorum": req.quorum,
                "optionTallies": dict(tallies),
            },
            vote.client_id,
        )
        return msgspec.structs.replace(partial, events=(event,))

    def _forbidden(
        self, req: PendingRequest, client_id: str | None, reason: ForbiddenReason
    ) -> Forbidden:
        data: dict[str, Any] = {"requestId": req.request_id, "sessionId": req.session_id}
        if client_id is not None:
            data["clientId"] = client_id
        data["reason"] = reason
        event = PermissionEvent("permission_forbidden", data, req.designated_client_id)
        return Forbidden(req.request_id, req.session_id, client_id, reason, (event,))

    def _not_pending(self, request_id: str, session_id: str | None, vote: Vote) -> NotPending:
        rem = self._resolved.get(request_id)
        if rem is None or (session_id is not None and rem.session_id != session_id):
            return NotPending(request_id, session_id, "unknown")
        self._resolved.move_to_end(request_id)
        event = PermissionEvent(
            "permission_already_resolved",
            {
                "requestId": request_id,
                "sessionId": rem.session_id,
                "outcome": _outcome_wire(rem.outcome),
            },
            vote.client_id,
        )
        return NotPending(request_id, session_id, "already_resolved", (event,))

    # -- resolution ------------------------------------------------------------------------

    def _resolve(
        self,
        entry: _Entry,
        outcome: Outcome,
        voter: str | None,
        reason: CancelReason | None,
        meta: dict[str, Any] | None = None,
        voters: tuple[str, ...] = (),
    ) -> Resolved:
        req = entry.request
        del self._pending[req.request_id]
        ids = self._by_session[req.session_id]
        del ids[req.request_id]
        if not ids:
            del self._by_session[req.session_id]
        self._resolved[req.request_id] = _Remembered(req.session_id, outcome)
        while len(self._resolved) > self._memory:
            self._resolved.popitem(last=False)
        data: dict[str, Any] = {"requestId": req.request_id, "outcome": _outcome_wire(outcome)}
        if voter is not None:
            data["voterClientId"] = voter
        event = PermissionEvent("permission_resolved", data, voter)
        log.info(
            "session %s: permission %s answered: %s (%s)",
            req.session_id,
            req.request_id,
            outcome.option_id if isinstance(outcome, Selected) else "cancelled",
            f"by {voter}" if voter is not None else reason,
        )
        if voter is not None and not voters and reason == "voter":
            voters = (voter,)
        return Resolved(req, outcome, voter, reason, voters, meta, (event,))

    def cancel(self, request_id: str, reason: CancelReason = "agent_cancelled") -> Resolved | None:
        """Resolve one pending request as cancelled (``None`` if it is not pending)."""
        entry = self._pending.get(request_id)
        return self._resolve(entry, Cancelled(), None, reason) if entry else None

    def cancel_session(
        self, session_id: str, reason: CancelReason = "session_closed"
    ) -> list[Resolved]:
        """Session cancel/close/death: resolve all its pending requests as cancelled."""
        ids = list(self._by_session.get(session_id, {}))
        return [self._resolve(self._pending[r], Cancelled(), None, reason) for r in ids]

    def cancel_prompt(
        self, session_id: str, prompt_id: str, reason: CancelReason = "turn_ended"
    ) -> list[Resolved]:
        """A turn ended: resolve only that prompt's pending requests as cancelled."""
        ids = [
            r
            for r in self._by_session.get(session_id, {})
            if self._pending[r].request.prompt_id == prompt_id
        ]
        return [self._resolve(self._pending[r], Cancelled(), None, reason) for r in ids]

    def cancel_all(self, reason: CancelReason = "daemon_shutdown") -> list[Resolved]:
        """Shutdown: resolve every pending request as cancelled."""
        return [self._resolve(e, Cancelled(), None, reason) for e in list(self._pending.values())]

    def expire(self, now_ms: int) -> list[Resolved]:
        """Resolve as cancelled (``timeout``) every request whose deadline is ``<= now_ms``."""
        due = [
            e
            for e in self._pending.values()
            if e.request.deadline_ms is not None and e.request.deadline_ms <= now_ms
        ]
        due.sort(key=lambda e: (e.request.deadline_ms or 0, e.request.created_at_ms))
        return [self._resolve(e, Cancelled(), None, "timeout") for e in due]
