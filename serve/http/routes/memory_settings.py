"""Workspace memory, workspace settings and reload (spec §4.6; qwen serve 0.24.4 shapes).

Routes (the primary workspace; ``POST`` routes are strict: the security middleware
refuses them on a daemon without a bearer token; each checks a present
``X-Qwen-Client-Id`` against the live sessions' clients and stamps its event with it):

* ``GET /workspace/memory`` (tag ``workspace_memory``): the memory file (``QWEN.md``, or
  ``--memory-file-name``, or ``context.fileName`` from the settings) with its text; never
  404: ``exists: false`` when there is none. Also the reference's status fields
  (``files``, ``totalBytes``, ``fileCount``, ``ruleCount``).
* ``POST /workspace/memory`` ``{content, mode?: "append"|"replace", scope?: "workspace"}``
  → ``{ok, filePath, bytesWritten, mode, changed}``; event ``memory_changed {scope,
  filePath, mode, bytesWritten}`` when the file changed (:mod:`serve.workspaces.state.
  memory`).
* ``GET /workspace/settings`` (tag ``workspace_settings``): the known settings described
  with their values (``settings[]``, the reference's shape) and the whole document
  (``content``), secrets redacted.
* ``POST /workspace/settings`` ``{key, value}`` or ``{key, remove: true}`` (``scope``
  optional, ``"workspace"`` only) → ``{key, scope, value, changed, requiresRestart}``;
  persisted to ``<workspace>/.qwen/settings.json`` without losing other keys; known keys
  type-checked (``400 invalid_setting`` naming the key); event ``settings_changed {key,
  value?, scope: "workspace", mutation}`` when the file changed
  (:mod:`serve.workspaces.state.settings_edit`).
* ``POST /workspace/reload`` (tag ``workspace_reload``): re-read the settings file and the
  daemon config's grants and approval policy without a restart; event
  ``settings_reloaded {env, changedKeys, childReloaded: false, sessionsRefreshed,
  restartRequired, grantsReloaded}`` (:mod:`serve.workspaces.state.reload`). Nothing is
  applied when the settings file or the config file cannot be decoded.

File work runs in worker threads through the shared workspace boundary.
"""

from __future__ import annotations

import functools
from typing import Any, Final

from quart import Blueprint, Response

from serve import threads
from serve.errors import settings_file_error, workspace_fs_error
from serve.http.addressing import check_workspace_client, primary_workspace, publish_workspace_event
from serve.http.capabilities import Feature
from serve.http.context import daemon
from serve.http.errors import ApiError, bad_request, rest_error
from serve.http.routes.sessions import header_client_id
from serve.http.wire import encode, json_body, json_response
from serve.settings import SettingsError
from serve.status.init import memory_file_name
from serve.threads import file_routes_limiter
from serve.workspaces.files import Workspace, WorkspaceFsError
from serve.workspaces.state import reload as reload_state
from serve.workspaces.state.memory_file import (
    MAX_CONTENT_BYTES,
    MAX_MEMORY_FILE_BYTES,
    MemoryBusy,
    MemoryFile,
    MemoryFileTooLarge,
    MemoryWrite,
    Mode,
    read_memory,
    write_memory,
)
from serve.workspaces.state.settings_edit import (
    KNOWN_SETTINGS,
    MAX_VALUE_BYTES,
    SettingError,
    changed_keys,
    get_path,
    is_missing,
    parse_key,
    redact,
    update_setting,
)
from serve.workspaces.state.settings_file import SETTINGS_PATH, SettingsFileError, read_settings

blueprint = Blueprint("workspace_memory_settings", __name__)

NO_STORE: Final = {"Cache-Control": "no-store"}

FEATURES: tuple[Feature, ...] = (
    Feature("workspace_memory", (("GET", "/workspace/memory"), ("POST", "/workspace/memory"))),
    Feature(
        "workspace_settings", (("GET", "/workspace/settings"), ("POST", "/workspace/settings"))
    ),
    Feature("workspace_reload", (("POST", "/workspace/reload"),)),
)


def _fs_failure(err: WorkspaceFsError) -> ApiError:
    return rest_error(workspace_fs_error(err))


def _workspace() -> Workspace:
    try:
        return primary_workspace(daemon())
    except WorkspaceFsError as err:
        raise _fs_failure(err) from None


