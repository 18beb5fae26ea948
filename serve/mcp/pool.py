"""The McpPool actor: workspace MCP servers, budgets, shared processes, restarts.

Theory of operation
-------------------
The pool answers three questions for the rest of the daemon:

* **What does an agent get in ``session/new``?** :meth:`McpPool.acp_servers_for` runs a
  *discovery pass* for the session's workspace: read ``.qwen/settings.json``
  (:mod:`serve.mcp.config`), apply the budget (:func:`serve.mcp.budget.admit`, refusals in
  declaration order under ``enforce``), reconcile the pooled processes with the
  configuration, and return the admitted servers in ACP ``McpServer`` shape. Disabled,
  invalid and refused servers are never handed out.
* **What is running?** With the pool on (the default; ``QWEN_SERVE_NO_MCP_POOL=1`` turns it
  off) every admitted stdio server runs once per workspace as a :class:`PoolEntry`
  (its own supervised process, restart intensity, Unix socket and multiplexer), started
  by the first pass of the workspace (the first session) and shared by every later
  session through the bridge command. HTTP/SSE servers are always connected by the agents
  themselves. With the pool off every server is handed out as configured and each agent
  spawns its own; accounting is then per session (``scope: "session"``), as in qwen serve
  v1.
* **Whose command is it?** The pool runs stdio servers as the daemon, unsandboxed, from a
  file the agents can write (``.qwen/settings.json`` is in the workspace, inside the agents'
  file sandbox). So it starts only a server whose config the operator vouched for: the one
  in the file when the daemon started, or the current one after the operator's explicit
  ``POST /workspace/mcp/<name>/restart``. A server added or changed since then is not
  started (nor handed out): the pass says so once per distinct config with an
  ``mcp_server_untrusted`` event (``reason`` ``new_server`` or ``command_changed``, the
  command and args) and a log warning. (The effect gate also classifies an agent's
  ``fs/write_text_file`` to such a file as ``terminal.exec``; this rule covers the writes
  the gate never sees, by the agent's own ``open()``.) With the pool off the agents spawn
  the servers themselves, inside their sandbox.
* **How is it doing?** :meth:`McpPool.snapshot` is ``GET /workspace/mcp``: per-server
  cells and the budget cell, never env values, headers or stderr.

Budget events go to the sessions of the workspace (workspace-wide events), each as a
:class:`~serve.events.messages.PublishEvent` message to the session actor (the only writer
of its log) through the pool's :class:`~actors.outbox.Outbox` (ordered per session, never
blocking the pool; a full session inbox spills into a bounded FIFO):
``mcp_budget_warning`` from a :class:`~serve.mcp.budget.WarningLatch` observed whenever
the reserved count changes (once per upward crossing of 75 %, re-armed below 37.5 %),
and ``mcp_child_refused_batch`` at the end of a pass that refused servers. The session
being created is part of the audience of its own pass (it is not yet live; its actor
handles the events once its handshake is done, so they follow the handshake's). With the pool
off, each pass is one session's discovery: its latch is fresh and its events go to that
session only. :meth:`McpPool.restart` kills and restarts a pooled server
(``mcp_server_restarted``) or soft-skips (``mcp_server_restart_refused`` with ``in_flight``,
``disabled`` or ``budget_would_exceed``).

Ownership and concurrency: the actor's nursery owns every entry's tasks and processes;
cancelling the actor stops and reaps them all. Passes and restarts of one workspace are
serialised by that workspace's lock; they run as tasks of the nursery and answer through
a :class:`Ticket`, so the inbox never waits on a handshake. Read models (``snapshot``)
read state directly (one trio thread). A crash of the actor tears down its processes;
the supervisor restarts it empty and the next session start rebuilds the pool.

Errors: :class:`McpServerNotFound` (404) and :class:`McpRestartFailed` (502) are raised to
the restart caller; :meth:`acp_servers_for` never raises (a broken pool means no MCP
servers for that session, logged).
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import msgspec
import trio

from actors import Actor, Mailbox, Reply
from actors.actor import Request
from actors.outbox import Outbox
from serve.events.messages import PublishEvent
from serve.mcp.budget import (
    BudgetPolicy,
    WarningLatch,
    refused_batch_event,
    warning_event,
)
from serve.mcp.config import McpServerConfig, acp_server, load_config
from serve.mcp.server import EntryState, McpStartFailed, PoolEntry
from serve.mcp.snapshot import render
from serve.mcp.state import WorkspaceMcp, admission_sets, counts

logger = logging.getLogger(__name__)

BRIDGE_SCRIPT: Final = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bridge.py")
HANDSHAKE_TIMEOUT_S: Final = 10.0
PASS_TIMEOUT_S: Final = 60.0
ASK_TIMEOUT_S: Final = 10.0
MAX_SOCKET_PATH: Final = 100


class McpServerNotFound(Exception):
    """No configured server by that name (or none the daemon runs itself)."""

    def __init__(self, name: str, detail: str, reason: str = "not_configured") -> None:
        super().__init__(detail)
        self.name = name
        self.reason = reason


class McpRestartFailed(Exception):
    """The pooled server did not come back after a restart."""

    def __init__(self, name: str, error_kind: str, detail: str) -> None:
        super().__init__(f"MCP server {name!r} failed to restart: {detail}")
        self.name = name
        self.error_kind = error_kind
        self.detail = detail


class Ticket[T](Reply[T]):
    """The answer to a pass (the servers handed out) or a restart (the 200 body),
    completed by the task that does the work."""

    __slots__ = ()


# ---- messages -----------------------------------------------------------------------------


class ServersFor(msgspec.Struct, Request[Ticket[list[dict[str, Any]]]], frozen=True):
    workspace: str
    #: The session actor being created (gets the pass's events), or None.
    requester: Mailbox[PublishEvent] | None


class RestartServer(msgspec.Struct, Request[Ticket[dict[str, Any]]], frozen=True):
    workspace: str
    name: str
    originator: str | None = None


PoolMsg = ServersFor | RestartServer


class McpPool(Actor[PoolMsg]):
    """See the module docstring. ``sessions_for(workspace)`` lists live session actors."""

    def __init__(
        self,
        *,
        workspaces: Sequence[str],
        policy: BudgetPolicy,
        pooling: bool,
        socket_dir: str,
        sessions_for: Callable[[str], Sequence[Mailbox[PublishEvent]]],
        handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__("mcp-pool", inbox_size=256)
        self.workspaces = tuple(workspaces)
        self.policy = policy
        self.pooling = pooling
        self.handshake_timeout_s = handshake_timeout_s
        self._socket_base = socket_dir
        self._socket_dir: str | None = None
        self._socket_dir_is_temp = False
        self._sessions_for = sessions_for
        self.outbox = Outbox("mcp-pool")
        self._environ = dict(os.environ if environ is None else environ)
        self._nursery: trio.Nursery | None = None
        self._ws: dict[str, WorkspaceMcp] = {}

    @property
    def scope(self) -> str:
        return "workspace" if self.pooling else "session"

    # ---- lifecycle -----------------------------------------------------------------------

    async def run(
        self, *, task_status: trio.TaskStatus[Actor[PoolMsg]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self.outbox.bind(nursery)
                await super().run(task_status=task_status)
                nursery.cancel_scope.cancel()
        finally:
            self._nursery = None
            self.outbox.bind(None)
            self._remove_socket_dir()

    async def on_start(self) -> None:
        self._ws = {path: WorkspaceMcp(path, i) for i, path in enumerate(self.workspaces)}
        for ws in self._ws.values():
            # What the settings hold when the daemon starts is the operator's.
            config = await trio.to_thread.run_sync(load_config, ws.path, self._environ)
            ws.trusted = {s.name: s for s in config.servers if s.transport == "stdio"}

    async def _ensure_socket_dir(self) -> str:
        """The private socket directory, created with the first pooled server."""
        if self._socket_dir is None:
            path, is_temp = await trio.to_thread.run_sync(_make_socket_dir, self._socket_base)
            self._socket_dir, self._socket_dir_is_temp = path, is_temp
            return path
        return self._socket_dir

    def _remove_socket_dir(self) -> None:
        path = self._socket_dir
        if path is None:
            return
        self._socket_dir = None
        if self._socket_dir_is_temp:
            shutil.rmtree(path, ignore_errors=True)
            return
        try:
            for name in os.listdir(path):
                if name.endswith(".sock"):
                    os.unlink(os.path.join(path, name))
            os.rmdir(path)
        except OSError:
            pass

    # ---- the public surface --------------------------------------------------------------

    async def acp_servers_for(
        self,
        workspace: str,
        *,
        requester: Mailbox[PublishEvent] | None = None,
        http: bool = True,
        sse: bool = True,
        timeout_s: float = PASS_TIMEOUT_S,
    ) -> list[dict[str, Any]]:
        """The ``mcpServers`` list for a new session of ``workspace`` (ACP ``McpServer``s).

        Runs a discovery pass (the first one of a workspace starts its pooled servers);
        budget events of the pass also go to ``requester`` (the new session's actor). ``http``
        / ``sse``: the agent's ``mcpCapabilities`` (ACP forbids handing it a transport it
        did not advertise; stdio is always allowed). Never raises: when the pool is
        unavailable the session gets no MCP servers (logged).
        """
        if workspace not in self.workspaces:
            return []  # untrusted (read-only) workspaces never run their settings' commands
        try:
            ticket: Ticket[list[dict[str, Any]]] = await self.ask(
                ServersFor(workspace, requester), timeout_s=ASK_TIMEOUT_S
            )
            with trio.fail_after(timeout_s):
                servers: list[dict[str, Any]] = await ticket.wait()
        except Exception as exc:
            logger.warning("MCP pool: no servers for a session of %s: %r", workspace, exc)
            return []
        allowed = {"http": http, "sse": sse}
        return [s for s in servers if allowed.get(s.get("type", "stdio"), True)]

    async def restart(
        self, workspace: str, name: str, *, originator: str | None = None
    ) -> dict[str, Any]:
        """Restart a pooled server; the 200 body (``restarted`` or ``skipped``).

        Raises :class:`McpServerNotFound`, :class:`McpRestartFailed`, or
        :class:`actors.ActorError` when the pool itself is unavailable.
        """
        ticket: Ticket[dict[str, Any]] = await self.ask(
            RestartServer(workspace, name, originator), timeout_s=ASK_TIMEOUT_S
        )
        return await ticket.wait()

    async def snapshot(self, workspace: str) -> dict[str, Any]:
        """The ``GET /workspace/mcp`` body for ``workspace``."""
        ws = self._ws.get(workspace)
        if ws is not None and ws.config is not None:
            config = ws.config
        else:
            config = await trio.to_thread.run_sync(load_config, workspace, self._environ)
        return render(workspace, ws, config, policy=self.policy, pooling=self.pooling)

    # ---- handling ------------------------------------------------------------------------

    async def handle(self, msg: PoolMsg) -> Ticket[list[dict[str, Any]]] | Ticket[dict[str, Any]]:
        nursery = self._nursery
        assert nursery is not None
        match msg:
            case ServersFor(workspace=path, requester=requester):
                servers: Ticket[list[dict[str, Any]]] = Ticket()
                nursery.start_soon(self._run_pass, self._ws[path], requester, servers)
                return servers
            case RestartServer(workspace=path, name=name, originator=originator):
                ws = self._workspace_or_primary(path)
                body: Ticket[dict[str, Any]] = Ticket()
                if name in ws.restarting:
                    body.set(self._skipped(ws, name, "in_flight", originator))
                else:
                    ws.restarting.add(name)
                    nursery.start_soon(self._run_restart, ws, name, originator, body)
                return body

    def _workspace_or_primary(self, path: str) -> WorkspaceMcp:
        ws = self._ws.get(path)
        if ws is None:
            raise McpServerNotFound("", f"workspace {path!r} is not served by this daemon")
        return ws

    async def _run_pass(
        self,
        ws: WorkspaceMcp,
        requester: Mailbox[PublishEvent] | None,
        ticket: Ticket[list[dict[str, Any]]],
    ) -> None:
        try:
            async with ws.lock:
                ticket.set(await self._pass_locked(ws, requester))
        except Exception as exc:
            logger.exception("MCP discovery pass for %s failed", ws.path)
            ticket.fail(exc)

    async def _pass_locked(
        self, ws: WorkspaceMcp, requester: Mailbox[PublishEvent] | None
    ) -> list[dict[str, Any]]:
        first = not ws.activated
        ws.joining = [requester] if requester is not None else []
        try:
            ws.in_progress = True
            config = await trio.to_thread.run_sync(load_config, ws.path, self._environ)
            ws.config = config
            usable, admitted, refused = admission_sets(config, self.policy)
            if self.pooling:
                pooled = [s for s in usable if s.transport == "stdio" and s.name in admitted]
                pooled = self._trusted_only(ws, pooled)
                await self._reconcile(ws, pooled)
            ws.activated = True
            ws.in_progress = False
            refused_pairs = [(s.name, s.transport) for s in usable if s.name in refused]
            if self.pooling:
                live, reserved = self._recount(ws)
                audience = self._audience(ws) if first else list(ws.joining)
            else:
                live = reserved = len(admitted)
                ws.session_counts = (live, reserved)
                audience = list(ws.joining)
                if WarningLatch().observe(reserved, self.policy):
                    self._publish(
                        audience,
                        "mcp_budget_warning",
                        warning_event(self.policy, live=live, reserved=reserved, scope="session"),
                    )
            if refused_pairs:
                self._publish(
                    audience,
                    "mcp_child_refused_batch",
                    refused_batch_event(
                        self.policy, refused_pairs, live=live, reserved=reserved, scope=self.scope
                    ),
                )
            return self._hand_out(ws, usable, admitted)
        finally:
            ws.in_progress = False
            ws.joining = []

    def _trusted_only(
        self, ws: WorkspaceMcp, servers: list[McpServerConfig]
    ) -> list[McpServerConfig]:
        """The servers whose command the operator vouched for; the others are held, said
        once per distinct config (``mcp_server_untrusted`` event, a warning in the log)."""
        out: list[McpServerConfig] = []
        for server in servers:
            if ws.trusted.get(server.name) == server:
                out.append(server)
                continue
            if ws.reported.get(server.name) == server:
                continue
            ws.reported[server.name] = server
            reason = "command_changed" if server.name in ws.trusted else "new_server"
            logger.warning(
                "MCP pool: not starting %r in %s: its command %s since the daemon started or "
                "the operator last restarted it (POST /workspace/mcp/%s/restart starts it)",
                server.name,
                ws.path,
                "changed" if reason == "command_changed" else "was added",
                server.name,
            )
            self._publish(
                self._audience(ws),
                "mcp_server_untrusted",
                {
                    "serverName": server.name,
                    "reason": reason,
                    "command": server.command,
                    "args": list(server.args),
                    "hint": f"POST /workspace/mcp/{server.name}/restart to run it",
                },
            )
        return out

    def _hand_out(
        self, ws: WorkspaceMcp, usable: list[McpServerConfig], admitted: set[str]
    ) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for server in usable:
            if server.name not in admitted:
                continue
            if self.pooling and server.transport == "stdio":
                entry = ws.entries.get(server.name)
                if entry is None or not entry.reserved:
                    continue
                out.append(
                    acp_server(
                        server,
                        command=sys.executable,
                        args=("-I", BRIDGE_SCRIPT, entry.socket_path),
                    )
                )
            else:
                out.append(acp_server(server))
        return out

    async def _reconcile(self, ws: WorkspaceMcp, wanted: list[McpServerConfig]) -> None:
        wanted_by = {s.name: s for s in wanted}
        for name, entry in list(ws.entries.items()):
            if wanted_by.get(name) != entry.config:
                del ws.entries[name]
                await entry.close()
        fresh = [s for s in wanted if s.name not in ws.entries]
        if not fresh:
            return
        nursery = self._nursery
        assert nursery is not None
        socket_dir = await self._ensure_socket_dir()
        async with trio.open_nursery() as starters:
            for server in fresh:
                ws.serial += 1
                entry = PoolEntry(
                    server,
                    workspace=ws.path,
                    socket_path=os.path.join(socket_dir, f"{ws.index}-{ws.serial}.sock"),
                    nursery=nursery,
                    handshake_timeout_s=self.handshake_timeout_s,
                    on_change=functools.partial(self._on_entry_change, ws),
                    env=self._environ,
                )
                ws.entries[server.name] = entry
                starters.start_soon(self._open_and_start, entry)

    async def _open_and_start(self, entry: PoolEntry) -> None:
        try:
            await entry.open()
            await entry.start()
        except McpStartFailed as exc:
            logger.warning("%s", exc)
        except OSError as exc:
            logger.warning("MCP pool: cannot open the socket of %s: %r", entry.name, exc)
            entry.state = EntryState.FAILED
            entry.error_kind, entry.error = "mcp_server_spawn_failed", str(exc)

    # ---- restarts ------------------------------------------------------------------------

    async def _run_restart(
        self, ws: WorkspaceMcp, name: str, originator: str | None, ticket: Ticket[dict[str, Any]]
    ) -> None:
        try:
            async with ws.lock:
                ticket.set(await self._restart_locked(ws, name, originator))
        except (McpServerNotFound, McpRestartFailed) as exc:
            ticket.fail(exc)
        except Exception as exc:
            logger.exception("MCP restart of %s failed", name)
            ticket.fail(exc)
        finally:
            ws.restarting.discard(name)

    async def _restart_locked(
        self, ws: WorkspaceMcp, name: str, originator: str | None
    ) -> dict[str, Any]:
        began = trio.current_time()
        activated_now = False
        # A restart is the operator's action: the server's current command is trusted.
        fresh = await trio.to_thread.run_sync(load_config, ws.path, self._environ)
        current = fresh.get(name)
        if current is not None and current.transport == "stdio":
            ws.trusted[name] = current
            if ws.reported.pop(name, None) is not None:
                ws.config = None  # it was held: the pass below starts it, now trusted
        config = ws.config
        if config is None or not ws.activated:
            config = await trio.to_thread.run_sync(load_config, ws.path, self._environ)
            server = config.get(name)
            _, admitted, _ = admission_sets(config, self.policy)
            if (
                self.pooling
                and server is not None
                and server.transport == "stdio"
                and server.name in admitted
            ):
                await self._pass_locked(ws, None)
                activated_now = True
                config = ws.config or config
        server = config.get(name)
        if server is None:
            raise McpServerNotFound(name, f'MCP server "{name}" is not configured')
        if not server.usable:
            details = server.invalid or "disabled by the workspace settings"
            return self._skipped(ws, name, "disabled", originator, details)
        _, _, refused = admission_sets(config, self.policy)
        if name in refused:
            return self._skipped(ws, name, "budget_would_exceed", originator)
        if not self.pooling or server.transport != "stdio":
            why = (
                "the shared MCP pool is off (QWEN_SERVE_NO_MCP_POOL=1)"
                if not self.pooling
                else f"{server.transport} servers are connected by each agent"
            )
            raise McpServerNotFound(
                name, f'MCP server "{name}" has no daemon-managed instance: {why}', "not_pooled"
            )
        entry = ws.entries.get(name)
        if entry is None:
            await self._pass_locked(ws, None)
            entry = ws.entries.get(name)
            activated_now = True
        if entry is None:
            raise McpRestartFailed(name, "mcp_server_spawn_failed", "no pool entry was created")
        try:
            if activated_now and entry.live:
                duration_s = trio.current_time() - began
            else:
                duration_s = await entry.restart()
        except McpStartFailed as exc:
            self._publish(
                self._audience(ws),
                "mcp_server_restart_refused",
                _with_origin(
                    {"serverName": name, "reason": "restart_failed", "details": exc.detail},
                    originator,
                ),
                originator,
            )
            raise McpRestartFailed(name, exc.error_kind, exc.detail) from None
        if not entry.live:
            detail = entry.error or "the server is not running"
            raise McpRestartFailed(name, entry.error_kind or "mcp_server_spawn_failed", detail)
        duration_ms = round(duration_s * 1000)
        self._publish(
            self._audience(ws),
            "mcp_server_restarted",
            _with_origin({"serverName": name, "durationMs": duration_ms}, originator),
            originator,
        )
        return {"serverName": name, "restarted": True, "durationMs": duration_ms}

    def _skipped(
        self,
        ws: WorkspaceMcp,
        name: str,
        reason: str,
        originator: str | None,
        details: str | None = None,
    ) -> dict[str, Any]:
        data: dict[str, Any] = {"serverName": name, "reason": reason}
        if details is not None:
            data["details"] = details
        self._publish(
            self._audience(ws),
            "mcp_server_restart_refused",
            _with_origin(dict(data), originator),
            originator,
        )
        return {"serverName": name, "restarted": False, "skipped": True, "reason": reason}

    # ---- accounting and events -----------------------------------------------------------

    def _counts(self, ws: WorkspaceMcp) -> tuple[int, int]:
        """``(live, reserved)`` for the workspace's budget scope."""
        return counts(ws, self.policy, self.pooling)

    def _recount(self, ws: WorkspaceMcp) -> tuple[int, int]:
        live, reserved = self._counts(ws)
        if ws.latch.observe(reserved, self.policy):
            self._publish(
                self._audience(ws),
                "mcp_budget_warning",
                warning_event(self.policy, live=live, reserved=reserved, scope=self.scope),
            )
        return live, reserved

    def _on_entry_change(self, ws: WorkspaceMcp, _entry: PoolEntry) -> None:
        if self.pooling:
            self._recount(ws)

    def _audience(self, ws: WorkspaceMcp) -> list[Mailbox[PublishEvent]]:
        sessions = list(self._sessions_for(ws.path))
        for extra in ws.joining:
            if all(extra is not known for known in sessions):
                sessions.append(extra)
        return sessions

    def _publish(
        self,
        sessions: list[Mailbox[PublishEvent]],
        event_type: str,
        data: dict[str, Any],
        originator: str | None = None,
    ) -> None:
        event = PublishEvent(event_type, data, originator=originator)
        for session in sessions:
            self.outbox.post(session, event)


def _with_origin(data: dict[str, Any], originator: str | None) -> dict[str, Any]:
    if originator is not None:
        data["originatorClientId"] = originator
    return data


def _make_socket_dir(base: str) -> tuple[str, bool]:
    """A private (0700) directory for the pool's sockets; a temp dir if ``base`` is long."""
    path = os.path.join(base, f"mcp-{os.getpid()}")
    if len(path) + 16 <= MAX_SOCKET_PATH:
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            os.chmod(path, 0o700)
            return path, False
        except OSError as exc:
            logger.warning("MCP pool: cannot use %s for sockets (%s); using a temp dir", path, exc)
    return tempfile.mkdtemp(prefix="acp-mcp-"), True
