"""The SessionRegistry actor: creation, attach, coalescing, limits, lookup, idle reaping.

Theory of operation
-------------------
The registry owns the table of live sessions and of *in-flight* spawns and restores. Its
inbox handles :class:`CreateSession` and :class:`RestoreSession` quickly, without waiting
for an agent to start:

* ``single`` scope (the default): one shared session per workspace and owner (the
  principal the session belongs to: ``operator`` without multi-user auth, so one per
  workspace as before; two users in one directory never share one). If it is live, the
  caller attaches (``attached: true``). If its spawn is in flight, the caller joins that
  spawn: every coalesced caller gets the same session, exactly one reports
  ``attached: false``, and a failed spawn fails all of them and clears the slot so the
  next call starts afresh.
* ``thread`` scope: always a fresh session.
* ``load``/``resume`` of an id: live → attach; the same action in flight → join;
  the other action in flight → ``409 restore_in_progress``.
* Limits count live sessions plus in-flight spawns and restores (``--max-sessions`` per
  workspace, ``--max-total-sessions``) → ``503 session_limit_exceeded``.

The spawn itself runs as a task of the registry's nursery: it asks the SessionSupervisor
to start a :class:`~serve.sessions.actor.SessionActor` (``temporary``: a crashed agent is
reported by the supervisor, and the session ends with ``session_died``), then resolves the
:class:`Pending` slot every caller awaits. Sessions tell the registry when they are gone.

One id, one actor: a session that is closing stays in the table until it is gone (its
child reaped, its journal closed). A load/resume of that id waits for it (at most
:data:`CLOSING_WAIT_S`, then ``409 session_closing``) before the new incarnation starts, so
there are never two actors or two agent children for one id.

A reaper task asks every live session every ``--session-reap-interval-ms`` to close itself
if idle (no SSE subscribers, no prompt, no pending permission, no heartbeat for
``--session-idle-timeout-ms``); the session decides, from its own state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from actors import Actor, ActorError, ChildSpec, Restart, Supervisor, unwrap_group
from actors.actor import Request
from serve.access.errors import QuotaExceeded
from serve.access.owner_records import OwnerRecords
from serve.access.principal import OPERATOR
from serve.access.roles import SessionAccess, from_attr
from serve.sessions.actor import CloseSession, SessionActor
from serve.sessions.agent_link import AgentSource, SpawnAgentSource
from serve.sessions.errors import SessionConflictError, SessionLimitError, SessionsUnavailable
from serve.sessions.messages import ReapIfIdle

if TYPE_CHECKING:
    from serve.config import RestartIntensity
    from serve.events.log import Tap
    from serve.isolation import Isolation
    from serve.journal import JournalBackend
    from serve.mcp.pool import McpPool
    from serve.permissions.effects import EffectGate
    from serve.permissions.mediator import PermissionMediator
    from serve.settings import Settings

log = logging.getLogger(__name__)

#: Who a session belongs to when the caller names nobody: the operator (no multi-user auth).
OWNER = OPERATOR.id
#: How long a load/resume waits for the previous incarnation of its id to be gone (s).
CLOSING_WAIT_S = 10.0


class Pending:
    """An in-flight spawn/restore that several callers may await."""

    __slots__ = ("_event", "action", "error", "joined", "key", "owner", "session", "workspace")

    def __init__(self, key: str, action: str, workspace: str = "", owner: str = OWNER) -> None:
        self.key = key
        self.owner = owner
        self.action = action
        self.workspace = workspace
        self._event = trio.Event()
        self.session: SessionActor | None = None
        self.error: BaseException | None = None
        self.joined = 0

    def resolve(self, session: SessionActor | None, error: BaseException | None) -> None:
        self.session = session
        self.error = error
        self._event.set()

    async def wait(self) -> SessionActor:
        await self._event.wait()
        if self.error is not None:
            raise self.error
        assert self.session is not None
        return self.session


class CreateSession(msgspec.Struct, Request["Ticket"], frozen=True):
    workspace: str
    scope: str = "single"
    #: ACP additionalDirectories (validated by the caller): a child of its own, see _source.
    additional_directories: tuple[str, ...] = ()
    #: The principal the session will belong to (single scope: its own shared session).
    owner: str = OWNER
    #: Sessions ``owner`` may have daemon-wide (0: no quota).
    quota: int = 0


class RestoreSession(msgspec.Struct, Request["Ticket"], frozen=True):
    session_id: str
    workspace: str
    action: str  # "load" | "resume"
    additional_directories: tuple[str, ...] = ()
    #: The owner when no record names one (a kept or journaled record wins: the
    #: registry's ``owners``, ownership.py).
    owner: str = OWNER
    quota: int = 0


class ForkSession(msgspec.Struct, Request["Ticket"], frozen=True):
    """A new session forked (ACP ``session/fork``) from ``parent_id``'s context."""

    parent_id: str
    workspace: str
    #: Who forked it: the fork is theirs.
    owner: str = OWNER
    quota: int = 0


