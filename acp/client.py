"""The daemon's side of one ACP connection: a supervised agent child plus typed ACP calls.

Theory of operation
-------------------
:meth:`AgentConnection.spawn` starts, in the caller's nursery, one task that owns everything
about the connection inside a private nursery: the :class:`~acp.process.AgentProcess`
(stderr tail, exit watch, group kill), the :class:`~acp.rpc.RpcChannel` reader and writer,
the tasks serving agent -> client requests, and (for a :class:`~acp.handler.BaseClientHandler`
without one) a :class:`~acp.terminal.TerminalManager`.

Everything the agent sends is routed to the :class:`~acp.handler.ClientHandler`:
``session/update`` -> ``on_session_update(session_id, kind, raw_update)`` from the reader, in
wire order (so the updates ``session/load`` replays arrive before :meth:`load_session` returns);
other notifications -> ``on_notification``; requests -> the matching async method in its own
task (unknown ones -> ``ext_request`` -> ``-32601`` by default).

Death and closing. The connection closes when the agent closes its stdout (we then wait up to
1 s for its exit status so the error can say how it ended), when the child exits (the reader
gets 2 s to drain what it already wrote), when the owning nursery is cancelled, or on
:meth:`aclose`. Closing fails every pending call with :class:`~acp.errors.ChannelClosed` at
once, and any later call raises it immediately; then the child is stopped by escalation (if
still running) and reaped, terminals are killed, and the private nursery ends.
:meth:`wait_closed` returns the :class:`~acp.process.ExitInfo` after that.

Timeouts: every call but :meth:`prompt` defaults to ``request_timeout_s``
(:class:`~acp.errors.RequestTimeout`); ``timeout_s=math.inf`` waits forever. :meth:`prompt`
waits forever unless given a ``timeout_s``: ending a turn is the agent's job
(``session/cancel``).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

import msgspec
import trio
from msgspec import Raw

from acp import jsonrpc
from acp.confine import Confinement
from acp.errors import METHOD_NOT_FOUND, ChannelClosed, ProtocolError, RemoteError
from acp.handler import BaseClientHandler, ClientHandler
from acp.process import DEFAULT_GRACE_S, STDERR_TAIL_BYTES, AgentProcess, ExitInfo
from acp.rpc import DEFAULT_MAX_CONCURRENT_REQUESTS, RpcChannel, RpcStatistics
from acp.schema import (
    PROTOCOL_VERSION,
    AuthenticateParams,
    ClientCapabilities,
    ContentBlock,
    CreateTerminalParams,
    CreateTerminalResult,
    EmptyResult,
    FileSystemCapability,
    Implementation,
    InitializeParams,
    InitializeResult,
    ListSessionsParams,
    ListSessionsResult,
    LoadSessionParams,
    NewSessionParams,
    PromptResult,
    ReadTextFileParams,
    ReadTextFileResult,
    RequestPermissionParams,
    RequestPermissionResult,
    SessionConfigOption,
    SessionIdParams,
    SessionSetup,
    SessionUpdateHead,
    SetConfigOptionParams,
    SetConfigOptionResult,
    SetModelParams,
    SetModeParams,
    TerminalIdParams,
    UpdateKind,
    WriteTextFileParams,
    decode_initialize_result,
    decode_list_sessions_result,
    decode_prompt_result,
    decode_session_setup,
    find_model_option,
    lenient_list,
)
from acp.terminal import TerminalManager

log = logging.getLogger(__name__)

DEFAULT_CLIENT_CAPABILITIES: Final = ClientCapabilities(
    fs=FileSystemCapability(read_text_file=True, write_text_file=True),
    terminal=True,
    session={"configOptions": {"boolean": {}}},
)
DEFAULT_CLIENT_INFO: Final = Implementation(name="acp-serve", title="acp-serve", version="0.1.0")
EOF_EXIT_WAIT_S: Final = 1.0
EXIT_DRAIN_WAIT_S: Final = 2.0
RESUME_METHODS: Final = ("session/resume", "session/unstable_resumeSession")
#: The ``session/prompt`` params a caller may add through :meth:`AgentConnection.prompt`'s
#: ``extra``: ACP's ``PromptRequest`` has ``sessionId``, ``prompt`` and ``_meta``, and the first
#: two are always the connection's own (a caller's key never replaces them).
PROMPT_EXTRA_KEYS: Final = frozenset({"_meta"})

_head_decoder: Final = msgspec.json.Decoder(SessionUpdateHead)
_kind_decoder: Final = msgspec.json.Decoder(UpdateKind)
#: ``{"sessionUpdate":"<kind>"`` at the start of an update (how agents write it): the kind
#: without a second full decode of a possibly multi-MiB update.
_KIND_PREFIX: Final = re.compile(rb'\A\s*\{\s*"sessionUpdate"\s*:\s*"([A-Za-z0-9_]{1,64})"')


class _ConfigOptionsUpdate(msgspec.Struct, frozen=True, rename="camel"):
    config_options: Raw = jsonrpc.EMPTY


def _decode[T](method: str, raw: Raw, decode: Callable[[Raw], T]) -> T:
    try:
        return decode(raw)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"agent sent a malformed {method} result: {exc}") from exc


_SESSION_ID_RE: Final = re.compile(rb'(?<!\\)"sessionId"\s*:\s*"([^"\\]{1,256})"')


def named_session(excerpt: bytes) -> str | None:
    """The ``sessionId`` a dropped line names, read from its excerpt (start, ``\\n``, end):
    the first one at its start (``params.sessionId`` comes first in what agents send),
    else the last one at its end; None when neither shows one."""
    head, _, tail = excerpt.partition(b"\n")
    found = _SESSION_ID_RE.search(head)
    if found is None:
        found = next(reversed(list(_SESSION_ID_RE.finditer(tail))), None)
    return found.group(1).decode("utf-8", "replace") if found is not None else None


class AgentConnection:
    """One ACP agent child and the client side of its connection (see the module docstring)."""

    info: InitializeResult | None
    process: AgentProcess

    def __init__(
        self,
        handler: ClientHandler,
        *,
        request_timeout_s: float,
        client_capabilities: ClientCapabilities,
        client_info: Implementation,
    ) -> None:
        self.handler = handler
        self._flow_hook: Callable[[int], Awaitable[None]] | None = getattr(
            handler, "flow_control", None
        )
        self.request_timeout_s = request_timeout_s
        self.client_capabilities = client_capabilities
        self.client_info = client_info
        self.info = None
        self._channel: RpcChannel | None = None
        self._terminals: TerminalManager | None = None
        self._closed_event = trio.Event()
        self._done = trio.Event()
        self._config_options: dict[str, list[SessionConfigOption]] = {}
        self._resume_method: str | None = None
        self._stop_grace_s = DEFAULT_GRACE_S
        self._stop_eof_grace_s: float | None = None

    # -- construction and lifecycle -----------------------------------------------------------

    @classmethod
    async def spawn(
        cls,
        nursery: trio.Nursery,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str] | None = None,
        handler: ClientHandler | None = None,
        max_line_bytes: int = jsonrpc.DEFAULT_MAX_LINE_BYTES,
        request_timeout_s: float = 10.0,
        client_capabilities: ClientCapabilities = DEFAULT_CLIENT_CAPABILITIES,
        client_info: Implementation = DEFAULT_CLIENT_INFO,
        max_concurrent_requests: int = DEFAULT_MAX_CONCURRENT_REQUESTS,
        stderr_tail_bytes: int = STDERR_TAIL_BYTES,
        confine: Confinement | None = None,
    ) -> AgentConnection:
        """Start the agent ``argv`` (cwd ``cwd``, scrubbed ``env`` or ours) and its tasks in
        ``nursery``. Returns once the child runs; call :meth:`initialize` next. ``confine``:
        see :meth:`AgentProcess.open`.

        Raises ``OSError`` if the command cannot be started."""
        self = cls(
            handler if handler is not None else BaseClientHandler(),
            request_timeout_s=request_timeout_s,
            client_capabilities=client_capabilities,
            client_info=client_info,
        )
        await nursery.start(
            self._run,
            list(argv),
            cwd,
            env,
            max_line_bytes,
            max_concurrent_requests,
            stderr_tail_bytes,
            confine,
            name=f"acp-connection {argv[0] if argv else '?'}",
        )
        return self

    async def _run(
        self,
        argv: list[str],
        cwd: str,
        env: Mapping[str, str] | None,
        max_line_bytes: int,
        max_concurrent_requests: int,
        stderr_tail_bytes: int,
        confine: Confinement | None = None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        # Opened outside the nursery so that a failure to start (OSError) reaches spawn()'s
        # caller as itself, not wrapped in an ExceptionGroup.
        self.process = await AgentProcess.open(
            argv, cwd=cwd, env=env, stderr_tail_bytes=stderr_tail_bytes, confine=confine
        )
        try:
            async with trio.open_nursery() as nursery:
                self.process.start(nursery)
                if isinstance(self.handler, BaseClientHandler) and self.handler.terminals is None:
                    # The agent's terminals run inside its confinement (its cgroups:
                    # they count against its limits, like the tools it starts itself).
                    self._terminals = TerminalManager(nursery, cwd=cwd, env=env, confine=confine)
                    self.handler.terminals = self._terminals
                self._channel = RpcChannel(
                    self.process.stdin,
                    self.process.stdout,
                    self,
                    name=f"agent {self.process.pid}",
                    max_line_bytes=max_line_bytes,
                    max_concurrent_requests=max_concurrent_requests,
                    on_read_closed=self._on_read_closed,
                    # session/update is decoded with the envelope, in one pass.
                    typed_notifications={"session/update": SessionUpdateHead},
                )
                self._channel.start(nursery)
                nursery.start_soon(self._watch_exit)
                task_status.started()
                await self._closed_event.wait()
                with trio.CancelScope(shield=True):
                    # Let the writer flush what was queued before stdin is closed.
                    with trio.move_on_after(min(self._stop_grace_s, 1.0)):
                        await self._channel.writer_done.wait()
                    await self.process.stop(self._stop_grace_s, eof_grace_s=self._stop_eof_grace_s)
                    if self._terminals is not None:
                        await self._terminals.aclose()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                if self._channel is not None:
                    self._close(ChannelClosed("connection task ended", self.process.exit_info))
                await self.process.stop(DEFAULT_GRACE_S)
                if self._terminals is not None:
                    await self._terminals.aclose()
            self._done.set()

    def _close(self, exc: ChannelClosed) -> None:
        assert self._channel is not None
        self._channel.close(exc)
        self._closed_event.set()

    async def _on_read_closed(self, reason: str) -> None:
        exit_info: ExitInfo | None = None
        with trio.move_on_after(EOF_EXIT_WAIT_S):
            exit_info = await self.process.wait()
        self._close(ChannelClosed(reason, exit_info))

    async def _watch_exit(self) -> None:
        exit_info = await self.process.wait()
        assert self._channel is not None
        with trio.move_on_after(EXIT_DRAIN_WAIT_S):
            await self._channel.reader_done.wait()
        if not self._channel.reader_done.is_set():
            self._channel.cancel_reader()
        self._close(ChannelClosed("agent exited", exit_info))

    @property
    def closed(self) -> bool:
        return self._channel is None or self._channel.closed

    @property
    def close_reason(self) -> ChannelClosed | None:
        return None if self._channel is None else self._channel.close_reason

    async def wait_closed(self) -> ExitInfo:
        """Wait until the connection is closed and the child has exited and been reaped."""
        await self._done.wait()
        info = self.process.exit_info
        assert info is not None
        return info

    async def aclose(
        self, grace_s: float = DEFAULT_GRACE_S, *, eof_grace_s: float | None = None
    ) -> ExitInfo:
        """Close: refuse new calls, fail pending ones, flush, then stop the child by escalation
        (close stdin, ``eof_grace_s`` (default ``grace_s``), SIGTERM group, ``grace_s``, SIGKILL
        group) and reap it. Idempotent; shielded with its own deadline, so safe from a
        cancelled scope."""
        with trio.CancelScope(shield=True):
            with trio.move_on_after(2 * grace_s + 10):
                if self._channel is not None and not self._closed_event.is_set():
                    self._stop_grace_s = grace_s
                    self._stop_eof_grace_s = eof_grace_s
                    self._close(ChannelClosed("connection closed by the client"))
                await self._done.wait()
        info = self.process.exit_info
        return info if info is not None else ExitInfo.from_returncode(None, self.stderr_tail())

    def stderr_tail(self) -> str:
        return self.process.stderr_tail()

    def statistics(self) -> RpcStatistics | None:
        return None if self._channel is None else self._channel.statistics()

    # -- dispatch (called by the RpcChannel) --------------------------------------------------

    def on_notification(self, method: str, params: Raw | msgspec.Struct) -> None:
        if method == "session/update":
            try:
                if isinstance(params, SessionUpdateHead):
                    head = params
                elif isinstance(params, Raw):
                    head = _head_decoder.decode(params)
                else:  # (the channel decodes this method as SessionUpdateHead only)
                    return
                found = _KIND_PREFIX.match(head.update)
                if found is not None:
                    kind = found.group(1).decode()
                else:
                    kind = _kind_decoder.decode(head.update).sessionUpdate
            except msgspec.DecodeError as exc:
                log.warning("dropping malformed session/update from agent: %s", exc)
                return
            if kind == "config_option_update":
                self._remember_config_update(head.session_id, head.update)
            self.handler.on_session_update(head.session_id, kind, head.update)
        elif isinstance(params, Raw):  # (only session/update is decoded as a Struct)
            self.handler.on_notification(method, params)

    def on_oversized_line(self, size: int, limit: int, excerpt: bytes = b"") -> None:
        """A line over the cap was dropped: tell the handler (if it wants to know) with the
        session the line named, when its start or end names one (:func:`named_session`)."""
        hook = getattr(self.handler, "on_oversized_line", None)
        if hook is not None:
            hook(size, limit, named_session(excerpt))

    async def flow_control(self, incoming_bytes: int = 0) -> None:
        """Let the handler pace the reader (see :class:`acp.rpc.FlowControlled`)."""
        hook = self._flow_hook
        if hook is not None:
            await hook(incoming_bytes)

    async def on_request(self, method: str, params: Raw) -> object:
        h = self.handler
        if method == "session/request_permission":
            perm = msgspec.json.decode(params, type=RequestPermissionParams)
            return RequestPermissionResult(outcome=await h.request_permission(perm, params))
        if method == "fs/read_text_file":
            read = msgspec.json.decode(params, type=ReadTextFileParams)
            return ReadTextFileResult(content=await h.read_text_file(read))
        if method == "fs/write_text_file":
            await h.write_text_file(msgspec.json.decode(params, type=WriteTextFileParams))
            return EmptyResult()
        if method.startswith("terminal/"):
            if method == "terminal/create":
                create = msgspec.json.decode(params, type=CreateTerminalParams)
                return CreateTerminalResult(terminal_id=await h.terminal_create(create))
            tid = msgspec.json.decode(params, type=TerminalIdParams)
            if method == "terminal/output":
                return await h.terminal_output(tid)
            if method == "terminal/wait_for_exit":
                return await h.terminal_wait_for_exit(tid)
            if method == "terminal/kill":
                await h.terminal_kill(tid)
                return EmptyResult()
            if method == "terminal/release":
                await h.terminal_release(tid)
                return EmptyResult()
        return await h.ext_request(method, params)

    def _remember_config_update(self, session_id: str, update: Raw) -> None:
        try:
            raw = msgspec.json.decode(update, type=_ConfigOptionsUpdate).config_options
        except msgspec.DecodeError:
            return
        options = lenient_list(raw, SessionConfigOption, what="configOption")
        if options is not None:
            self._config_options[session_id] = options

    # -- generic calls ------------------------------------------------------------------------

    def _chan(self) -> RpcChannel:
        if self._channel is None:
            raise ChannelClosed("connection not started")
        return self._channel

    async def request(self, method: str, params: object, timeout_s: float | None = None) -> Raw:
        """Send any request (vendor extensions too); returns the raw result bytes.

        ``timeout_s=None`` uses ``request_timeout_s``; ``math.inf`` waits forever."""
        timeout = self.request_timeout_s if timeout_s is None else timeout_s
        return await self._chan().call(method, params, None if math.isinf(timeout) else timeout)

    async def notify(self, method: str, params: object) -> None:
        """Send a notification; queueing is bounded by ``request_timeout_s``."""
        await self._chan().notify(method, params, self.request_timeout_s)

    # -- ACP ----------------------------------------------------------------------------------

    async def initialize(self, timeout_s: float | None = None) -> InitializeResult:
        """Handshake: advertise our capabilities, record the agent's (``self.info``).

        Raises ProtocolError if the agent answers with a protocol version other than ours."""
        params = InitializeParams(
            protocol_version=PROTOCOL_VERSION,
            client_capabilities=self.client_capabilities,
            client_info=self.client_info,
        )
        raw = await self.request("initialize", params, timeout_s)
        info: InitializeResult = _decode("initialize", raw, decode_initialize_result)
        if info.protocol_version != PROTOCOL_VERSION:
            raise ProtocolError(
                f"agent speaks ACP protocol version {info.protocol_version}; "
                f"this client speaks {PROTOCOL_VERSION}"
            )
        self.info = info
        return info

    async def authenticate(self, method_id: str, timeout_s: float | None = None) -> None:
        await self.request("authenticate", AuthenticateParams(method_id=method_id), timeout_s)

    def _remember_setup(self, session_id: str, setup: SessionSetup) -> None:
        if setup.config_options is not None:
            self._config_options[session_id] = setup.config_options

    async def new_session(
        self,
        cwd: str,
        mcp_servers: Sequence[dict[str, Any]] = (),
        timeout_s: float | None = None,
        *,
        additional_directories: Sequence[str] | None = None,
    ) -> SessionSetup:
        params = NewSessionParams(
            cwd=cwd,
            mcp_servers=list(mcp_servers),
            additional_directories=None
            if additional_directories is None
            else list(additional_directories),
        )
        return await self._created("session/new", params, timeout_s)

    async def _created(
        self, method: str, params: NewSessionParams | LoadSessionParams, timeout_s: float | None
    ) -> SessionSetup:
        """``session/new`` or ``session/fork``: the setup of the session the agent made."""
        raw = await self.request(method, params, timeout_s)
        setup: SessionSetup = _decode(method, raw, decode_session_setup)
        if not setup.session_id:
            raise ProtocolError(f"agent answered {method} without a sessionId")
        self._remember_setup(setup.session_id, setup)
        return setup

    async def fork_session(
        self,
        session_id: str,
        cwd: str,
        mcp_servers: Sequence[dict[str, Any]] = (),
        timeout_s: float | None = None,
    ) -> SessionSetup:
        """``session/fork`` (unstable ACP, ``sessionCapabilities.fork``): a new agent session
        from ``session_id``'s context; its setup names the new id."""
        params = LoadSessionParams(session_id=session_id, cwd=cwd, mcp_servers=list(mcp_servers))
        return await self._created("session/fork", params, timeout_s)

    async def load_session(
        self,
        session_id: str,
        cwd: str,
        mcp_servers: Sequence[dict[str, Any]] = (),
        timeout_s: float | None = None,
        *,
        additional_directories: Sequence[str] | None = None,
    ) -> SessionSetup:
        """``session/load``: the replayed history reaches ``on_session_update`` before this
        returns."""
        params = LoadSessionParams(
            session_id=session_id,
            cwd=cwd,
            mcp_servers=list(mcp_servers),
            additional_directories=list(additional_directories) if additional_directories else None,
        )
        raw = await self.request("session/load", params, timeout_s)
        setup: SessionSetup = _decode("session/load", raw, decode_session_setup)
        setup = msgspec.structs.replace(setup, session_id=session_id)
        self._remember_setup(session_id, setup)
        return setup

    async def resume_session(
        self,
        session_id: str,
        cwd: str,
        mcp_servers: Sequence[dict[str, Any]] = (),
        timeout_s: float | None = None,
        *,
        additional_directories: Sequence[str] | None = None,
    ) -> SessionSetup:
        """``session/resume`` (no replay); falls back to the older
        ``session/unstable_resumeSession`` when the agent answers -32601 (remembered)."""
        params = LoadSessionParams(
            session_id=session_id,
            cwd=cwd,
            mcp_servers=list(mcp_servers),
            additional_directories=list(additional_directories) if additional_directories else None,
        )
        methods = (self._resume_method,) if self._resume_method else RESUME_METHODS
        for i, method in enumerate(methods):
            try:
                raw = await self.request(method, params, timeout_s)
            except RemoteError as exc:
                if exc.code == METHOD_NOT_FOUND and i + 1 < len(methods):
                    continue
                raise
            self._resume_method = method
            setup: SessionSetup = _decode(method, raw, decode_session_setup)
            setup = msgspec.structs.replace(setup, session_id=session_id)
            self._remember_setup(session_id, setup)
            return setup
        raise AssertionError("unreachable")

    async def list_sessions(
        self, cwd: str | None = None, cursor: str | None = None, timeout_s: float | None = None
    ) -> ListSessionsResult:
        raw = await self.request(
            "session/list", ListSessionsParams(cwd=cwd, cursor=cursor), timeout_s
        )
        result: ListSessionsResult = _decode("session/list", raw, decode_list_sessions_result)
        return result

    async def close_session(self, session_id: str, timeout_s: float | None = None) -> None:
        await self.request("session/close", SessionIdParams(session_id=session_id), timeout_s)
        self._config_options.pop(session_id, None)

    async def prompt(
        self,
        session_id: str,
        prompt: Raw | Sequence[ContentBlock | dict[str, Any]],
        *,
        extra: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> PromptResult:
        """One turn. ``prompt`` is a list of content blocks (Structs or dicts) or the raw JSON
        array; ``extra`` adds top-level params, only those in :data:`PROMPT_EXTRA_KEYS`
        (``ValueError`` for any other, so nothing replaces ``sessionId`` or ``prompt``). No
        timeout unless given."""
        unknown = sorted(set(extra or ()) - PROMPT_EXTRA_KEYS)
        if unknown:
            raise ValueError(f"session/prompt params not allowed in extra: {unknown}")
        params: dict[str, Any] = {
            **(extra or {}),
            "sessionId": session_id,
            "prompt": prompt if isinstance(prompt, Raw) else list(prompt),
        }
        raw = await self._chan().call("session/prompt", params, timeout_s)
        result: PromptResult = _decode("session/prompt", raw, decode_prompt_result)
        return result

    async def cancel(self, session_id: str) -> None:
        """``session/cancel`` (a notification): the agent ends the turn with ``cancelled``."""
        await self.notify("session/cancel", SessionIdParams(session_id=session_id))

    async def set_mode(self, session_id: str, mode_id: str, timeout_s: float | None = None) -> None:
        await self.request(
            "session/set_mode", SetModeParams(session_id=session_id, mode_id=mode_id), timeout_s
        )

    async def set_config_option(
        self,
        session_id: str,
        config_id: str,
        value: str | bool,
        timeout_s: float | None = None,
    ) -> list[SessionConfigOption]:
        """Returns the agent's complete new set of config options (also remembered)."""
        params = SetConfigOptionParams(
            session_id=session_id,
            config_id=config_id,
            value=value,
            type="boolean" if isinstance(value, bool) else None,
        )
        raw = await self.request("session/set_config_option", params, timeout_s)
        result: SetConfigOptionResult = _decode(
            "session/set_config_option",
            raw,
            lambda r: msgspec.json.decode(r, type=SetConfigOptionResult),
        )
        if result.config_options:
            self._config_options[session_id] = result.config_options
        return result.config_options

    async def set_model(
        self, session_id: str, model_id: str, timeout_s: float | None = None
    ) -> None:
        """Through the session's ``model`` config option when offered, else the older
        ``session/set_model``."""
        option = find_model_option(self._config_options.get(session_id))
        if option is not None:
            await self.set_config_option(session_id, option.id, model_id, timeout_s)
        else:
            await self.request(
                "session/set_model",
                SetModelParams(session_id=session_id, model_id=model_id),
                timeout_s,
            )

    def config_options(self, session_id: str) -> list[SessionConfigOption] | None:
        """The last config options the agent reported for ``session_id``."""
        return self._config_options.get(session_id)