def _scope(body: dict[str, Any]) -> str:
    scope = body.get("scope", "workspace")
    if scope != "workspace":
        raise bad_request(
            '`scope` must be "workspace" (user and global scopes are not served here)',
            "invalid_scope",
        )
    return "workspace"


# ---- memory -------------------------------------------------------------------------------


def _settings_or_empty(ws: Workspace) -> dict[str, Any]:
    try:
        doc, _ = read_settings(ws)
    except (SettingsFileError, WorkspaceFsError):
        return {}
    return doc


def _read_memory_file(ws: Workspace, flag: str) -> MemoryFile:
    return read_memory(ws, memory_file_name(flag, _settings_or_empty(ws)))


def _write_memory_file(ws: Workspace, flag: str, content: str, mode: Mode) -> MemoryWrite:
    return write_memory(ws, memory_file_name(flag, _settings_or_empty(ws)), content, mode)


def _too_large(err: MemoryFileTooLarge, **extra: object) -> ApiError:
    return ApiError(
        413,
        {
            "error": "The memory file exceeds the size the daemon reads or appends to; "
            "trim it or POST with mode=replace",
            "code": "memory_file_too_large",
            "bytes": err.size,
            "limit": MAX_MEMORY_FILE_BYTES,
            **extra,
        },
    )


@blueprint.get("/workspace/memory")
async def get_memory() -> Response:
    d = daemon()
    ws = _workspace()
    try:
        found = await threads.run_sync(
            file_routes_limiter(), _read_memory_file, ws, d.settings.memory_file_name
        )
    except MemoryFileTooLarge as err:
        raise _too_large(err) from None
    except MemoryBusy as err:
        raise ApiError(409, {"error": str(err), "code": "memory_busy"}) from None
    except WorkspaceFsError as err:
        raise _fs_failure(err) from None
    files = (
        [
            {
                "kind": "memory_file",
                "path": found.path,
                "scope": "workspace",
                "bytes": found.size_bytes,
            }
        ]
        if found.exists
        else []
    )
    body = {
        "v": 1,
        "workspaceCwd": d.settings.primary_workspace,
        "initialized": found.exists,
        "fileName": found.name,
        "filePath": found.path,
        "exists": found.exists,
        "content": found.content,
        "sizeBytes": found.size_bytes,
        "hash": found.hash,
        "encoding": found.encoding,
        "truncated": found.truncated,
        "files": files,
        "totalBytes": found.size_bytes,
        "fileCount": len(files),
        "ruleCount": 0,
    }
    return json_response(body, headers=NO_STORE)


@blueprint.post("/workspace/memory")
async def post_memory() -> Response:
    body = await json_body(allow_empty=False)
    scope = _scope(body)
    mode = body.get("mode", "append")
    if mode not in ("append", "replace"):
        raise bad_request('`mode` must be "append", "replace", or omitted', "invalid_mode")
    content = body.get("content")
    if not isinstance(content, str):
        raise bad_request("`content` must be a string", "invalid_content")
    if len(content.encode("utf-8", "surrogatepass")) > MAX_CONTENT_BYTES:
        raise bad_request(
            f"`content` exceeds the {MAX_CONTENT_BYTES}-byte limit", "content_too_large"
        )
    d = daemon()
    client_id = check_workspace_client(d, header_client_id())
    ws = _workspace()
    try:
        written = await threads.run_sync(
            file_routes_limiter(),
            _write_memory_file,
            ws,
            d.settings.memory_file_name,
            content,
            mode,
        )
    except MemoryFileTooLarge as err:
        raise _too_large(err, scope=scope, mode=mode) from None
    except MemoryBusy as err:
        raise ApiError(409, {"error": str(err), "code": "memory_busy", "retryable": True}) from None
    except WorkspaceFsError as err:
        raise _fs_failure(err) from None
    if written.changed:
        await publish_workspace_event(
            d,
            "memory_changed",
            {
                "scope": scope,
                "filePath": written.path,
                "mode": mode,
                "bytesWritten": written.bytes_written,
            },
            client_id,
        )
    return json_response(
        {
            "ok": True,
            "filePath": written.path,
            "bytesWritten": written.bytes_written,
            "mode": mode,
            "changed": written.changed,
        }
    )


# ---- settings -----------------------------------------------------------------------------


