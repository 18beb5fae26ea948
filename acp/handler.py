"""The client-side handler interface: what the daemon does when the agent talks to it.

Theory of operation
-------------------
:class:`acp.client.AgentConnection` routes everything the agent sends us to one
:class:`ClientHandler`:

* ``on_session_update`` / ``on_notification`` are **synchronous** and called from the
  connection's reader task, in wire order. They must not block (put the bytes on a bounded
  channel with ``send_nowait``, append to a log...). ``update`` is the raw JSON of
  ``params.update``, forwarded untouched; ``kind`` is its ``sessionUpdate`` tag.
* Agent -> client requests are ``async`` and each runs in its own task, never in the reader.
  They answer by returning, or by raising :class:`~acp.errors.HandlerError` with a JSON-RPC
  code; any other exception becomes ``-32603``. If the agent sends ``$/cancel_request`` (or the
  connection dies) the task is cancelled.
* Requests with no dedicated method (vendor extensions such as ``craft/...``,
  ``elicitation/create``) go to ``ext_request``, which by default answers ``-32601``.

:class:`BaseClientHandler` is a complete default: permissions are answered ``cancelled``; fs
requests operate on the real filesystem (absolute paths only; blocking I/O in a worker thread);
terminals run real processes through a :class:`~acp.terminal.TerminalManager` that the
connection attaches (and shuts down) unless one was given.
"""

from __future__ import annotations

import logging
import os
from typing import Protocol, runtime_checkable

import msgspec
import trio
import trio.lowlevel

from acp.errors import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    RESOURCE_NOT_FOUND,
    HandlerError,
    method_not_found,
)
from acp.schema import (
    CancelledPermissionOutcome,
    CreateTerminalParams,
    PermissionOutcome,
    ReadTextFileParams,
    RequestPermissionParams,
    TerminalExitStatus,
    TerminalIdParams,
    TerminalOutputResult,
    WriteTextFileParams,
)
from acp.terminal import TerminalManager

log = logging.getLogger(__name__)

MAX_READ_BYTES = 64 * 2**20


@runtime_checkable
class ClientHandler(Protocol):
    def on_session_update(self, session_id: str, kind: str, update: msgspec.Raw) -> None: ...

    def on_notification(self, method: str, params: msgspec.Raw) -> None: ...

    async def request_permission(
        self, params: RequestPermissionParams, raw: msgspec.Raw
    ) -> PermissionOutcome: ...

    async def read_text_file(self, params: ReadTextFileParams) -> str: ...

    async def write_text_file(self, params: WriteTextFileParams) -> None: ...

    async def terminal_create(self, params: CreateTerminalParams) -> str: ...

    async def terminal_output(self, params: TerminalIdParams) -> TerminalOutputResult: ...

    async def terminal_wait_for_exit(self, params: TerminalIdParams) -> TerminalExitStatus: ...

    async def terminal_kill(self, params: TerminalIdParams) -> None: ...

    async def terminal_release(self, params: TerminalIdParams) -> None: ...

    async def ext_request(self, method: str, params: msgspec.Raw) -> object: ...


def _require_absolute(path: str) -> None:
    if not os.path.isabs(path):
        raise HandlerError(INVALID_PARAMS, f"path must be absolute: {path!r}", {"path": path})


def read_text(path: str, line: int | None, limit: int | None) -> str:
    """Read ``path`` (UTF-8, undecodable bytes replaced), from 1-based ``line``, ``limit`` lines."""
    try:
        size = os.path.getsize(path)
        if size > MAX_READ_BYTES:
            raise HandlerError(
                INTERNAL_ERROR, f"file too large to read: {size} bytes", {"path": path}
            )
        with open(path, encoding="utf-8", errors="replace", newline="") as f:
            if line is None and limit is None:
                return f.read()
            start = max(1, line or 1) - 1
            out: list[str] = []
            for i, text in enumerate(f):
                if i < start:
                    continue
                if limit is not None and len(out) >= limit:
                    break
                out.append(text)
            return "".join(out)
    except FileNotFoundError:
        raise HandlerError(RESOURCE_NOT_FOUND, "Resource not found", {"path": path})
    except IsADirectoryError:
        raise HandlerError(INVALID_PARAMS, f"not a file: {path!r}", {"path": path})
    except PermissionError as exc:
        raise HandlerError(INTERNAL_ERROR, f"cannot read {path!r}: {exc.strerror}", {"path": path})


def write_text(path: str, content: str) -> None:
    """Write ``content`` to ``path``, creating the file (and its parent folders) if missing."""
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(content)
    except IsADirectoryError:
        raise HandlerError(INVALID_PARAMS, f"not a file: {path!r}", {"path": path})
    except OSError as exc:
        raise HandlerError(
            INTERNAL_ERROR, f"cannot write {path!r}: {exc.strerror or exc}", {"path": path}
        )


#: Threads for the default ``fs/*`` handlers, apart from trio's default limiter.
FS_THREADS = 8
_fs_limiters: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("acp_fs_threads")


def _fs_limiter() -> trio.CapacityLimiter:
    try:
        return _fs_limiters.get()
    except LookupError:
        limiter = trio.CapacityLimiter(FS_THREADS)
        _fs_limiters.set(limiter)
        return limiter


class BaseClientHandler:
    """Default behaviour for every agent -> client interaction (see the module docstring)."""

    def __init__(self, *, terminals: TerminalManager | None = None) -> None:
        self.terminals = terminals

    # notifications (sync, from the reader)

    def on_session_update(self, session_id: str, kind: str, update: msgspec.Raw) -> None:
        pass

    def on_notification(self, method: str, params: msgspec.Raw) -> None:
        log.debug("ignoring agent notification %s", method)

    # permission

    async def request_permission(
        self, params: RequestPermissionParams, raw: msgspec.Raw
    ) -> PermissionOutcome:
        return CancelledPermissionOutcome()

    # fs

    async def read_text_file(self, params: ReadTextFileParams) -> str:
        _require_absolute(params.path)
        return await trio.to_thread.run_sync(
            read_text, params.path, params.line, params.limit, limiter=_fs_limiter()
        )

    async def write_text_file(self, params: WriteTextFileParams) -> None:
        _require_absolute(params.path)
        await trio.to_thread.run_sync(
            write_text, params.path, params.content, limiter=_fs_limiter()
        )

    # terminals

    def _terms(self) -> TerminalManager:
        if self.terminals is None:
            raise HandlerError(INTERNAL_ERROR, "terminals are not available on this connection")
        return self.terminals

    async def terminal_create(self, params: CreateTerminalParams) -> str:
        return await self._terms().create(params)

    async def terminal_output(self, params: TerminalIdParams) -> TerminalOutputResult:
        return self._terms().output(params)

    async def terminal_wait_for_exit(self, params: TerminalIdParams) -> TerminalExitStatus:
        return await self._terms().wait_for_exit(params)

    async def terminal_kill(self, params: TerminalIdParams) -> None:
        await self._terms().kill(params)

    async def terminal_release(self, params: TerminalIdParams) -> None:
        await self._terms().release(params)

    # anything else

    async def ext_request(self, method: str, params: msgspec.Raw) -> object:
        raise method_not_found(method)
