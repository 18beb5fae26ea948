"""``_qwen/file/*``: the workspace file functions the REST file routes run, over ``/acp``.

Each runs on the connection's workspace (trusted unless ``--untrusted-workspace`` names
it) in a worker thread under the file routes' thread budget (:func:`run`; not abandoned on
cancel). A :class:`~serve.workspaces.files.WorkspaceFsError` is answered with the file routes'
envelope as ``data`` (:func:`serve.errors.jsonrpc_file`). A write or an edit publishes
``workspace_file_changed`` on every live session of the workspace through the workspace
hub (the session actors stay their logs' only writers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from serve.acpfront.connections import Connection, Connections
from serve.acpfront.errors import params_error
from serve.acpfront.jsonrpc import RpcError
from serve.api import steering
from serve.errors import jsonrpc_file
from serve.threads import file_routes_limiter
from serve.workspaces.files import (
    EditResult,
    GlobResult,
    ListResult,
    ReadBytesResult,
    ReadTextResult,
    StatResult,
    Workspace,
    WorkspaceFsError,
    WriteResult,
    edit_text,
    glob,
    list_dir,
    read_bytes,
    read_text,
    stat,
    write_text,
)
from serve.workspaces.files.contents import (
    DEFAULT_BYTES_WINDOW,
    MAX_BYTES_WINDOW,
    MAX_READ_LINES,
    MAX_TEXT_READ_BYTES,
)
from serve.workspaces.files.listing import DEFAULT_GLOB_RESULTS, MAX_GLOB_RESULTS

__all__ = [
    "file_edit",
    "file_glob",
    "file_list",
    "file_read",
    "file_read_bytes",
    "file_stat",
    "file_write",
    "run",
]

# ---- params -------------------------------------------------------------------------------


def _workspace(front: Connections, conn: Connection) -> Workspace:
    untrusted = front.host.settings.untrusted_workspaces
    return front.host.workspaces.get(conn.workspace, trusted=conn.workspace not in untrusted)


def _text(params: dict[str, Any], name: str) -> str:
    value = params.get(name)
    if not isinstance(value, str) or not value:
        raise params_error(f"`{name}` must be a non-empty string")
    return value


def _optional_text(params: dict[str, Any], name: str) -> str | None:
    value = params.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise params_error(f"`{name}` must be a non-empty string")
    return value


def _number(params: dict[str, Any], name: str, low: int, high: int) -> int | None:
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise params_error(f"`{name}` must be an integer in [{low}, {high}]")
    return value


def _flag(params: dict[str, Any], name: str) -> bool:
    value = params.get(name, False)
    if not isinstance(value, bool):
        raise params_error(f"`{name}` must be a boolean")
    return value


async def run[T](fn: Callable[[], T]) -> T:
    """``fn`` in a worker thread under the file routes' thread budget (not trio's shared
    default of 40)."""
    try:
        return await trio.to_thread.run_sync(fn, limiter=file_routes_limiter())
    except WorkspaceFsError as exc:
        raise RpcError.of(jsonrpc_file(exc)) from None


# ---- reads --------------------------------------------------------------------------------


async def file_read(front: Connections, conn: Connection, params: dict[str, Any]) -> ReadTextResult:
    path = _text(params, "path")
    max_bytes = _number(params, "maxBytes", 1, MAX_TEXT_READ_BYTES)
    line = _number(params, "line", 1, 2**31 - 1)
    limit = _number(params, "limit", 1, MAX_READ_LINES)
    ws = _workspace(front, conn)
    return await run(lambda: read_text(ws, path, max_bytes=max_bytes, line=line, limit=limit))


async def file_read_bytes(
    front: Connections, conn: Connection, params: dict[str, Any]
) -> ReadBytesResult:
    path = _text(params, "path")
    offset = _number(params, "offset", 0, 2**63 - 1) or 0
    max_bytes = _number(params, "maxBytes", 1, MAX_BYTES_WINDOW) or DEFAULT_BYTES_WINDOW
    ws = _workspace(front, conn)
    return await run(lambda: read_bytes(ws, path, offset=offset, max_bytes=max_bytes))


async def file_stat(front: Connections, conn: Connection, params: dict[str, Any]) -> StatResult:
    path = _text(params, "path")
    ws = _workspace(front, conn)
    return await run(lambda: stat(ws, path))


async def file_list(front: Connections, conn: Connection, params: dict[str, Any]) -> ListResult:
    path = _optional_text(params, "path") or "."
    include_ignored = _flag(params, "includeIgnored")
    ws = _workspace(front, conn)
    return await run(lambda: list_dir(ws, path, include_ignored=include_ignored))


async def file_glob(front: Connections, conn: Connection, params: dict[str, Any]) -> GlobResult:
    pattern = _text(params, "pattern")
    cwd = _optional_text(params, "cwd")
    include_ignored = _flag(params, "includeIgnored")
    max_results = _number(params, "maxResults", 1, MAX_GLOB_RESULTS) or DEFAULT_GLOB_RESULTS
    ws = _workspace(front, conn)
    return await run(
        lambda: glob(ws, pattern, cwd=cwd, include_ignored=include_ignored, max_results=max_results)
    )


# ---- writes -------------------------------------------------------------------------------


async def _publish_change(
    front: Connections, conn: Connection, result: WriteResult | EditResult, action: str
) -> None:
    """``workspace_file_changed`` on every live session of the workspace, through the
    workspace hub (the session actors stay their logs' only writers)."""
    originator = next(
        (link.client_id for link in conn.sessions.values() if link.workspace == conn.workspace),
        None,
    )
    data = {
        "path": result.path,
        "action": action,
        "hash": result.hash,
        "size": result.size_bytes,
        "matchedIgnore": result.matched_ignore,
    }
    await front.host.hub.broadcast(conn.workspace, "workspace_file_changed", data, originator)


async def _check_steering(front: Connections, conn: Connection, ws: Workspace, path: str) -> None:
    """A ``user``'s change of a file that steers agents: ``403 need: admin``
    (serve/api/steering.py)."""
    host = front.host
    await steering.check_write(
        ws,
        path,
        conn.principal,
        multi_user=host.multi_user,
        memory_flag=host.settings.memory_file_name,
    )


async def file_write(front: Connections, conn: Connection, params: dict[str, Any]) -> WriteResult:
    path = _text(params, "path")
    content = params.get("content")
    if not isinstance(content, str):
        raise params_error("`content` must be a string")
    ws = _workspace(front, conn)
    await _check_steering(front, conn, ws, path)
    result = await run(
        lambda: write_text(
            ws,
            path,
            content,
            mode=params.get("mode"),  # type: ignore[arg-type]  # checked by write_text
            expected_hash=params.get("expectedHash"),
            encoding=params.get("encoding"),
            bom=params.get("bom"),
            line_ending=params.get("lineEnding"),
        )
    )
    await _publish_change(front, conn, result, "created" if result.created else "replaced")
    return result


async def file_edit(front: Connections, conn: Connection, params: dict[str, Any]) -> EditResult:
    path = _text(params, "path")
    old, new = params.get("oldText"), params.get("newText")
    if not isinstance(old, str) or not isinstance(new, str):
        raise params_error("`oldText` and `newText` must be strings")
    expected = _text(params, "expectedHash")
    ws = _workspace(front, conn)
    await _check_steering(front, conn, ws, path)
    result = await run(lambda: edit_text(ws, path, old, new, expected_hash=expected))
    await _publish_change(front, conn, result, "edited")
    return result