class Ticket(msgspec.Struct, frozen=True):
    """What a creating caller awaits: ``attached`` is decided at admission."""

    pending: Pending
    attached: bool


RegistryMsg = CreateSession | RestoreSession | ForkSession


class SessionRegistry(Actor[RegistryMsg]):
    def __init__(
        self,
        settings: Settings,
        mediator: PermissionMediator,
        *,
        name: str = "sessions",
        restart: RestartIntensity | None = None,
        effects: EffectGate | None = None,
        journal: JournalBackend | None = None,
        mcp_pool: McpPool | None = None,
        retire_hook: Callable[[SessionActor], None] | None = None,
        total_count: Callable[[], int] | None = None,
        owned_count: Callable[[str], int] | None = None,
        agent_source: AgentSource | None = None,
        isolation: Isolation | None = None,
        owners: OwnerRecords | None = None,
        event_tap: Tap | None = None,
    ) -> None:
        super().__init__(name, inbox_size=1024)
        #: Every session log's tap (the webhooks service), or None.
        self.event_tap = event_tap
        #: serve.config.RestartIntensity for the sessions' agent restarts (None: defaults).
        self.restart = restart
        self.supervisor_name = name
        #: Sessions daemon-wide (all workspaces); the runtimes facade passes its own.
        self.total_count: Callable[[], int] = total_count or self.local_count
        #: A principal's sessions daemon-wide (its quota); the runtimes facade passes its own.
        self.owned_count: Callable[[str], int] = owned_count or self.owned
        self.settings = settings
        self.mediator = mediator
        self.sessions: dict[str, SessionActor] = {}
        #: "single:<ws>[:<owner>]" -> session id (single scope: one per workspace and owner)
        self.single: dict[str, str] = {}
        self.inflight: dict[str, Pending] = {}  # "single:<ws>", "thread:<n>", "restore:<id>"
        self.supervisor = Supervisor(name, intensity=1_000_000, period_s=1.0)
        self._nursery: trio.Nursery | None = None
        self._counter = 0
        self.accepting = True
        #: The Host's EffectGate (serve/permissions/effects.py) or None.
        self.effects = effects
        #: The daemon's durable event journal (None with --no-journal).
        self.journal = journal
        #: The workspace MCP pool service.
        self.mcp_pool = mcp_pool
        #: Called with each session that is gone (metrics keep its totals).
        self.retire_hook = retire_hook
        #: Where sessions get their agents (None: each spawns its own; see agent_link): the
        #: workspace runtime passes its agent pool (serve/agents/pool.py).
        self.agent_source = agent_source
        #: Per-child limits for sessions that spawn their own agent (no pool).
        self.isolation = isolation
        #: The access records of sessions that left (daemon-wide, shared by the workspace
        #: registries): a restore by id gets its record back (serve/access/owner_records.py).
        self.owners = owners if owners is not None else OwnerRecords()

    # ---- lifecycle ---------------------------------------------------------------------

    async def run(
        self, *, task_status: trio.TaskStatus[Actor[RegistryMsg]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        # A fresh session supervisor per incarnation; in-flight slots of a crashed
        # incarnation were failed in on_stop.
        self.supervisor = Supervisor(self.supervisor_name, intensity=1_000_000, period_s=1.0)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self.supervisor.run)
            nursery.start_soon(self._reaper)
            await super().run(task_status=task_status)
            nursery.cancel_scope.cancel()

    async def on_stop(self) -> None:
        for pending in list(self.inflight.values()):
            error = SessionsUnavailable("Session registry restarted", "daemon_draining")
            pending.resolve(None, error)
        self.inflight.clear()

    async def close_all(self, reason: str = "daemon_shutdown", *, died: bool = True) -> None:
        """End every session (daemon shutdown); bounded by the caller's deadline."""
        self.accepting = False
        for pending in list(self.inflight.values()):
            pending.resolve(None, SessionsUnavailable("Daemon is shutting down", "daemon_draining"))
        async with trio.open_nursery() as nursery:
            for session in list(self.sessions.values()):
                nursery.start_soon(self._close_one, session, reason, died)
        self.supervisor.shutdown()

    async def _close_one(self, session: SessionActor, reason: str, died: bool) -> None:
        try:
            await session.ask(CloseSession(reason=reason, died=died), timeout_s=3)
        except Exception:
            log.exception("closing session %s failed", session.session_id)

    # ---- read models -------------------------------------------------------------------

    def get(self, session_id: str) -> SessionActor | None:
        session = self.sessions.get(session_id)
        if session is None or session.closing:
            return None
        return session

    def live(self, workspace: str | None = None) -> list[SessionActor]:
        return [
            s
            for s in self.sessions.values()
            if not s.closing and (workspace is None or s.workspace == workspace)
        ]

    def owned(self, owner: str) -> int:
        """Live sessions and in-flight spawns and restores of ``owner`` (its quota)."""
        live = sum(1 for s in self.sessions.values() if not s.closing and s.access.owner == owner)
        return live + sum(1 for p in self.inflight.values() if p.owner == owner)

    def _count(self, workspace: str | None) -> int:
        # A session being torn down (closing) no longer counts against --max-sessions.
        live = len(
            [
                s
                for s in self.sessions.values()
                if not s.closing and (workspace is None or s.workspace == workspace)
            ]
        )
        inflight = len(
            [p for p in self.inflight.values() if workspace is None or p.workspace == workspace]
        )
        return live + inflight

    # ---- handling ----------------------------------------------------------------------

    async def handle(self, msg: RegistryMsg) -> Ticket:
        if not self.accepting:
            raise SessionsUnavailable("Daemon is draining", "daemon_draining")
        match msg:
            case CreateSession(workspace=ws, scope=scope, additional_directories=dirs, owner=who):
                if scope == "single":
                    key = _single_key(ws, who)
                    existing = self.single.get(key)
                    session = self.get(existing) if existing else None
                    if session is not None:
                        done = Pending(key, "attach")
                        done.resolve(session, None)
                        return Ticket(done, True)
                    if key in self.inflight:
                        pending = self.inflight[key]
                        pending.joined += 1
                        return Ticket(pending, True)
                else:
                    self._counter += 1
                    key = f"thread:{self._counter}:{ws}"
                self._check_limits(ws, msg.owner, msg.quota)
                pending = Pending(key, "new", ws, who)
                self.inflight[key] = pending
                self._spawn(pending, ws, "new", None, dirs=dirs)
                return Ticket(pending, False)
            case ForkSession(parent_id=parent, workspace=ws, owner=who):
                self._counter += 1
                key = f"fork:{self._counter}:{ws}"
                self._check_limits(ws, msg.owner, msg.quota)
                pending = Pending(key, "fork", ws, who)
                self.inflight[key] = pending
                self._spawn(pending, ws, "fork", None, fork_from=parent)
                return Ticket(pending, False)
            case RestoreSession(
                session_id=sid, workspace=ws, action=action, additional_directories=dirs, owner=who
            ):
                session = self.get(sid)
                if session is not None:
                    done = Pending(f"restore:{sid}", "attach")
                    done.resolve(session, None)
                    return Ticket(done, True)
                key = f"restore:{sid}"
                joining = self.inflight.get(key)
                if joining is not None:
                    pending = joining
                    if pending.action != action:
                        raise SessionConflictError(
                            f"A session/{pending.action} of this session is in progress",
                            "restore_in_progress",
                            reason="conflicting_restore",
                            retryable=True,
                            sessionId=sid,
                            activeAction=pending.action,
                            requestedAction=action,
                        )
                    pending.joined += 1
                    return Ticket(pending, True)
                self._check_limits(ws, msg.owner, msg.quota)
                pending = Pending(key, action, ws, who)
                self.inflight[key] = pending
                self._spawn(pending, ws, action, sid, dirs=dirs)
                return Ticket(pending, False)
        raise TypeError(msg)

    def local_count(self) -> int:
        """Live sessions plus in-flight spawns and restores of this registry."""
        return self._count(None)

    def _check_limits(self, workspace: str, owner: str = OWNER, quota: int = 0) -> None:
        if quota and self.owned_count(owner) >= quota:
            raise QuotaExceeded("sessions", quota, 5)
        limit = self.settings.max_sessions
        if limit and self._count(workspace) >= limit:
            raise _limit_error(limit, "workspace")
        total = self.settings.max_total_sessions
        if total and self.total_count() >= total:
            raise _limit_error(total, "total")

    async def _journaled_access(self, session_id: str) -> SessionAccess | None:
        if self.journal is None:
            return None
        try:
            return from_attr((await self.journal.read(session_id, tail=1)).meta.attrs)
        except Exception:  # no journal of it (or unreadable): the restorer's, as before
            return None

    def _spawn(
        self,
        pending: Pending,
        workspace: str,
        action: str,
        session_id: str | None,
        fork_from: str | None = None,
        dirs: tuple[str, ...] = (),
    ) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(
            self._do_spawn, pending, workspace, action, session_id, fork_from, dirs
        )

    async def _do_spawn(
        self,
        pending: Pending,
        workspace: str,
        action: str,
        session_id: str | None,
        fork_from: str | None = None,
        dirs: tuple[str, ...] = (),
    ) -> None:
        self._counter += 1
        spec_name = f"session-{self._counter}"
        try:
            if session_id is not None:
                await self._previous_gone(session_id)
            # The owner kept when it left, else (a restore) its journaled one: the agent
            # restoring it is that principal's from the start.
            kept = self.owners.get(session_id) if session_id is not None else None
            if kept is None and session_id is not None and action in ("load", "resume"):
                kept = await self._journaled_access(session_id)
            access = kept or SessionAccess(owner=pending.owner)
            session = SessionActor(
                settings=self.settings,
                mediator=self.mediator,
                workspace=workspace,
                action=action,
                session_id=session_id,
                on_gone=self._forget,
                journal=self.journal,
                # A session with additionalDirectories needs write roots no warm or packed
                # child has (fixed at spawn): a child of its own.
                source=SpawnAgentSource(self.settings, self.isolation, extra_write=dirs)
                if dirs or self.agent_source is None
                else self.agent_source,
                effects=self.effects,
                mcp_pool=self.mcp_pool,
                fork_from=fork_from,
                additional_directories=dirs,
                access=access,
                event_tap=self.event_tap,
                **self._restart_kwargs(),
            )
            session.supervisor = self.supervisor
            await self.supervisor.start_child(
                ChildSpec(spec_name, session.run, Restart.TEMPORARY, shutdown_grace_s=5.0)
            )
        except BaseException as exc:
            error = unwrap_group(exc)
            self.inflight.pop(pending.key, None)
            if not isinstance(error, Exception):
                pending.resolve(None, RuntimeError(str(error)))
                raise
            log.warning("session %s failed: %r", action, error)
            pending.resolve(None, error)
            return
        sid = session.session_id
        if sid in self.sessions and self.sessions[sid] is not session:
            log.error("agent reused session id %s", sid)
        self.sessions[sid] = session
        what = {"new": "created", "load": "loaded", "resume": "resumed", "fork": "forked"}
        log.info("session %s %s in %s", sid, what.get(action, action), workspace)
        if pending.key.startswith("single:"):
            self.single[pending.key] = sid
        self.inflight.pop(pending.key, None)
        pending.resolve(session, None)

    async def _previous_gone(self, session_id: str) -> None:
        """Wait until the closing incarnation of ``session_id`` is gone (or 409)."""
        previous = self.sessions.get(session_id)
        if previous is None:
            return
        with trio.move_on_after(CLOSING_WAIT_S):
            await previous.gone.wait()
        if not previous.gone.is_set():
            raise SessionConflictError(
                "The previous incarnation of this session is still closing",
                "session_closing",
                retryable=True,
                sessionId=session_id,
            )

    def _restart_kwargs(self) -> dict[str, Any]:
        if self.restart is None:
            return {}
        return {
            "restart_intensity": self.restart.intensity,
            "restart_period_s": self.restart.period_s,
            "restart_backoff_s": self.restart.backoff_ms / 1000,
        }

    def _forget(self, session: SessionActor) -> None:
        if self.sessions.get(session.session_id) is session:
            del self.sessions[session.session_id]
            self.owners.keep(session.session_id, session.access)
            if self.retire_hook is not None:
                self.retire_hook(session)
        key = _single_key(session.workspace, session.access.owner)
        if self.single.get(key) == session.session_id:
            del self.single[key]

    # ---- idle reaping ------------------------------------------------------------------

    async def _reaper(self) -> None:
        interval_ms = self.settings.session_reap_interval_ms
        timeout_ms = self.settings.session_idle_timeout_ms
        grace_ms = self.settings.session_prompt_settled_close_grace_ms
        if not interval_ms or not timeout_ms:
            return
        while True:
            await trio.sleep(interval_ms / 1000)
            for session in self.live():
                try:
                    session.tell_nowait(ReapIfIdle(timeout_ms, grace_ms))
                except ActorError:
                    pass  # closing, or its inbox is full (it is not idle then)


def _single_key(workspace: str, owner: str) -> str:
    """The single-scope slot of ``owner`` in ``workspace`` (the operator's: as before)."""
    return f"single:{workspace}" if owner == OWNER else f"single:{workspace}:{owner}"


def _limit_error(limit: int, scope: str) -> SessionLimitError:
    return SessionLimitError(
        f"Session limit reached ({limit})", "session_limit_exceeded", limit=limit, scope=scope
    )
