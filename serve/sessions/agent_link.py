"""The agent link of one session: acquire, handshake, restore, restart in place; its journal.

Theory of operation
-------------------
:class:`AgentLink` is the session actor's only way to its agent. It gets a connected,
**initialized** agent from an :class:`AgentSource` (one replaceable step: the default
:class:`SpawnAgentSource` spawns ``settings.agent_argv`` and runs ``initialize``; an agent
pool hands out pre-spawned children instead), then opens the ACP session:

* ``new``: ``session/new``; the owner learns the session id (:meth:`LinkOwner.adopt_session_id`);
* ``load`` / ``resume``: the owner first rebuilds its history from the journal
  (:meth:`LinkOwner.restore_history`), then ``session/load`` (the agent's replay is dropped
  when the journal already had it) or ``session/resume``; ``501`` when the agent cannot load;
* ``restart``: after the child died, re-attach to the same ACP session, ``session/resume``
  when offered, else ``session/load`` with its replay dropped (the log already holds it).

Restart in place: after :meth:`AgentLink.wait_exit`, :meth:`~AgentLink.next_restart` says
whether the restart window (``--agent-restart-*``) and the agent's load/resume support allow
another attempt, and :meth:`~AgentLink.restart` backs off (exponentially, at most 5 s) and
opens again with ``restart``. :meth:`~AgentLink.kill` stops an unresponsive agent at once;
:meth:`~AgentLink.responsive` asks whether it still answers at all (a probe).

Shared children (a pool lease with ``shared``): a bystander's restart (no turn of its own
running) is charged to the child through :meth:`AgentLease.charge_exit` (each exit counted
once, in the pool) while that window allows, else to the session's own window. Releasing
the lease forgets the connection at once (``conn`` None: no pid shown, no cancel sent to a
child the session left), and :meth:`~AgentLink.wait_exit` then returns None instead of
waiting for that child's exit.

:class:`~serve.sessions.journal_link.JournalLink` (its own module) is the session's
durable journal.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import trio

from acp import telemetry
from acp.client import AgentConnection
from acp.errors import AcpError, ChannelClosed, RemoteError
from acp.handler import ClientHandler
from acp.process import ExitInfo, scrub_env
from acp.schema import (
    ClientCapabilities,
    FileSystemCapability,
    InitializeResult,
    SessionSetup,
)
from actors import RestartWindow
from serve.isolation import ChildLimits, Isolation, OomReport, identity, sandbox, tenants
from serve.permissions.elicitation import CLIENT_CAPABILITY as ELICITATION_CAPABILITY
from serve.sessions.errors import AgentSandboxDenied, NotSupportedByAgent

if TYPE_CHECKING:
    from serve.settings import Settings

log = logging.getLogger(__name__)

#: The request :meth:`AgentLink.responsive` sends: an extension method no agent offers, so
#: a live agent answers ``-32601`` at once.
PROBE_METHOD = "_acp_serve/probe"
#: What the daemon offers its agent children in ``initialize``: files and terminals (served
#: through the effect gate) and elicitation in both modes (brokered to the session's clients
#: like a permission: serve/sessions/elicitation_side.py), and boolean config options (ACP
#: 1.21: serve/sessions/config_options.py).
CHILD_CAPABILITIES = ClientCapabilities(
    fs=FileSystemCapability(read_text_file=True, write_text_file=True),
    terminal=True,
    elicitation=ELICITATION_CAPABILITY,
    session={"configOptions": {"boolean": {}}},
)


# ---- acquiring an agent -------------------------------------------------------------------


class AgentLease(Protocol):
    """A session's hold on a connected, initialized agent (all of a child, or one slot of a
    shared child: ``serve/agents/pool.py``)."""

    @property
    def conn(self) -> AgentConnection: ...

    @property
    def child_id(self) -> str | None: ...

    @property
    def shared(self) -> bool:
        """Other sessions may be on the same child (a slot of a shared child)."""

    def bind(self, session_id: str, handler: ClientHandler) -> None:
        """Route ``session_id``'s updates and requests on the connection to ``handler``."""

    async def take_primed(
        self, cwd: str, mcp_servers: Sequence[object], additional_directories: Sequence[str]
    ) -> SessionSetup | None:
        """A session the agent opened ahead of need (a pool spare's prime:
        ``serve/agents/primed.py``) when ``session/new`` with these parameters would have
        opened the same; once. None: open one."""

    async def charge_exit(self, intensity: int, period_s: float) -> bool:
        """The child exited: count it once against the child's own restart window (not per
        session on it); True while that window allows a restart (``False``: exclusive)."""

    async def release(self, *, eof_grace_s: float | None = None) -> None:
        """Give the agent back (stop it, or free the slot); idempotent, bounded. An agent
        stopped while idle gets ``eof_grace_s`` after stdin EOF before SIGTERM."""


