"""One pooled stdio MCP server: its socket, its multiplexer, its supervised process.

Theory of operation
-------------------
A :class:`PoolEntry` lives as long as its server is configured and admitted in a
workspace. It owns:

* a Unix socket (mode 0600, in a 0700 directory) that agents reach through the bridge;
  every accepted connection is one agent-side MCP client, served by a reader task
  (socket → :class:`~serve.mcp.mux.Mux`) and a writer task (a bounded queue of
  :data:`CONN_QUEUE_LINES` lines → socket; a connection that lets it fill is dropped, so
  one stalled agent never blocks the server's output for the others);
* the :class:`~serve.mcp.mux.Mux`, which outlives process incarnations;
* a one-child :class:`actors.Supervisor` (``permanent``, restart intensity
  :data:`RESTART_INTENSITY` in :data:`RESTART_PERIOD_S` s) running :meth:`_incarnation`:
  spawn the process (its own process group, stopped by escalation, always reaped),
  ``initialize`` → ``notifications/initialized`` → ``tools/list`` within
  ``handshake_timeout_s``, report readiness, then wait for the exit. An exit is a crash
  (:class:`McpServerExited`) so the supervisor restarts it; when it gives up the entry is
  ``failed`` and stays down until an explicit :meth:`restart`.

Each entry has its own supervisor so one flapping server cannot take its siblings down.
Everything runs in the pool actor's nursery (``nursery`` given at construction); the
owner calls :meth:`close` to stop the process and the socket. State changes are reported
through ``on_change`` so the pool can recount its budget.

Errors: a first start or an explicit restart that fails before readiness raises
:class:`McpStartFailed` carrying an ``errorKind`` (``missing_binary``, ``init_timeout``,
``protocol_error``, ``mcp_server_spawn_failed``).
"""

from __future__ import annotations

import enum
import logging
import os
import socket
from collections.abc import Callable
from typing import Any, Final

import msgspec
import trio

from acp.jsonrpc import LineFramer, OversizedLine, Response, encode_notification
from acp.process import AgentProcess, ExitInfo
from actors import ChildSpec, Restart, Supervisor, SupervisorGaveUp, unwrap_group
from serve.mcp.config import McpServerConfig
from serve.mcp.mux import Mux, Out, ToClient, ToPool, ToServer

log = logging.getLogger(__name__)

MCP_PROTOCOL_VERSION: Final = "2025-06-18"
CLIENT_INFO: Final = {"name": "acp-serve", "version": "0.1.0"}
CONN_QUEUE_LINES: Final = 256
SERVER_QUEUE_LINES: Final = 256
MAX_LINE_BYTES: Final = 16 * 2**20
MAX_TOOL_PAGES: Final = 20
MAX_TOOL_NAMES: Final = 1000
RESTART_INTENSITY: Final = 3
RESTART_PERIOD_S: Final = 30.0
READY_WAIT_S: Final = 30.0
STOP_GRACE_S: Final = 1.0


class EntryState(enum.StrEnum):
    STARTING = "starting"
    CONNECTED = "connected"
    RESTARTING = "restarting"
    FAILED = "failed"
    STOPPED = "stopped"


class McpStartFailed(Exception):
    """The server could not be started or did not complete the MCP handshake."""

    def __init__(self, server: str, error_kind: str, detail: str) -> None:
        super().__init__(f"MCP server {server!r} failed to start: {detail}")
        self.server = server
        self.error_kind = error_kind
        self.detail = detail


class McpServerExited(Exception):
    """The pooled server process exited on its own (a crash for its supervisor)."""

    def __init__(self, server: str, info: ExitInfo) -> None:
        if info.signal is not None:
            how = f"was killed by signal {info.signal}"
        else:
            how = f"exited with status {info.exit_code}"
        super().__init__(f"MCP server {server!r} {how}")
        self.server = server
        self.info = info


class _ToolsPage(msgspec.Struct):
    tools: list[dict[str, Any]] = []
    nextCursor: str | None = None


