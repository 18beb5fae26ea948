"""The workspace settings file, ``<workspace>/.qwen/settings.json``: read, update, toggle a tool.

Theory of operation
-------------------
Synchronous (run in a worker thread). All access goes through the shared
:class:`~serve.workspaces.files.Workspace`, so a settings file (or ``.qwen`` directory) that is
a symlink out of the workspace is refused like any other escape, and writes are the
workspace module's atomic temp-file + rename with a hash check.

:func:`read_settings` returns the decoded object and the file's hash (``None`` when the
file does not exist, which reads as ``{}``). The file is strict JSON; anything else is a
:class:`SettingsFileError` (the file is never rewritten then, so a hand-edited file with
comments is not destroyed by an update).

:func:`update_settings` is the one read-modify-write of the file, used by the tool toggle
(:func:`set_tool_enabled`, ``tools.disabled``) and the dotted-key edits
(:func:`serve.workspaces.state.settings_edit.update_setting`). Updates from this process
are serialised by one per-workspace ``threading.Lock`` (one table, keyed by the workspace
root, so at most one entry per configured workspace; one thread waits while another
updates). Against writers outside the daemon (an editor) it is optimistic: read with hash,
change the document, write with ``expectedHash`` (or ``create`` when absent); a concurrent
change makes the write fail with ``hash_mismatch``/``file_already_exists`` (or
``path_not_found``: the file was removed meanwhile) and the update is redone from a fresh
read, at most :data:`MAX_UPDATE_ATTEMPTS` times. Other keys, their order, and the file's
encoding/BOM/line endings are preserved; the JSON is re-indented with two spaces.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, Final

import msgspec

from serve.workspaces.files import Workspace, WorkspaceFsError, read_text, write_text

__all__ = [
    "MAX_UPDATE_ATTEMPTS",
    "SETTINGS_PATH",
    "SettingsFileError",
    "disabled_tools",
    "read_settings",
    "set_tool_enabled",
    "update_settings",
]

SETTINGS_PATH: Final = ".qwen/settings.json"
#: Read-modify-write rounds before giving up on a settings file that keeps changing.
MAX_UPDATE_ATTEMPTS: Final = 5

#: Write conflicts that redo the update from a fresh read (another writer got there first).
_RACES: Final = ("hash_mismatch", "file_already_exists", "path_not_found")

#: The one lock table of the settings file: one entry per workspace root.
_update_locks: dict[str, threading.Lock] = {}
_update_locks_guard = threading.Lock()


def _update_lock(ws: Workspace) -> threading.Lock:
    with _update_locks_guard:
        return _update_locks.setdefault(ws.root, threading.Lock())


class SettingsFileError(Exception):
    """The settings file cannot be used: ``code`` is the wire code (its status and body
    are :func:`serve.errors.settings_file_error`'s)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


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


def encode_settings(doc: Mapping[str, Any]) -> str:
    """The file's text for ``doc``: two-space indented JSON and a final newline."""
    return msgspec.json.format(msgspec.json.encode(doc), indent=2).decode() + "\n"


def update_settings(
    ws: Workspace, change: Callable[[dict[str, Any]], dict[str, Any] | None]
) -> bool:
    """Read-modify-write the settings file; returns whether it was written.

    ``change`` gets the current document (``{}`` when absent) and returns the new one, or
    ``None`` to leave the file alone; it may raise to abort, and is called again on a
    conflict. Raises :class:`SettingsFileError` for an unusable file or one that kept
    changing, and :class:`~serve.workspaces.files.WorkspaceFsError` for a write refused by the
    workspace boundary.
    """
    with _update_lock(ws):
        for _ in range(MAX_UPDATE_ATTEMPTS):
            doc, current_hash = read_settings(ws)
            updated = change(doc)
            if updated is None:
                return False
            content = encode_settings(updated)
            try:
                if current_hash is None:
                    write_text(ws, SETTINGS_PATH, content, mode="create", create_parents=True)
                else:
                    write_text(
                        ws, SETTINGS_PATH, content, mode="replace", expected_hash=current_hash
                    )
            except WorkspaceFsError as err:
                if err.kind in _RACES:
                    continue
                raise
            return True
    raise SettingsFileError(
        "settings_busy", f"{SETTINGS_PATH} kept changing during the update; retry"
    )


def set_tool_enabled(ws: Workspace, name: str, enabled: bool) -> bool:
    """Add ``name`` to (``enabled=False``) or remove it from ``tools.disabled``.

    Returns whether the file changed (errors as :func:`update_settings`).
    """

    def change(data: dict[str, Any]) -> dict[str, Any] | None:
        disabled = _disabled_list(data)
        if enabled:
            updated = [tool for tool in disabled if tool != name]
        else:
            updated = disabled if name in disabled else [*disabled, name]
        if updated == disabled:
            return None
        tools = data.get("tools")
        data["tools"] = {**(tools if isinstance(tools, dict) else {}), "disabled": updated}
        return data

    return update_settings(ws, change)