@blueprint.get("/workspace/settings")
async def get_settings() -> Response:
    d = daemon()
    ws = _workspace()
    warnings: list[dict[str, Any]] = []
    doc: dict[str, Any] = {}
    digest: str | None = None
    try:
        doc, digest = await threads.run_sync(file_routes_limiter(), read_settings, ws)
    except SettingsFileError as err:
        warnings.append({"type": "corrupted", "code": err.code, "error": err.message})
    except WorkspaceFsError as err:
        raise _fs_failure(err) from None
    settings = []
    for known in KNOWN_SETTINGS:
        stored = get_path(doc, known.path)
        values: dict[str, Any] = {}
        if is_missing(stored):
            values["effective"] = known.default
        else:
            values["effective"] = values["workspace"] = redact(stored, known.path)
        settings.append({**known.describe(), "values": values})
    body: dict[str, Any] = {
        "v": 1,
        "workspaceCwd": d.settings.primary_workspace,
        "path": SETTINGS_PATH,
        "exists": digest is not None,
        "hash": digest,
        "settings": settings,
        "content": redact(doc) if not warnings else None,
    }
    if warnings:
        body["warnings"] = warnings
    return json_response(body, headers=NO_STORE)


@blueprint.post("/workspace/settings")
async def post_settings() -> Response:
    body = await json_body(allow_empty=False)
    scope = _scope(body)
    key = body.get("key")
    try:
        path = parse_key(key)
    except SettingError as err:
        raise ApiError(400, err.to_body()) from None
    remove = body.get("remove", False)
    if not isinstance(remove, bool):
        raise ApiError(400, SettingError(str(key), "`remove` must be a boolean").to_body())
    value = body.get("value")
    if not remove:
        if value is None:
            raise ApiError(
                400,
                SettingError(
                    str(key), 'value is required (send "remove": true to delete the key)'
                ).to_body(),
            )
        if len(encode(value)) > MAX_VALUE_BYTES:
            raise ApiError(
                400,
                SettingError(str(key), f"value is larger than {MAX_VALUE_BYTES} bytes").to_body(),
            )
    d = daemon()
    client_id = check_workspace_client(d, header_client_id())
    ws = _workspace()
    try:
        result = await threads.run_sync(
            file_routes_limiter(), functools.partial(update_setting, ws, path, value, remove=remove)
        )
    except SettingError as err:
        raise ApiError(400, err.to_body()) from None
    except SettingsFileError as err:
        raise rest_error(settings_file_error(err)) from None
    except WorkspaceFsError as err:
        raise _fs_failure(err) from None
    dotted_key = ".".join(path)
    event: dict[str, Any] = {"key": dotted_key, "scope": scope}
    if not remove:
        event["value"] = result.value
    event["mutation"] = "remove" if remove else "set"
    if result.changed:
        await publish_workspace_event(d, "settings_changed", event, client_id)
    return json_response(
        {
            "key": dotted_key,
            "scope": scope,
            "value": result.value,
            "mutation": event["mutation"],
            "changed": result.changed,
            "requiresRestart": False,
        }
    )


# ---- reload -------------------------------------------------------------------------------


@blueprint.post("/workspace/reload")
async def post_reload() -> Response:
    await json_body()
    d = daemon()
    client_id = check_workspace_client(d, header_client_id())
    root = d.settings.primary_workspace
    try:
        doc = await threads.run_sync(
            file_routes_limiter(), reload_state.read_settings_strict, d.workspaces, root
        )
    except SettingsFileError as err:
        raise rest_error(settings_file_error(err)) from None
    except WorkspaceFsError as err:
        raise _fs_failure(err) from None
    try:
        new_config = await reload_state.reread_config(d.settings)
    except SettingsError as err:
        raise ApiError(
            400, {"error": str(err), "code": "invalid_config", "configFile": True}
        ) from None
    state = d.workspace_state
    settings_changed = changed_keys(state.baseline(root), doc)
    state.loaded(root, doc)
    plan = reload_state.plan_config_reload(d.config, new_config)
    grants_reloaded = reload_state.apply_config(d.config_cell, plan.config)
    out: dict[str, Any] = {
        "env": {"updatedKeys": [], "removedKeys": []},
        "changedKeys": [*settings_changed, *plan.changed],
        "childReloaded": False,
        "sessionsRefreshed": 0,
        "grantsReloaded": grants_reloaded,
        "restartRequired": list(plan.restart_required),
    }
    await publish_workspace_event(d, "settings_reloaded", out, client_id)
    return json_response(out)