class AgentSource(Protocol):
    """Where a session gets its agent: a connected, initialized :class:`AgentConnection`,
    or an :class:`AgentLease` on one (a pool's child, or a slot of a shared child).

    A bare connection is the session's own (the link stops it when done); its tasks run in
    ``nursery`` (the session's). A lease's connection may run elsewhere, and ``handler``
    answers the agent for this session once :meth:`AgentLease.bind` named it. ``tenant``
    is the principal the agent works for (the session's owner): a child serves one tenant
    for its whole life, with that tenant's places (``serve/isolation/tenants.py``). Raise to
    fail the session's start."""

    async def acquire(
        self,
        nursery: trio.Nursery,
        *,
        cwd: str,
        handler: ClientHandler,
        timeout_s: float,
        tenant: str | None = None,
    ) -> AgentConnection | AgentLease: ...


class OwnAgent:
    """The lease of an agent spawned for one session alone: ``release`` stops it (and
    removes its cgroup, ``limits``)."""

    def __init__(self, conn: AgentConnection, limits: ChildLimits | None = None) -> None:
        self._conn = conn
        self.limits = limits

    @property
    def conn(self) -> AgentConnection:
        return self._conn

    @property
    def child_id(self) -> str | None:
        return None

    @property
    def shared(self) -> bool:
        return False

    def bind(self, session_id: str, handler: ClientHandler) -> None:
        pass  # the connection was spawned with the session as its handler

    async def take_primed(
        self, cwd: str, mcp_servers: Sequence[object], additional_directories: Sequence[str]
    ) -> SessionSetup | None:
        return None  # spawned for this session: nothing was opened ahead of it

    async def charge_exit(self, intensity: int, period_s: float) -> bool:
        return False

    async def release(self, *, eof_grace_s: float | None = None) -> None:
        await self._conn.aclose(grace_s=1.0, eof_grace_s=eof_grace_s)
        if self.limits is not None:
            await self.limits.aclose()


def oom_report(lease: object, exit_info: ExitInfo) -> OomReport | None:
    """Whether the child under ``lease`` (an :class:`OwnAgent` or a pool's lease) was
    killed for memory (``serve/isolation``): read once its exit is known."""
    limits = getattr(lease, "limits", None)
    if limits is None:
        child = getattr(lease, "child", None)
        limits = getattr(child, "limits", None)
    return limits.verdict(exit_info) if isinstance(limits, ChildLimits) else None


