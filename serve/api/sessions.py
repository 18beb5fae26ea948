"""The session service: the session use cases both fronts call, without a transport.

:class:`SessionService` is built over what it needs of the Host (:class:`SessionHost`:
the workspace runtimes' registry facade, the permission mediator, the settings, the
draining flag) and speaks only in typed values and domain errors:

* finding a session and asking it (:meth:`~SessionService.find`, :meth:`~SessionService.ask`:
  a session that is gone is :class:`~serve.sessions.errors.SessionNotFound`, an answer of
  the wrong type a bug), and checking a client id is registered on it;
* where a request goes (:meth:`~SessionService.workspace`, :meth:`~SessionService.listed`);
* making and restoring sessions: :meth:`~SessionService.open_new` /
  :meth:`~SessionService.open_restored` ask the registry and await the spawn (an
  unexpected failure is :class:`~serve.sessions.errors.AgentStartFailed`; a restore the agent
  answers "unknown session" / "invalid params" is ``SessionNotFound``), then
  :meth:`~SessionService.create` / :meth:`~SessionService.restore` attach the caller and
  :meth:`~SessionService.apply_settings` sets the approval mode and model asked at creation
  (a refusal leaves the session in its agent's mode, and says ``modelApplied: false``);
* prompts: :meth:`~SessionService.submit` (the queue's refusal is
  :class:`~serve.sessions.errors.PromptQueueRefused`) and :meth:`~SessionService.outcome`
  (waits for the turn; a caller that goes away cancels the prompt it owns);
* listing, votes, and the one draining check (:meth:`~SessionService.check_accepting`,
  the registry's own refusal, ``daemon_draining``, raised as soon as the daemon drains,
  before the registry stops accepting at the end of the drain).

Every error is a domain error; the table in :mod:`serve.errors` gives its wire form.
No HTTP, no JSON-RPC, no quart: the fronts parse, call, render.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

import trio

from acp.errors import INVALID_PARAMS, RESOURCE_NOT_FOUND, RemoteError
from actors import ActorError, ActorStopped
from serve.access import OPERATOR, Principal, role_of
from serve.access.errors import AccessError, WorkspaceDenied
from serve.access.quotas import Quotas, session_quota
from serve.access.roles import SessionAccess, can_vote, from_attr
from serve.api.prompts import PromptBody, TurnCompleted, turn_outcome
from serve.errors import wire_error
from serve.errors.votes import vote_wire
from serve.journal import JournalBackend, JournalError, JournalNotFound
from serve.permissions.mediator import CastVote, SessionOf
from serve.sessions import ownership
from serve.sessions.errors import (
    AgentStartFailed,
    InvalidRequest,
    PromptQueueRefused,
    SessionError,
    SessionNotFound,
    SessionRequestError,
    SessionsUnavailable,
    UnknownClient,
)
from serve.sessions.messages import (
    Admission,
    Attach,
    Attached,
    CancelTurn,
    KnowsClient,
    PromptQueueFull,
    PublishEvent,
    SessionGone,
    SetApprovalMode,
    SetModel,
    Steered,
    SteerPrompt,
    Summarize,
)
from serve.sessions.registry import CreateSession, RestoreSession
from serve.webhooks import WebhookService

if TYPE_CHECKING:
    from serve.permissions.mediator import PermissionMediator
    from serve.sessions.actor import SessionActor
    from serve.sessions.messages import SessionMsg
    from serve.sessions.registry import Ticket
    from serve.settings import Settings
    from serve.workspaces.runtimes import WorkspaceRuntimes

log = logging.getLogger(__name__)

__all__ = [
    "ASK_TIMEOUT_S",
    "Created",
    "Opened",
    "SessionHost",
    "SessionService",
    "Submitted",
    "Vote",
]

#: The default bound of one ask of a session, the registry or the mediator (seconds).
ASK_TIMEOUT_S = 30.0
#: Persisted (not live) sessions a listing with ``include=persisted`` names at most (the
#: newest; entries).
MAX_PERSISTED_LISTED = 200
#: A model switch asked of the agent (seconds).
MODEL_SWITCH_TIMEOUT_S = 60.0
#: Attempts at attaching to a single-scope session that closes under the caller.
_ATTACH_ATTEMPTS = 3
#: The agent's answers to a restore of a session it does not have (JSON-RPC codes).
_UNKNOWN_SESSION_CODES = (RESOURCE_NOT_FOUND, INVALID_PARAMS)


class SessionHost(Protocol):
    """What the service needs of the Host (``serve.host.Host`` is one)."""

    @property
    def registry(self) -> WorkspaceRuntimes: ...

    @property
    def mediator(self) -> PermissionMediator: ...

    @property
    def settings(self) -> Settings: ...

    @property
    def draining(self) -> bool: ...


def _optional[T](host: SessionHost, name: str, kind: type[T]) -> T | None:
    """A part of the Host the service uses when it is there (the journal, the quotas of
    multi-user auth); hosts without it (tests' fakes) run without."""
    value = getattr(host, name, None)
    return value if isinstance(value, kind) else None


def _journal_of(host: SessionHost) -> JournalBackend | None:
    """The Host's journal (files or PostgreSQL) when it has one."""
    value = getattr(host, "journal", None)
    return value if isinstance(value, JournalBackend) else None


@dataclass(frozen=True)
class Opened:
    """A session the registry made, restored or found: ``joined`` when the caller joined
    one that was live or already being made (``attached: true`` on the wire)."""

    session: SessionActor
    joined: bool


@dataclass(frozen=True)
class Created:
    """:class:`Opened`, with the caller attached (its client id and the session's view)."""

    session: SessionActor
    joined: bool
    attached: Attached


@dataclass(frozen=True)
class Submitted:
    """A prompt admitted: its admission, and where a steer went (None: not a steer)."""

    admission: Admission
    steered: Steered | None = None

    @property
    def owns_turn(self) -> bool:
        """A steer that joined another caller's turn (``native``) does not own it."""
        return self.steered is None or self.steered.via != "native"


@dataclass(frozen=True)
class Vote:
    """The mediator's answer to a vote (its status and body, as it gives them)."""

    status: int
    body: dict[str, Any]


class SessionService:
    """The session use cases over ``host`` (see the module docstring)."""

    def __init__(self, host: SessionHost) -> None:
        self.host = host

    # ---- lookup and asking ------------------------------------------------------------

    def check_accepting(self) -> None:
        """Refuse new sessions and prompts while the daemon drains (the registry's
        refusal, before the registry itself stops accepting)."""
        if self.host.draining:
            raise SessionsUnavailable("Daemon is draining", "daemon_draining")

    def find(self, session_id: str) -> SessionActor:
        session = self.host.registry.get(session_id)
        if session is None:
            raise SessionNotFound(session_id)
        return session

    async def ask[T](
        self,
        session: SessionActor,
        msg: SessionMsg,
        answer: type[T],
        *,
        timeout_s: float = ASK_TIMEOUT_S,
    ) -> T:
        """Send ``msg`` and await its (possibly deferred) answer, of type ``answer``."""
        try:
            reply = await session.call(msg, timeout_s=timeout_s)
        except (SessionGone, ActorStopped):
            raise SessionNotFound(session.session_id) from None
        if not isinstance(reply, answer):
            raise TypeError(f"{type(msg).__name__} answered {type(reply).__name__}")
        return reply

    async def check_client(
        self, session: SessionActor, client_id: str, principal: Principal = OPERATOR
    ) -> None:
        """:class:`UnknownClient` unless ``principal`` registered ``client_id`` on
        ``session`` (another principal's id is answered as an unknown one)."""
        if not await self.ask(session, KnowsClient(client_id, principal.id), bool):
            raise UnknownClient(session.session_id, client_id)

    async def publish(
        self, session: SessionActor, event_type: str, data: object, originator: str | None
    ) -> None:
        """Have the session write another party's event into its log (its only writer);
        a session that closed meanwhile has closed its log too."""
        try:
            await session.ask(PublishEvent(event_type, data, originator=originator), timeout_s=10)
        except (SessionGone, ActorError):
            pass

    # ---- where ---------------------------------------------------------------------------

    def workspace(self, cwd: object, usable: Callable[[str], bool] | None = None) -> str:
        """The served workspace a request's ``cwd`` names (None: the primary one); one the
        caller may not use (``usable`` false) is answered as one not served."""
        settings, registry = self.host.settings, self.host.registry
        if cwd is None:
            path = settings.primary_workspace
        elif not isinstance(cwd, str) or not os.path.isabs(cwd):
            raise InvalidRequest("`cwd` must be a string absolute path")
        else:
            try:
                path = os.path.realpath(cwd)
            except (OSError, ValueError):
                path = os.path.normpath(cwd)
        if path in registry.runtimes and (usable is None or usable(path)):
            return path
        if path == settings.primary_workspace and path in registry.runtimes:
            raise WorkspaceDenied(path)  # (every mismatch names it: nothing to hide)
        extra: dict[str, object] = {"workspaceCount": len(registry)} if len(registry) > 1 else {}
        raise SessionRequestError(
            f"Requested workspace {path} does not match the daemon's workspace",
            "workspace_mismatch",
            boundWorkspace=settings.primary_workspace,
            requestedWorkspace=path,
            **extra,
        )

    def listed(self, ref: str, usable: Callable[[str], bool] | None = None) -> str:
        """The served workspace a listing's path or id names (one the caller may not use,
        ``usable`` false, is answered as one not served)."""
        runtime = self.host.registry.by_ref(ref)
        primary = self.host.settings.primary_workspace
        if runtime is not None and runtime.path == primary and usable and not usable(primary):
            raise WorkspaceDenied(primary)  # (every mismatch names it: nothing to hide)
        if runtime is None or (usable is not None and not usable(runtime.path)):
            raise SessionRequestError(
                f"Workspace {ref} is not served by this daemon",
                "workspace_mismatch",
                boundWorkspace=self.host.settings.primary_workspace,
                requestedWorkspace=ref,
            )
        return runtime.path

    async def summaries(
        self, workspace: str | None, visible: Callable[[SessionActor], bool] | None = None
    ) -> list[dict[str, Any]]:
        """The list entries of the live sessions (of ``workspace``; None: all; only the
        ``visible`` ones when given), skipping those that close meanwhile."""
        out = []
        for session in self.host.registry.live(workspace):
            if visible is not None and not visible(session):
                continue
            try:
                out.append(await self.ask(session, Summarize(), dict))
            except (SessionNotFound, ActorError):
                continue
        return out

    # ---- making and restoring --------------------------------------------------------------

    async def _opened(self, msg: CreateSession | RestoreSession) -> Opened:
        try:
            ticket: Ticket = await self.host.registry.ask(msg, timeout_s=ASK_TIMEOUT_S)
        except ActorStopped:
            raise SessionsUnavailable("Daemon is shutting down", "daemon_draining") from None
        except AccessError as exc:  # the sessions quota
            self._quota_hit(msg.owner, exc)
            raise
        try:
            session = await ticket.pending.wait()
        except (SessionError, RemoteError) as exc:
            if isinstance(msg, RestoreSession) and _unknown_session(exc):
                raise SessionNotFound(msg.session_id) from None
            raise
        except Exception as exc:
            if wire_error(exc) is not None:  # a failure the table knows keeps its form
                raise
            raise AgentStartFailed(exc) from None
        return Opened(session, ticket.attached)

    def _quota(self, principal: Principal) -> int:
        return session_quota(_optional(self.host, "quotas", Quotas), principal)

    async def open_new(
        self,
        workspace: str,
        scope: str,
        dirs: tuple[str, ...] = (),
        principal: Principal = OPERATOR,
    ) -> Opened:
        """A session of ``scope`` (``single``: the shared one of the workspace and the
        principal) in ``workspace``, owned by ``principal``."""
        return await self._opened(
            CreateSession(workspace, scope, dirs, principal.id, self._quota(principal))
        )

    async def open_restored(
        self,
        session_id: str,
        workspace: str,
        action: str,
        dirs: tuple[str, ...] = (),
        principal: Principal = OPERATOR,
        group_roles: Mapping[str, str] | None = None,
    ) -> Opened:
        """The session ``session_id`` live, or loaded / resumed (``action``) from the agent
        or the journal. Someone else's (its journaled owner and members give ``principal``
        no role) is ``SessionNotFound`` before anything is restored."""
        if principal is not OPERATOR and not principal.admin:
            await self.check_journaled(session_id, principal, group_roles)
        return await self._opened(
            RestoreSession(
                session_id, workspace, action, dirs, principal.id, self._quota(principal)
            )
        )

    async def persisted_summaries(
        self, workspace: str, principal: Principal, group_roles: Mapping[str, str] | None
    ) -> list[dict[str, Any]]:
        """List entries of the sessions of ``workspace`` that are journaled but not live
        (``activeWorkState: "persisted"``: ``POST /session/:id/load`` restores one), those
        ``principal`` may load, oldest first; at most :data:`MAX_PERSISTED_LISTED`."""
        journal = _journal_of(self.host)
        if journal is None:
            return []
        out: list[dict[str, Any]] = []
        for meta in await journal.list_sessions():
            if meta.workspace != workspace or self.host.registry.get(meta.session_id):
                continue
            if principal is not OPERATOR and not principal.admin:
                access = from_attr(meta.attrs)  # no record: admin only (check_journaled)
                if access is None or role_of(access, principal, group_roles) is None:
                    continue
            created = datetime.fromtimestamp(meta.created_at_ms / 1000, UTC)
            out.append(
                {
                    "sessionId": meta.session_id,
                    "workspaceCwd": meta.workspace,
                    "createdAt": created.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                    "displayName": meta.session_id,
                    "clientCount": 0,
                    "hasActivePrompt": False,
                    "activeWorkState": "persisted",
                    "hasRunningBackgroundTasks": False,
                    "isWaitingForPermission": False,
                    "isWaitingForUserQuestion": False,
                    "pendingInteractionCount": 0,
                    "pendingPromptCount": 0,
                    "hasTurnError": False,
                    "pendingInteractions": [],
                }
            )
        return out[-MAX_PERSISTED_LISTED:]

    async def persisted_not_loaded(
        self, session_id: str, principal: Principal, group_roles: Mapping[str, str] | None
    ) -> bool:
        """True when ``session_id`` is not live here but has a journal that ``principal``
        may restore (``POST /session/:id/load``): a not-found answer then says so."""
        journal = _journal_of(self.host)
        if journal is None or self.host.registry.get(session_id) is not None:
            return False
        try:
            meta = (await journal.read(session_id, tail=1)).meta
        except Exception:  # no journal of it, or unreadable: nothing to restore
            return False
        if principal is OPERATOR or principal.admin:
            return True
        access = from_attr(meta.attrs)  # no record: admin only (check_journaled)
        return access is not None and role_of(access, principal, group_roles) is not None

    async def check_journaled(
        self, session_id: str, principal: Principal, group_roles: Mapping[str, str] | None
    ) -> None:
        """Whether ``principal`` (not an admin) may restore ``session_id``: the owner
        record (the live or closing session's, the one kept when it left, else its
        journal's) must give it a role. No record anywhere (a session journaled before
        ``--auth-*``, an unreadable journal, one the agent alone knows) is restorable by
        ``admin`` only: ``SessionNotFound``, as for a session that does not exist."""
        access = await self.owner_record(session_id)
        if access is None or role_of(access, principal, group_roles) is None:
            raise SessionNotFound(session_id)

    async def claim(
        self, session_id: str, workspace: str, principal: Principal, *, durable: bool = True
    ) -> None:
        """A session the agent just made for ``principal`` outside the registry (a vendor
        branch): its owner on record, unless one already is (in memory, and, ``durable``,
        in a journal holding only the record when the daemon journals; a session loaded
        at once gets its journal record when it opens), so its brancher restores it later
        and nobody else does."""
        if await self.owner_record(session_id) is not None:
            return
        access = SessionAccess(owner=principal.id)
        self.host.registry.owners.keep(session_id, access)
        journal = _journal_of(self.host)
        if journal is not None and durable:
            await ownership.journal_record(journal, session_id, workspace, access)

    async def owner_record(self, session_id: str) -> SessionAccess | None:
        """The access record on file for ``session_id`` (None: none)."""
        access = self.host.registry.access_of(session_id)
        if access is not None:
            return access
        journal = _journal_of(self.host)
        if journal is None:
            return None
        try:
            return from_attr((await journal.read(session_id, tail=1)).meta.attrs)
        except JournalNotFound:
            return None
        except JournalError as exc:
            log.warning("session %s: journal unreadable, no owner on record: %s", session_id, exc)
            return None

    async def create(
        self,
        workspace: str,
        scope: str,
        client_id: str | None,
        peer: str | None,
        principal: Principal = OPERATOR,
    ) -> Created:
        """:meth:`open_new`, then the caller attached; a single-scope session that closes
        (its last client detached) before the attach is opened afresh, twice at most."""
        for attempt in range(_ATTACH_ATTEMPTS):
            opened = await self.open_new(workspace, scope, principal=principal)
            try:
                attached = await opened.session.call(
                    Attach(
                        client_id,
                        peer,
                        principal.admin or can_vote(opened.session.access, principal),
                        principal.id,
                    ),
                    timeout_s=ASK_TIMEOUT_S,
                )
            except (SessionGone, ActorStopped):
                if attempt == _ATTACH_ATTEMPTS - 1:
                    raise SessionNotFound(opened.session.session_id) from None
                continue
            assert isinstance(attached, Attached)
            return Created(opened.session, opened.joined, attached)
        raise AssertionError("unreachable")

    async def restore(
        self,
        session_id: str,
        workspace: str,
        action: str,
        client_id: str | None,
        peer: str | None,
        principal: Principal = OPERATOR,
        group_roles: Mapping[str, str] | None = None,
    ) -> Created:
        """:meth:`open_restored`, then the caller attached."""
        opened = await self.open_restored(
            session_id, workspace, action, principal=principal, group_roles=group_roles
        )
        voter = principal.admin or can_vote(opened.session.access, principal, group_roles)
        attached = await self.ask(
            opened.session, Attach(client_id, peer, voter, principal.id), Attached
        )
        return Created(opened.session, opened.joined, attached)

    async def apply_settings(
        self,
        session: SessionActor,
        client_id: str,
        approval_mode: str | None,
        model: str | None,
    ) -> bool | None:
        """The approval mode and model asked for at creation. A refusal leaves the session
        as its agent made it; returns whether the model was applied (None: none asked)."""
        if approval_mode:
            try:
                await self.ask(session, SetApprovalMode(approval_mode, False, client_id), object)
            except SessionError:
                pass
        if not model:
            return None
        try:
            await self.ask(session, SetModel(model, client_id), object)
        except SessionError:
            return False
        return True

    # ---- prompts ---------------------------------------------------------------------------

    async def submit(
        self,
        session: SessionActor,
        body: PromptBody,
        client_id: str | None,
        principal: Principal = OPERATOR,
    ) -> Submitted:
        """Admit the prompt (or the steer) into the session's queue (after the
        principal's prompts-per-minute quota)."""
        self.check_prompt_quota(principal)
        request = body.request(client_id)
        try:
            answer = await self.ask(
                session, SteerPrompt(request) if body.steer else request, object
            )
        except PromptQueueFull as exc:
            raise PromptQueueRefused(session.session_id, exc.limit, exc.pending) from None
        if isinstance(answer, Steered):
            return Submitted(answer.admission, answer)
        if not isinstance(answer, Admission):
            raise TypeError(f"a prompt was answered {type(answer).__name__}")
        return Submitted(answer)

    def check_prompt_quota(self, principal: Principal) -> None:
        """The principal's budgets (summed over its live sessions) and prompts per minute
        (multi-user quotas; nothing without them, nothing for the operator or admins).
        Every path that starts or extends a turn or runs a model query is charged here:
        a prompt, a steer (REST ``steer``, ``/acp`` ``_session/steering``), ``btw`` and
        ``recap`` (docs/multi-user.md)."""
        quotas = self.check_budget(principal)
        if quotas is not None:
            try:
                quotas.take_prompt(principal)
            except AccessError as exc:  # quota_exceeded (scope principal)
                self._quota_hit(principal.id, exc)
                raise

    def check_budget(self, principal: Principal) -> Quotas | None:
        """The principal's token and cost budgets only (a queued prompt given new content:
        no new turn, but new content for the agent); the quotas, when there are any."""
        quotas = _optional(self.host, "quotas", Quotas)
        if quotas is None or principal is OPERATOR:
            return None
        if quotas.budgets:
            # Closing sessions too: their spending joins the ended ones' (Quotas.retired)
            # only once they leave the registry, so none is missed in between.
            registered = self.host.registry.all_sessions()
            owned = [s for s in registered if s.access.owner == principal.id]
            # What each spent here (since a restore: the rest was charged where it was).
            tokens = sum(s.budget.tokens_here for s in owned)
            cost = sum(s.budget.cost_here for s in owned)
            try:
                quotas.check_budget(principal, tokens, cost)
            except AccessError as exc:  # budget_exhausted (scope principal)
                self._quota_hit(principal.id, exc)
                raise
        return quotas

    def _quota_hit(self, principal_id: str, exc: AccessError) -> None:
        """A ``quota.exceeded`` webhook for a refusal by a principal's quota or budget."""
        webhooks = _optional(self.host, "webhooks", WebhookService)
        if webhooks is not None:
            webhooks.quota(principal_id, exc.body())

    async def outcome(
        self, session: SessionActor, submitted: Submitted, client_id: str | None
    ) -> TurnCompleted:
        """Wait for the turn's end: :class:`TurnCompleted`, or its ``TurnFailed`` raised.
        A caller cancelled meanwhile (it went away) cancels the prompt if it owns it."""
        admission = submitted.admission
        try:
            await admission.done.wait()
        except trio.Cancelled:
            if not admission.done.is_set() and submitted.owns_turn:
                try:
                    session.tell_nowait(CancelTurn(client_id, admission.prompt_id))
                except ActorError:
                    pass  # gone, or its inbox is full: it ends the turn its own way
            raise
        return turn_outcome(admission)

    # ---- votes -----------------------------------------------------------------------------

    async def vote(
        self,
        request_id: str,
        session_id: str | None,
        body: dict[str, Any],
        client_id: str | None,
        loopback: bool,
    ) -> Vote:
        """A client's answer to a permission request, counted by the mediator."""
        try:
            result = await self.host.mediator.ask(
                CastVote(request_id, session_id, body, client_id, loopback),
                timeout_s=ASK_TIMEOUT_S,
            )
        except ActorStopped:
            raise SessionsUnavailable(
                "Permission mediator unavailable", "mediator_unavailable"
            ) from None
        return Vote(*vote_wire(result, legacy=session_id is None))

    async def vote_owner(self, request_id: str) -> SessionActor | None:
        """The live session a permission request belongs to (None: unknown or gone)."""
        owner = await self.host.mediator.ask(SessionOf(request_id), timeout_s=ASK_TIMEOUT_S)
        return self.host.registry.get(owner) if isinstance(owner, str) and owner else None


def _unknown_session(exc: Exception) -> bool:
    """The agent's answer to a restore of a session it does not have."""
    return isinstance(exc, RemoteError) and exc.code in _UNKNOWN_SESSION_CODES