_tools_decoder: Final = msgspec.json.Decoder(_ToolsPage)


class PoolEntry:
    """One pooled stdio server of one workspace; see the module docstring."""

    def __init__(
        self,
        config: McpServerConfig,
        *,
        workspace: str,
        socket_path: str,
        nursery: trio.Nursery,
        handshake_timeout_s: float,
        on_change: Callable[[PoolEntry], None],
        env: dict[str, str] | None = None,
    ) -> None:
        assert config.transport == "stdio" and config.command is not None
        self.config = config
        self.name = config.name
        self.workspace = workspace
        self.socket_path = socket_path
        self.handshake_timeout_s = handshake_timeout_s
        self._nursery = nursery
        self._on_change = on_change
        self._base_env = env
        root_uri = "file://" + workspace
        self.mux = Mux(config.name, roots=[{"uri": root_uri, "name": os.path.basename(workspace)}])
        self.state = EntryState.STARTING
        self.pid: int | None = None
        self.restarts = 0
        self.tool_names: list[str] = []
        self.tool_count = 0
        self.server_info: dict[str, Any] | None = None
        self.error_kind: str | None = None
        self.error: str | None = None
        self.restart_in_flight = False
        self._state_event = trio.Event()
        self._to_server: trio.MemorySendChannel[bytes] | None = None
        self._pool_waiters: dict[int, _Slot] = {}
        self._conns: dict[int, trio.MemorySendChannel[bytes]] = {}
        self._conn_scopes: dict[int, trio.CancelScope] = {}
        self._next_conn = 1
        self._supervisor: Supervisor | None = None
        self._proc: AgentProcess | None = None
        self._socket_scope = trio.CancelScope()
        self._closed = False
        self._incarnations = 0

    # ---- observation ---------------------------------------------------------------------

    @property
    def live(self) -> bool:
        return self.state is EntryState.CONNECTED

    @property
    def reserved(self) -> bool:
        return self.state in (EntryState.STARTING, EntryState.CONNECTED, EntryState.RESTARTING)

    def status(self) -> dict[str, Any]:
        """The pool part of this server's status cell (no env, no headers, no stderr)."""
        return {
            "entryIndex": 0,
            "state": str(self.state),
            "pid": self.pid,
            "restarts": self.restarts,
            "connections": self.mux.connections,
            "inflight": self.mux.inflight,
        }

    def _changed(self) -> None:
        wake, self._state_event = self._state_event, trio.Event()
        wake.set()
        try:
            self._on_change(self)
        except Exception:
            log.exception("MCP pool change hook failed for %s", self.name)

    # ---- lifecycle -----------------------------------------------------------------------

    async def open(self) -> None:
        """Bind the socket and start accepting connections (before the process starts)."""
        listener = await _bind_unix(self.socket_path)
        await self._nursery.start(self._serve_socket, listener)

    async def start(self) -> float:
        """Start the supervised process; returns the seconds it took to become ready."""
        began = trio.current_time()
        self.state = EntryState.STARTING if self._incarnations == 0 else EntryState.RESTARTING
        self._changed()
        try:
            await self._nursery.start(self._supervise)
        except BaseException as exc:
            self._fail(unwrap_group(exc))
            raise self._start_error(unwrap_group(exc)) from None
        return trio.current_time() - began

    async def restart(self) -> float:
        """Stop the process and start it again; returns the seconds to readiness.

        Raises :class:`McpStartFailed` when the new process does not become ready.
        """
        self.restart_in_flight = True
        try:
            began = trio.current_time()
            supervisor = self._supervisor
            self.state = EntryState.RESTARTING
            self._changed()
            if supervisor is not None and supervisor.running:
                await supervisor.stop_child("process", grace_s=STOP_GRACE_S)
                try:
                    await supervisor.start_child(self._spec())
                except BaseException as exc:
                    self._fail(unwrap_group(exc))
                    raise self._start_error(unwrap_group(exc)) from None
                return trio.current_time() - began
            await self.start()
            return trio.current_time() - began
        finally:
            self.restart_in_flight = False

    async def close(self) -> None:
        """Stop the process (escalation, reaped) and the socket; idempotent."""
        if self._closed:
            return
        self._closed = True
        supervisor = self._supervisor
        if supervisor is not None and supervisor.running:
            supervisor.shutdown()
            with trio.CancelScope(shield=True), trio.move_on_after(STOP_GRACE_S * 3 + 6):
                await supervisor.finished.wait()
        self.state = EntryState.STOPPED
        self._socket_scope.cancel()
        for scope in self._conn_scopes.values():
            scope.cancel()
        try:
            os.unlink(self.socket_path)
        except OSError:
            pass

    def _spec(self) -> ChildSpec:
        return ChildSpec(
            "process",
            self._incarnation,
            Restart.PERMANENT,
            shutdown_grace_s=STOP_GRACE_S * 3 + 5,
            backoff_s=0.1,
            max_backoff_s=2.0,
            stable_after_s=RESTART_PERIOD_S,
            stop=self._polite_stop,
        )

    async def _polite_stop(self) -> None:
        """MCP's stdio shutdown: close the server's stdin (escalation follows if ignored)."""
        proc = self._proc
        if proc is not None:
            await proc.close_stdin()

    async def _supervise(self, *, task_status: trio.TaskStatus[Supervisor]) -> None:
        supervisor = Supervisor(
            f"mcp:{self.name}", intensity=RESTART_INTENSITY, period_s=RESTART_PERIOD_S
        )
        self._supervisor = supervisor
        try:
            await supervisor.run([self._spec()], task_status=task_status)
        except SupervisorGaveUp as exc:
            log.warning("%s", exc)
            self._fail(exc, "mcp_server_spawn_failed")

    def _fail(self, exc: BaseException, kind: str | None = None) -> None:
        self.state = EntryState.FAILED if not self._closed else EntryState.STOPPED
        self.pid = None
        if isinstance(exc, McpStartFailed):
            self.error_kind, self.error = exc.error_kind, exc.detail
        elif isinstance(exc, SupervisorGaveUp):
            self.error_kind = kind or "mcp_server_spawn_failed"
            self.error = (
                f"restarted more than {RESTART_INTENSITY} times in {RESTART_PERIOD_S:g} s; gave up"
            )
        else:
            self.error_kind, self.error = kind or "mcp_server_spawn_failed", str(exc)
        self._changed()

    def _start_error(self, exc: BaseException) -> McpStartFailed:
        if isinstance(exc, McpStartFailed):
            return exc
        return McpStartFailed(self.name, self.error_kind or "mcp_server_spawn_failed", str(exc))

    # ---- one incarnation of the process --------------------------------------------------

    def _argv_env(self) -> tuple[list[str], dict[str, str]]:
        assert self.config.command is not None
        env = dict(os.environ if self._base_env is None else self._base_env)
        env.update(self.config.env)
        return [self.config.command, *self.config.args], env

    async def _incarnation(self, *, task_status: trio.TaskStatus[int]) -> None:
        self._incarnations += 1
        if self._incarnations > 1:
            self.restarts += 1
        argv, env = self._argv_env()
        async with trio.open_nursery() as nursery:
            try:
                proc = await AgentProcess.spawn(
                    nursery,
                    argv,
                    cwd=self.config.cwd or self.workspace,
                    env=env,
                    cancel_grace_s=STOP_GRACE_S,
                )
            except OSError as exc:
                kind = (
                    "missing_binary"
                    if isinstance(exc, FileNotFoundError | PermissionError | NotADirectoryError)
                    else "mcp_server_spawn_failed"
                )
                raise McpStartFailed(
                    self.name, kind, f"cannot run {argv[0]!r}: {exc.strerror}"
                ) from None
            send, recv = trio.open_memory_channel[bytes](SERVER_QUEUE_LINES)
            try:
                self._to_server = send
                self._proc = proc
                self.pid = proc.pid
                nursery.start_soon(self._server_writer, proc, recv)
                nursery.start_soon(self._server_reader, proc)
                await self._handshake(proc)
                self.state = EntryState.CONNECTED
                self.error_kind = self.error = None
                self._changed()
                task_status.started(proc.pid)
                info = await proc.wait()
                raise McpServerExited(self.name, info)
            finally:
                with trio.CancelScope(shield=True):
                    self._to_server = None
                    send.close()
                    await self._deliver_nowait(self.mux.reset("restarted or stopped"))
                    await proc.stop(STOP_GRACE_S)
                    self._proc = None
                    self.pid = None
                    if self.state is EntryState.CONNECTED and not self._closed:
                        self.state = EntryState.RESTARTING
                        self._changed()
                nursery.cancel_scope.cancel()

    async def _handshake(self, proc: AgentProcess) -> None:
        try:
            with trio.fail_after(self.handshake_timeout_s):
                init = await self._pool_call(
                    "initialize",
                    {
                        "protocolVersion": MCP_PROTOCOL_VERSION,
                        "capabilities": {"roots": {"listChanged": False}},
                        "clientInfo": CLIENT_INFO,
                    },
                )
                decoded = msgspec.json.decode(init)
                if not isinstance(decoded, dict):
                    raise McpStartFailed(self.name, "protocol_error", "bad initialize result")
                info = decoded.get("serverInfo")
                self.server_info = info if isinstance(info, dict) else None
                self.mux.init_result = msgspec.Raw(bytes(init))
                send = self._to_server
                assert send is not None
                await send.send(encode_notification("notifications/initialized", None))
                await self._list_tools()
        except trio.TooSlowError:
            raise McpStartFailed(
                self.name,
                "init_timeout",
                f"no MCP handshake within {self.handshake_timeout_s:g} s",
            ) from None
        except msgspec.DecodeError as exc:
            raise McpStartFailed(self.name, "protocol_error", f"bad handshake: {exc}") from None

    async def _list_tools(self) -> None:
        names: list[str] = []
        count = 0
        cursor: str | None = None
        for _ in range(MAX_TOOL_PAGES):
            raw = await self._pool_call("tools/list", {"cursor": cursor} if cursor else {})
            page = _tools_decoder.decode(raw)
            count += len(page.tools)
            for tool in page.tools:
                name = tool.get("name")
                if isinstance(name, str) and len(names) < MAX_TOOL_NAMES:
                    names.append(name)
            cursor = page.nextCursor
            if not cursor:
                break
        self.tool_names = names
        self.tool_count = count

    async def _pool_call(self, method: str, params: dict[str, Any]) -> bytes:
        send = self._to_server
        if send is None:
            raise McpStartFailed(self.name, "protocol_error", "server is not running")
        uid, line = self.mux.pool_request(method, params)
        slot = _Slot()
        self._pool_waiters[uid] = slot
        try:
            await send.send(line)
            response = await slot.wait()
        finally:
            self._pool_waiters.pop(uid, None)
        if response.error is not None:
            raise McpStartFailed(
                self.name,
                "protocol_error",
                f"{method} failed: {response.error.code} {response.error.message}",
            )
        return bytes(response.result)

    async def _server_writer(
        self, proc: AgentProcess, recv: trio.MemoryReceiveChannel[bytes]
    ) -> None:
        try:
            async for line in recv:
                await proc.stdin.send_all(line)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _server_reader(self, proc: AgentProcess) -> None:
        framer = LineFramer(MAX_LINE_BYTES)
        try:
            while True:
                data = await proc.stdout.receive_some(65536)
                if not data:
                    break
                for line in framer.feed(data):
                    if isinstance(line, OversizedLine):
                        log.warning("MCP server %s sent a %d-byte line", self.name, line.size)
                        continue
                    await self._deliver(self.mux.from_server(bytes(line)))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        await self._deliver_nowait(self.mux.reset("closed its output"))

    # ---- routing -------------------------------------------------------------------------

    async def _deliver(self, outs: list[Out]) -> None:
        for out in outs:
            if isinstance(out, ToServer):
                send = self._to_server
                if send is None:
                    await self._deliver_nowait(self.mux.reset("is not running"))
                    continue
                try:
                    await send.send(out.line)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    await self._deliver_nowait(self.mux.reset("is not running"))
            else:
                self._route_nowait(out)

    async def _deliver_nowait(self, outs: list[Out]) -> None:
        for out in outs:
            if isinstance(out, ToServer):
                send = self._to_server
                if send is not None:
                    try:
                        send.send_nowait(out.line)
                    except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                        pass
            else:
                self._route_nowait(out)

    def _route_nowait(self, out: ToClient | ToPool) -> None:
        if isinstance(out, ToPool):
            slot = self._pool_waiters.get(out.id)
            if slot is not None:
                slot.set(out.response)
            return
        send = self._conns.get(out.conn)
        if send is None:
            return
        try:
            send.send_nowait(out.line)
        except trio.WouldBlock:
            log.warning("MCP pool: dropping a stalled client of %s", self.name)
            scope = self._conn_scopes.get(out.conn)
            if scope is not None:
                scope.cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    # ---- the socket side -----------------------------------------------------------------

    async def _serve_socket(
        self, listener: trio.SocketListener, *, task_status: trio.TaskStatus[None]
    ) -> None:
        with self._socket_scope:
            async with listener, trio.open_nursery() as nursery:
                task_status.started()
                while True:
                    try:
                        stream = await listener.accept()
                    except (trio.ClosedResourceError, OSError) as exc:
                        log.warning("MCP pool socket of %s failed: %r", self.name, exc)
                        return
                    nursery.start_soon(self._serve_conn, stream)

    async def _serve_conn(self, stream: trio.SocketStream) -> None:
        conn = self._next_conn
        self._next_conn += 1
        send, recv = trio.open_memory_channel[bytes](CONN_QUEUE_LINES)
        scope = trio.CancelScope()
        self._conns[conn] = send
        self._conn_scopes[conn] = scope
        self.mux.attach(conn)
        try:
            with scope:
                async with stream, trio.open_nursery() as nursery:
                    nursery.start_soon(self._conn_writer, stream, recv, scope)
                    with trio.move_on_after(READY_WAIT_S):
                        while self.state in (EntryState.STARTING, EntryState.RESTARTING):
                            await self._state_event.wait()
                    framer = LineFramer(MAX_LINE_BYTES)
                    while True:
                        data = await stream.receive_some(65536)
                        if not data:
                            break
                        for line in framer.feed(data):
                            if isinstance(line, OversizedLine):
                                continue
                            await self._deliver(self.mux.from_client(conn, bytes(line)))
                    nursery.cancel_scope.cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            del self._conns[conn]
            del self._conn_scopes[conn]
            send.close()
            with trio.CancelScope(shield=True):
                await self._deliver_nowait(self.mux.detach(conn))

    async def _conn_writer(
        self,
        stream: trio.SocketStream,
        recv: trio.MemoryReceiveChannel[bytes],
        scope: trio.CancelScope,
    ) -> None:
        try:
            async for line in recv:
                await stream.send_all(line)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            scope.cancel()


class _Slot:
    """The response to one of the pool's own requests, set once by the reader."""

    __slots__ = ("_event", "value")

    def __init__(self) -> None:
        self._event = trio.Event()
        self.value: Response | None = None

    def set(self, value: Response) -> None:
        if not self._event.is_set():
            self.value = value
            self._event.set()

    async def wait(self) -> Response:
        await self._event.wait()
        assert self.value is not None  # set before the event
        return self.value


async def _bind_unix(path: str) -> trio.SocketListener:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        await sock.bind(path)
        os.chmod(path, 0o600)  # the directory is 0700 already; this is belt and braces
        sock.listen(64)
    except BaseException:
        sock.close()
        raise
    return trio.SocketListener(sock)