async def spawn_limited(
    nursery: trio.Nursery,
    settings: Settings,
    isolation: Isolation | None,
    *,
    cwd: str,
    handler: ClientHandler,
    request_timeout_s: float,
    env: Mapping[str, str] | None = None,
    extra_write: Sequence[str] = (),
    cpu_weight: int | None = None,
    tenant: str | None = None,
) -> tuple[AgentConnection, ChildLimits | None]:
    """Spawn ``settings.agent_argv`` in its file sandbox and inside its own limits
    (``isolation``; None: none), with
    ``env`` (default :func:`agent_env`), at ``cpu_weight`` (default ``--agent-cpu-weight``),
    for the principal ``tenant`` (multi-user mode: its own HOME and agent store,
    ``serve/isolation/tenants.py``), as ``tenant``'s uid where ``--agent-uid-range`` is in
    force (None: the daemon's). The caller owns the limits: ``aclose`` them once the child
    is reaped."""
    env = agent_env(settings) if env is None else dict(env)
    env, places = await sandbox.tenant_setup(settings, tenant, env)
    run_as = identity.run_as_for(settings, tenant)  # UidCollision is an OSError
    # The file sandbox (serve/isolation/sandbox.py): ruleset + private TMPDIR, its pid
    # namespace, its uid; OSError when it is in force and cannot be built (never an
    # unsandboxed child then).
    box = await sandbox.prepare(settings, cwd, env, extra_write, places, run_as=run_as)
    limits = None
    try:
        limits = await isolation.child(cpu_weight=cpu_weight) if isolation is not None else None
        confine = box.confinement()
        if limits is not None:
            confine = limits.confinement(confine)
        conn = await AgentConnection.spawn(
            nursery,
            settings.agent_argv,
            cwd=cwd,
            env=env,
            handler=handler,
            request_timeout_s=request_timeout_s,
            max_line_bytes=settings.max_agent_line_bytes,
            confine=confine,
            client_capabilities=CHILD_CAPABILITIES,
        )
    except BaseException:
        with trio.CancelScope(shield=True):
            await box.aclose()
            if limits is not None:
                await limits.aclose()
        raise
    sandbox.register(conn, box)
    nursery.start_soon(sandbox.remove_when_closed, conn, box)
    if limits is not None:
        limits.attach(conn.process.pid)
    return conn, limits


async def start_failure(conn: AgentConnection, exc: Exception) -> Exception:
    """What a failed ``initialize`` of ``conn`` (already closed) is for the caller:
    :class:`AgentSandboxDenied` when the child exited because the file sandbox refused it a
    path (its stderr says which: a deterministic failure, never retryable), else ``exc``.
    The stderr's paths are checked in a worker thread (``stat`` calls)."""
    if not isinstance(exc, ChannelClosed):
        return exc
    found = await trio.to_thread.run_sync(sandbox.denial, conn)
    if found is None:
        return exc
    return AgentSandboxDenied(found.message(), found.path, found.flag)


def agent_env(settings: Settings) -> dict[str, str]:
    """The agent child's environment: ours, scrubbed, plus the daemon's hints."""
    env = scrub_env(os.environ)
    if settings.agent_is_default:
        env["ACP_SCRIPTED_STATE_DIR"] = tenants.scripted_store(settings)  # or --shared-dir's
        env["ACP_SCRIPTED_RETENTION_MS"] = str(settings.journal_retention_ms)
    env["QWEN_CODE_NO_RELAUNCH"] = "true"
    if settings.otel_endpoint and "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" not in env:
        # OTEL_* pass through as they are; an agent that traces exports where we do.
        env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = settings.otel_endpoint
    cache = settings.node_compile_cache_dir
    if cache is not None and "NODE_COMPILE_CACHE" not in env:
        env["NODE_COMPILE_CACHE"] = cache  # node >= 22.1 (serve/agents/compile_cache.py)
    if settings.mcp_client_budget is not None:
        env["QWEN_SERVE_MCP_CLIENT_BUDGET"] = str(settings.mcp_client_budget)
        env["QWEN_SERVE_MCP_BUDGET_MODE"] = settings.mcp_budget_mode
    return env


