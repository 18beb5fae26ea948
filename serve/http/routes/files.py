"""Workspace file routes: ``GET /file``, ``/file/bytes``, ``/stat``, ``/list``, ``/glob``,
``POST /file/write``, ``/file/edit`` (spec §4.5, seed "工作区文件路由").

Each handler parses its query or body, runs one :mod:`serve.workspaces.files` function in a
worker thread (``trio.to_thread.run_sync``; not abandoned on cancel, so a write that has
started finishes and its temp file is cleaned up) against the daemon's shared primary
:class:`~serve.workspaces.files.Workspace`, and encodes the result Struct as the body.

Errors: a :class:`~serve.workspaces.files.WorkspaceFsError` becomes the file-route envelope
``{"errorKind","error","hint"?,"status"}`` with the kind's status; a bug becomes
``internal_error`` (500, logged). Malformed JSON and an unregistered client id keep the
daemon-wide envelopes. Every response of this blueprint, errors included, carries
``Cache-Control: no-store`` and ``X-Content-Type-Options: nosniff``.

Writes and edits are strict routes (the security middleware gates ``POST /file/write`` and
``POST /file/edit``); they validate ``X-Qwen-Client-Id`` against the clients registered on
the live sessions, and on success publish ``workspace_file_changed`` ``{path, action,
hash, size, matchedIgnore}`` on every live session's log, stamped with the caller's id.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any, Final

import trio
from quart import Blueprint, Response, request

from serve.access.errors import AccessError
from serve.api import steering
from serve.errors import fs_error, rest
from serve.http import plural
from serve.http.access import principal
from serve.http.addressing import check_workspace_client, primary_workspace, publish_workspace_event
from serve.http.capabilities import Feature
from serve.http.context import daemon
from serve.http.errors import ApiError
from serve.http.routes.sessions import header_client_id
from serve.http.wire import json_body, json_response
from serve.threads import file_routes_limiter
from serve.workspaces.files import (
    EditResult,
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
from serve.workspaces.files.errors import make_error
from serve.workspaces.files.listing import DEFAULT_GLOB_RESULTS, MAX_GLOB_RESULTS

log = logging.getLogger(__name__)

blueprint = Blueprint("files", __name__)
PLURAL_ROUTES = plural.PluralRoutes(blueprint)

NO_STORE_HEADERS: Final = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
FILE_CHANGED_EVENT: Final = "workspace_file_changed"
_MAX_LINE: Final = 2**31 - 1
_MAX_OFFSET: Final = 2**63 - 1
_DECIMAL = re.compile(r"^[0-9]{1,19}$")

FEATURES: tuple[Feature, ...] = (
    Feature(
        "workspace_file_read",
        (("GET", "/file"), ("GET", "/list"), ("GET", "/glob"), ("GET", "/stat")),
    ),
    Feature("workspace_file_bytes", (("GET", "/file/bytes"),)),
    Feature("workspace_file_write", (("POST", "/file/write"), ("POST", "/file/edit"))),
)


@blueprint.after_request
async def _no_store(response: Response) -> Response:
    response.headers.update(NO_STORE_HEADERS)
    return response


def file_route[**P](
    handler: Callable[P, Awaitable[Response]],
) -> Callable[P, Awaitable[Response]]:
    """Map workspace errors (and bugs) to the file-route envelope."""

    @functools.wraps(handler)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> Response:
        try:
            return await handler(*args, **kwargs)
        except WorkspaceFsError as err:
            status, body, _ = rest(fs_error(err))
            return json_response(body, status)
        except (ApiError, AccessError):
            raise
        except Exception:
            log.exception("file route %s failed", request.path)
            internal = make_error("internal_error", "Internal server error")
            status, body, _ = rest(fs_error(internal))
            return json_response(body, status)

    return wrapper


# ---- query parsing --------------------------------------------------------------------------


def _required(name: str) -> str:
    value = request.args.get(name)
    if value is None or value == "":
        raise make_error("parse_error", f"{name} query parameter is required")
    return value


def _int_query(name: str, low: int, high: int, default: int | None = None) -> int | None:
    raw = request.args.get(name)
    if raw is None:
        return default
    if not _DECIMAL.match(raw) or not low <= int(raw) <= high:
        raise make_error("parse_error", f"{name} must be an integer in [{low}, {high}]")
    return int(raw)


def _flag_query(name: str) -> bool:
    raw = request.args.get(name)
    if raw is None or raw in ("0", "false"):
        return False
    if raw in ("", "1", "true"):
        return True
    raise make_error("parse_error", f'{name} must be "1", "true", "0" or "false"')


async def _run[T](fn: Callable[[], T]) -> T:
    return await trio.to_thread.run_sync(fn, limiter=file_routes_limiter())


# ---- reads ----------------------------------------------------------------------------------


@PLURAL_ROUTES.route("GET", "/file")
@file_route
async def get_file(workspace: str | None = None) -> Response:
    path = _required("path")
    if "cursor" in request.args:
        raise make_error(
            "parse_error",
            "cursor is not supported by this daemon",
            "use line/limit windows (workspace_file_read_cursor is not advertised)",
        )
    max_bytes = _int_query("maxBytes", 1, MAX_TEXT_READ_BYTES)
    line = _int_query("line", 1, _MAX_LINE)
    limit = _int_query("limit", 1, MAX_READ_LINES)
    ws = primary_workspace(daemon())
    result = await _run(
        functools.partial(read_text, ws, path, max_bytes=max_bytes, line=line, limit=limit)
    )
    return json_response(result)


@PLURAL_ROUTES.route("GET", "/file/bytes")
@file_route
async def get_file_bytes(workspace: str | None = None) -> Response:
    path = _required("path")
    offset = _int_query("offset", 0, _MAX_OFFSET, 0)
    max_bytes = _int_query("maxBytes", 1, MAX_BYTES_WINDOW, DEFAULT_BYTES_WINDOW)
    assert offset is not None and max_bytes is not None
    ws = primary_workspace(daemon())
    result = await _run(functools.partial(read_bytes, ws, path, offset=offset, max_bytes=max_bytes))
    return json_response(result)


@PLURAL_ROUTES.route("GET", "/stat")
@file_route
async def get_stat(workspace: str | None = None) -> Response:
    path = _required("path")
    ws = primary_workspace(daemon())
    return json_response(await _run(functools.partial(stat, ws, path)))


@PLURAL_ROUTES.route("GET", "/list")
@file_route
async def get_list(workspace: str | None = None) -> Response:
    path = request.args.get("path") or "."
    include_ignored = _flag_query("includeIgnored")
    ws = primary_workspace(daemon())
    result = await _run(functools.partial(list_dir, ws, path, include_ignored=include_ignored))
    return json_response(result)


@PLURAL_ROUTES.route("GET", "/glob")
@file_route
async def get_glob(workspace: str | None = None) -> Response:
    pattern = _required("pattern")
    cwd = request.args.get("cwd")
    include_ignored = _flag_query("includeIgnored")
    max_results = _int_query("maxResults", 1, MAX_GLOB_RESULTS, DEFAULT_GLOB_RESULTS)
    assert max_results is not None
    ws = primary_workspace(daemon())
    result = await _run(
        functools.partial(
            glob,
            ws,
            pattern,
            cwd=cwd,
            include_ignored=include_ignored,
            max_results=max_results,
        )
    )
    return json_response(result)


# ---- writes ---------------------------------------------------------------------------------


async def _publish_change(
    result: WriteResult | EditResult, action: str, client_id: str | None
) -> None:
    await publish_workspace_event(
        daemon(),
        FILE_CHANGED_EVENT,
        {
            "path": result.path,
            "action": action,
            "hash": result.hash,
            "size": result.size_bytes,
            "matchedIgnore": result.matched_ignore,
        },
        client_id,
    )


async def _caller() -> tuple[dict[str, Any], str | None]:
    """The body and the client id of a write or an edit; a ``user``'s change of a file
    that steers agents is refused ``403 need: admin`` (serve/api/steering.py)."""
    body = await json_body(allow_empty=False)
    client_id = check_workspace_client(daemon(), header_client_id())
    d = daemon()
    await steering.check_write(
        primary_workspace(d),
        body.get("path"),
        principal(),
        multi_user=d.multi_user,
        memory_flag=d.settings.memory_file_name,
    )
    return body, client_id


@PLURAL_ROUTES.route("POST", "/file/write")
@file_route
async def post_file_write(workspace: str | None = None) -> Response:
    body, client_id = await _caller()
    ws = primary_workspace(daemon())
    result = await _run(
        functools.partial(
            write_text,
            ws,
            body.get("path"),  # type: ignore[arg-type]  # checked by resolve
            body.get("content"),  # type: ignore[arg-type]  # checked by write_text
            mode=body.get("mode"),  # type: ignore[arg-type]
            expected_hash=body.get("expectedHash"),
            encoding=body.get("encoding"),
            bom=body.get("bom"),
            line_ending=body.get("lineEnding"),
        )
    )
    await _publish_change(result, "created" if result.created else "replaced", client_id)
    return json_response(result, 201 if result.created else 200)


@PLURAL_ROUTES.route("POST", "/file/edit")
@file_route
async def post_file_edit(workspace: str | None = None) -> Response:
    body, client_id = await _caller()
    expected = body.get("expectedHash")
    if expected is None:
        raise make_error(
            "parse_error",
            "expectedHash is required",
            "read the file first and pass its hash",
        )
    ws = primary_workspace(daemon())
    result = await _run(
        functools.partial(
            edit_text,
            ws,
            body.get("path"),  # type: ignore[arg-type]
            body.get("oldText"),  # type: ignore[arg-type]
            body.get("newText"),  # type: ignore[arg-type]
            expected_hash=expected,
        )
    )
    await _publish_change(result, "edited", client_id)
    return json_response(result)
