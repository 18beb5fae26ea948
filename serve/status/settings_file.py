"""The workspace settings file, ``<workspace>/.qwen/settings.json``: read, toggle a tool.

Theory of operation
-------------------
Synchronous (run in a worker thread). All access goes through the shared
:class:`~serve.workspace.Workspace`, so a settings file (or ``.qwen`` directory) that is
a symlink out of the workspace is refused like any other escape, and writes are the
workspace module's atomic temp-file + rename with a hash check.

:func:`read_settings` returns the decoded object and the file's hash (``None`` when the
file does not exist, which reads as ``{}``). The file is strict JSON; anything else is a
:class:`SettingsFileError` (the file is never rewritten then, so a hand-edited file with
comments is not destroyed by a tool toggle).

:func:`set_tool_enabled` is a read-modify-write of ``tools.disabled``. Updates from this
process are serialised by a per-workspace ``threading.Lock`` (one thread waits while
another updates; bounded by the number of concurrent requests). Against writers outside
the daemon (an editor) it is optimistic: read with hash, change the list, write with
``expectedHash`` (or ``create`` when absent); a concurrent change makes the write fail
with ``hash_mismatch``/``file_already_exists`` and the update is redone from a fresh
read, at most :data:`MAX_UPDATE_ATTEMPTS` times. Other keys, their order, and the file's
encoding/BOM/line endings are preserved; the JSON is re-indented with two spaces.
"""

from __future__ import annotations

import threading
from typing import Any, Final

import msgspec

from serve.workspace import Workspace, WorkspaceFsError, read_text, write_text

__all__ = [
    "MAX_UPDATE_ATTEMPTS",
    "SETTINGS_PATH",
    "SettingsFileError",
    "read_settings",
    "set_tool_enabled",
]

SETTINGS_PATH: Final = ".qwen/settings.json"
#: Read-modify-write rounds before giving up on a settings file that keeps changing.
MAX_UPDATE_ATTEMPTS: Final = 5

_update_locks: dict[str, threading.Lock] = {}
_update_locks_guard = threading.Lock()


def _update_lock(ws: Workspace) -> threading.Lock:
    with _update_locks_guard:
        return _update_locks.setdefault(ws.root, threading.Lock())


class SettingsFileError(Exception):
    """The settings file cannot be used: ``code`` is the wire code, ``status`` the HTTP one."""

    def __init__(self, code: str, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status

    def to_body(self) -> dict[str, Any]:
        return {"error": self.message, "code": self.code, "path": SETTINGS_PATH}


def read_settings(ws: Workspace) -> tuple[dict[str, Any], str | None]:
    """``(settings object, hash)``; ``({}, None)`` when the file does not exist."""
    try:
        result = read_text(ws, SETTINGS_PATH)
    except WorkspaceFsError as err:
        if err.kind == "path_not_found":
            return {}, None
        raise SettingsFileError(
            "settings_unreadable", f"{SETTINGS_PATH} cannot be read: {err.message}"
        ) from None
    try:
        data = msgspec.json.decode(result.content)
    except msgspec.DecodeError as err:
        raise SettingsFileError(
            "settings_parse_error", f"{SETTINGS_PATH} is not valid JSON: {err}"
        ) from None
    if not isinstance(data, dict):
        raise SettingsFileError("settings_parse_error", f"{SETTINGS_PATH} is not a JSON object")
    return data, result.hash


def _disabled_list(data: dict[str, Any]) -> list[str]:
    tools = data.get("tools", {})
    if not isinstance(tools, dict):
        raise SettingsFileError("settings_parse_error", "tools in the settings is not an object")
    disabled = tools.get("disabled", [])
    if not isinstance(disabled, list) or not all(isinstance(t, str) for t in disabled):
        raise SettingsFileError(
            "settings_parse_error", "tools.disabled in the settings is not a list of strings"
        )
    return list(disabled)


def disabled_tools(data: dict[str, Any]) -> list[str]:
    """``tools.disabled`` of a settings object (``[]`` when absent)."""
    return _disabled_list(data)


def set_tool_enabled(ws: Workspace, name: str, enabled: bool) -> bool:
    """Add ``name`` to (``enabled=False``) or remove it from ``tools.disabled``.

    Returns whether the file changed. Raises :class:`SettingsFileError` for an unusable
    file or a file that kept changing, and :class:`WorkspaceFsError` for a write refused
    by the workspace boundary.
    """
    with _update_lock(ws):
        return _set_tool_enabled(ws, name, enabled)


def _set_tool_enabled(ws: Workspace, name: str, enabled: bool) -> bool:
    for _ in range(MAX_UPDATE_ATTEMPTS):
        data, current_hash = read_settings(ws)
        disabled = _disabled_list(data)
        if enabled:
            updated = [tool for tool in disabled if tool != name]
        else:
            updated = disabled if name in disabled else [*disabled, name]
        if updated == disabled:
            return False
        tools = data.get("tools")
        data["tools"] = {**(tools if isinstance(tools, dict) else {}), "disabled": updated}
        content = msgspec.json.format(msgspec.json.encode(data), indent=2).decode() + "\n"
        try:
            if current_hash is None:
                write_text(ws, SETTINGS_PATH, content, mode="create", create_parents=True)
            else:
                write_text(ws, SETTINGS_PATH, content, mode="replace", expected_hash=current_hash)
        except WorkspaceFsError as err:
            if err.kind in ("hash_mismatch", "file_already_exists"):
                continue
            raise
        return True
    raise SettingsFileError(
        "settings_busy", f"{SETTINGS_PATH} kept changing during the update; retry", 409
    )