class SpawnAgentSource:
    """The default source: spawn ``settings.agent_argv`` per session and initialize it."""

    def __init__(
        self,
        settings: Settings,
        isolation: Isolation | None = None,
        extra_write: Sequence[str] = (),
    ) -> None:
        self.settings = settings
        self.isolation = isolation
        #: Write roots beyond the workspace (a session's additionalDirectories).
        self.extra_write = tuple(extra_write)

    async def acquire(
        self,
        nursery: trio.Nursery,
        *,
        cwd: str,
        handler: ClientHandler,
        timeout_s: float,
        tenant: str | None = None,
    ) -> AgentConnection | OwnAgent:
        """The connection itself, or (with limits) a lease that also removes its cgroup."""
        with telemetry.span("agent.start", attributes={"acp_serve.agent.pooled": False}):
            return await self._acquire(
                nursery, cwd=cwd, handler=handler, timeout_s=timeout_s, tenant=tenant
            )

    async def _acquire(
        self,
        nursery: trio.Nursery,
        *,
        cwd: str,
        handler: ClientHandler,
        timeout_s: float,
        tenant: str | None,
    ) -> AgentConnection | OwnAgent:
        conn, limits = await spawn_limited(
            nursery,
            self.settings,
            self.isolation,
            cwd=cwd,
            handler=handler,
            request_timeout_s=timeout_s,
            extra_write=self.extra_write,
            tenant=tenant,
        )
        try:
            await conn.initialize(timeout_s=timeout_s)
        except BaseException as exc:
            with trio.CancelScope(shield=True):
                await conn.aclose(grace_s=1.0)
                if limits is not None:
                    await limits.aclose()
            if (
                isinstance(exc, Exception)
                and (refusal := await start_failure(conn, exc)) is not exc
            ):
                raise refusal from exc
            raise
        return conn if limits is None else OwnAgent(conn, limits)


# ---- the link -----------------------------------------------------------------------------


class LinkHandler(ClientHandler, Protocol):
    """The session's handler of the connection (serve/sessions/agent_side.py)."""

    #: True while the agent replays history the session's log already holds.
    drop_updates: bool


class LinkOwner(Protocol):
    """What the link needs from the session it serves (the session actor)."""

    async def mcp_servers(self, info: InitializeResult | None) -> list[dict[str, Any]]: ...

    async def adopt_session_id(self, session_id: str) -> None: ...

    async def restore_history(self) -> bool: ...


def can_resume(info: object) -> bool:
    return info is not None and bool(getattr(info, "supports_resume", False))


class AgentLink:
    def __init__(
        self,
        source: AgentSource,
        *,
        workspace: str,
        handler: LinkHandler,
        owner: LinkOwner,
        init_timeout_s: float,
        restore_timeout_s: float,
        restarts: RestartWindow | None = None,
        restart_backoff_s: float = 0.1,
        tenant: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.source = source
        #: The principal whose agent this is (the session's owner, read at each acquire).
        self.tenant = tenant
        self.workspace = workspace
        self.handler = handler
        self.owner = owner
        self.init_timeout_s = init_timeout_s
        self.restore_timeout_s = restore_timeout_s
        self.conn: AgentConnection | None = None
        self.lease: AgentLease | None = None
        #: The setup of the first open (a restart keeps the models/modes clients saw).
        self.setup: SessionSetup | None = None
        self.ready = trio.Event()
        self.restarts = restarts if restarts is not None else RestartWindow(3, 60.0)
        self.restart_backoff_s = restart_backoff_s
        self.restart_count = 0
        #: Set while a connection is attached; ``_let_go`` fires when it is released.
        self._attached = trio.Event()
        self._let_go = trio.Event()
        #: ``fork``: the parent's session id (``session/fork`` instead of ``session/new``).
        self.fork_from: str | None = None
        #: ACP ``additionalDirectories`` sent with every session/new, load and resume.
        self.additional_directories: tuple[str, ...] = ()

    @property
    def connected(self) -> bool:
        return self.conn is not None and not self.conn.closed

    @property
    def forks(self) -> bool | None:
        """Whether the bound agent advertises ``sessionCapabilities.fork`` (None: none bound)."""
        info = self.conn.info if self.connected and self.conn is not None else None
        return None if info is None else info.supports_fork

    @property
    def agent_name(self) -> str | None:
        """The agent's ``agentInfo.name`` (grants by agent), None before ``initialize``."""
        info = self.conn.info if self.conn is not None else None
        name = info.agent_info.name if info is not None and info.agent_info is not None else None
        return name if isinstance(name, str) and name else None

    @property
    def child_id(self) -> str | None:
        """The pool's id of the child the session is on (None: its own, or none)."""
        return self.lease.child_id if self.lease is not None else None

    @property
    def shared(self) -> bool:
        """The session is on a shared child (``--sessions-per-agent`` > 1)."""
        return self.lease is not None and self.lease.shared

    @property
    def pid(self) -> int | None:
        return self.conn.process.pid if self.connected and self.conn is not None else None

    def refusal(self) -> Exception | None:
        """Why the source could not give an agent now (the pool's memory budget), if so."""
        check = getattr(self.source, "refusal", None)
        return check(self.tenant()) if check is not None else None

    def restorable(self) -> bool:
        info = self.conn.info if self.conn is not None else None
        return info is not None and (bool(info.load_session) or can_resume(info))

    async def open(self, nursery: trio.Nursery, action: str, session_id: str) -> SessionSetup:
        """Acquire an agent and open the session (``new``/``load``/``resume``/``restart``);
        returns this open's setup. The connection is closed again if any step fails."""
        await self.release()  # the slot of an agent that died
        got = await self.source.acquire(
            nursery,
            cwd=self.workspace,
            handler=self.handler,
            timeout_s=self.init_timeout_s,
            tenant=self.tenant(),
        )
        lease = OwnAgent(got) if isinstance(got, AgentConnection) else got
        self.lease = lease
        self.conn = lease.conn
        self._let_go = trio.Event()
        self._attached.set()
        try:
            setup = await self._handshake(lease, action, session_id)
        except BaseException:
            await self.release()
            raise
        if action != "restart" or self.setup is None:
            self.setup = setup
        self.ready.set()
        return setup

    async def _handshake(self, lease: AgentLease, action: str, session_id: str) -> SessionSetup:
        conn = lease.conn
        info = conn.info
        mcp_servers = await self.owner.mcp_servers(info)
        if action == "fork":
            if info is None or not info.supports_fork or self.fork_from is None:
                raise NotSupportedByAgent(
                    "The agent does not support session/fork (it does not advertise "
                    "sessionCapabilities.fork)",
                    "not_supported_by_agent",
                    method="session/fork",
                )
            setup = self.setup = await conn.fork_session(
                self.fork_from, self.workspace, mcp_servers, timeout_s=self.restore_timeout_s
            )
            lease.bind(setup.session_id, self.handler)
            await self.owner.adopt_session_id(setup.session_id)  # (the setup is known)
            return setup
        dirs = list(self.additional_directories) or None
        if dirs and not (
            info is not None
            and info.agent_capabilities.session_capabilities.additional_directories is not None
        ):
            raise NotSupportedByAgent(
                "The agent does not support additionalDirectories", "not_supported_by_agent"
            )
        if action == "new":
            # A spare's session opened ahead of need, when it is the one this would open.
            primed = await lease.take_primed(self.workspace, mcp_servers, dirs or ())
            setup = self.setup = primed or await conn.new_session(
                self.workspace,
                mcp_servers,
                timeout_s=self.init_timeout_s,
                additional_directories=dirs,
            )
            lease.bind(setup.session_id, self.handler)
            await self.owner.adopt_session_id(setup.session_id)
            return setup
        lease.bind(session_id, self.handler)  # before the agent replays anything
        if action == "load" or (action == "restart" and not can_resume(info)):
            if info is None or not info.load_session:
                raise NotSupportedByAgent(
                    "The agent does not support session/load", "not_supported_by_agent"
                )
            restored = await self.owner.restore_history() if action == "load" else False
            # After a restart, or when the journal already holds the history, the agent's
            # replay of it would duplicate events: drop it.
            self.handler.drop_updates = action == "restart" or restored
            try:
                return await conn.load_session(
                    session_id,
                    self.workspace,
                    mcp_servers,
                    timeout_s=self.restore_timeout_s,
                    additional_directories=dirs,
                )
            finally:
                self.handler.drop_updates = False
        if action == "resume":
            await self.owner.restore_history()
        return await conn.resume_session(
            session_id,
            self.workspace,
            mcp_servers,
            timeout_s=self.restore_timeout_s,
            additional_directories=dirs,
        )

    async def next_restart(self, *, bystander: bool = False) -> int | None:
        """The next restart attempt's number, or None when the agent may not restart.

        A ``bystander`` (no turn of its own running) on a shared child is charged nothing
        while the child's own window allows (the pool counts each exit of a shared child
        once); otherwise, and past that window, the session's own window counts it."""
        if not (self.restorable() and self.restarts.intensity):
            return None
        lease = self.lease
        intensity, period_s = self.restarts.intensity, self.restarts.period_s
        if not (bystander and lease is not None and await lease.charge_exit(intensity, period_s)):
            if not self.restarts.allows():
                return None
            self.restarts.count()
        self.restart_count += 1
        return self.restart_count

    async def responsive(self, timeout_s: float) -> bool:
        """Does the agent still answer at all? A request no agent implements
        (:data:`PROBE_METHOD`): any answer, even an error, within ``timeout_s`` is a yes."""
        conn = self.conn
        if conn is None or conn.closed:
            return False
        try:
            await conn.request(PROBE_METHOD, {}, timeout_s=timeout_s)
        except RemoteError:
            return True
        except AcpError:  # timeout, closed channel
            return False
        return True

    async def restart(self, nursery: trio.Nursery, session_id: str, attempt: int) -> SessionSetup:
        """Back off, then re-attach a fresh agent to ``session_id``."""
        await trio.sleep(min(5.0, self.restart_backoff_s * 2 ** (attempt - 1)))
        return await self.open(nursery, "restart", session_id)

    def oom(self, exit_info: ExitInfo) -> OomReport | None:
        """Whether the agent that just exited was killed for memory (``agent_oom``)."""
        return oom_report(self.lease, exit_info) if self.lease is not None else None

    async def wait_exit(self) -> ExitInfo | None:
        """Until the current agent's channel closes (it exited or was stopped): its exit;
        None when the link let that agent go first (released: a shared child lives on, and
        its later exit is no business of this session). Without an agent: waits for one."""
        while self.conn is None:
            await self._attached.wait()
        conn, let_go = self.conn, self._let_go
        exit_info: ExitInfo | None = None
        async with trio.open_nursery() as nursery:

            async def closed() -> None:
                nonlocal exit_info
                exit_info = await conn.wait_closed()
                nursery.cancel_scope.cancel()

            async def released() -> None:
                await let_go.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(closed)
            nursery.start_soon(released)
        if exit_info is not None and self.conn is conn and self.ready.is_set():
            self.ready = trio.Event()  # (let_go already replaced it: waiters hold that one)
        return exit_info

    async def let_go(self, *, eof_grace_s: float | None = None) -> None:
        """Idle release: not ready until :meth:`open` again, and the agent given back (an
        exclusive one stopped with ``eof_grace_s`` after stdin EOF)."""
        self.ready = trio.Event()
        await self.release(eof_grace_s=eof_grace_s)

    async def release(self, *, eof_grace_s: float | None = None) -> None:
        """Give the agent back to its source (stopped, or its slot freed); bounded."""
        lease, self.lease = self.lease, None
        if lease is not None:
            # No longer this session's agent: status pages, cancels and the crash watcher
            # stop looking at it at once (a shared child lives on for others).
            self.conn = None
            self._attached = trio.Event()
            self._let_go.set()
            with trio.CancelScope(shield=True):
                await lease.release(eof_grace_s=eof_grace_s)

    async def aclose(self, grace_s: float = 1.0, *, eof_grace_s: float | None = None) -> None:
        """Let the agent go: a pooled slot back to its pool, an own child stopped (an idle
        one gets only ``eof_grace_s`` after stdin EOF before SIGTERM)."""
        if self.lease is not None:
            await self.release(eof_grace_s=eof_grace_s)
        elif self.conn is not None and not self.conn.closed:
            await self.conn.aclose(grace_s=grace_s, eof_grace_s=eof_grace_s)

    async def kill(self) -> None:
        """Stop an unresponsive agent at once (its watcher then restarts it in place)."""
        if self.conn is not None and not self.conn.closed:
            await self.conn.aclose(grace_s=0.0)


__all__ = [
    "AgentLease",
    "AgentLink",
    "AgentSource",
    "LinkOwner",
    "OwnAgent",
    "SpawnAgentSource",
    "agent_env",
    "can_resume",
    "oom_report",
    "spawn_limited",
]
