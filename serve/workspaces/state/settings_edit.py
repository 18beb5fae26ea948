"""Dotted-key edits of ``<workspace>/.qwen/settings.json``, validated, secrets redacted.

Theory of operation
-------------------
A client names a setting by a dotted key (``tools.disabled``, ``mcpServers.docs``,
``ui.theme``): 1 to :data:`MAX_KEY_DEPTH` segments of ``[A-Za-z0-9_$@:-]``, at most
:data:`MAX_KEY_CHARS` characters, never ``__proto__``/``constructor``/``prototype``
(:func:`parse_key`). An update sets the value at that path (creating missing objects on
the way) or removes it; the rest of the document, including keys we do not know, keeps
its content and order (:func:`apply_update`, pure).

Known keys are type-checked (:data:`KNOWN_SETTINGS`): ``tools.disabled`` (array of
strings), ``context.fileName`` (a file name, or an array of them), ``mcpServers`` (an
object of server objects, each naming a ``command``, ``httpUrl`` or ``url`` with
well-typed ``args``/``env``/``headers``/...), ``tools.approvalMode`` (one of
:data:`APPROVAL_MODES`). A known key is checked when the update touches it: the update's
path is a prefix of the known key's path or the other way round (setting ``tools`` checks
``tools.disabled`` and ``tools.approvalMode``; setting ``mcpServers.docs.args`` checks
``mcpServers``). Unknown keys take any JSON value. Failures are
:class:`SettingError` naming the offending key (400 ``invalid_setting``).

Secrets: values that look secret are never shown (:func:`redact`): strings under keys
named like ``apiKey``/``token``/``secret``/``password``/``authorization``..., and every
``env`` and ``headers`` value of an MCP server, become :data:`REDACTED`. A written value
may carry :data:`REDACTED` where a secret was shown; :func:`restore_redacted` puts the
stored secret back (and refuses a placeholder with nothing stored behind it), so a client
can read, edit and write back an object without learning or losing its secrets.

:func:`changed_keys` lists the dotted keys (to depth 2) whose values differ between two
documents, for ``settings_reloaded``.

I/O: :func:`update_setting` is blocking (run it in a worker thread): the change above
applied through :func:`serve.workspaces.state.settings_file.update_settings`, the file's one
read-modify-write (its lock, its conflict retries). A file that is not strict JSON is never
rewritten (:class:`~serve.workspaces.state.settings_file.SettingsFileError`).
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal

import msgspec

from serve.workspaces.files import Workspace
from serve.workspaces.state.settings_file import update_settings

__all__ = [
    "APPROVAL_MODES",
    "KNOWN_SETTINGS",
    "MAX_KEY_CHARS",
    "MAX_KEY_DEPTH",
    "MAX_VALUE_BYTES",
    "REDACTED",
    "KnownSetting",
    "SettingError",
    "SettingUpdate",
    "apply_update",
    "changed_keys",
    "dotted",
    "get_path",
    "parse_key",
    "redact",
    "restore_redacted",
    "touched_known",
    "update_setting",
    "validate_known",
]

APPROVAL_MODES: Final = ("plan", "default", "auto-edit", "auto", "yolo")
REDACTED: Final = "[redacted]"
MAX_KEY_CHARS: Final = 256
MAX_KEY_DEPTH: Final = 8
#: Largest encoded value one update may write (bytes of JSON).
MAX_VALUE_BYTES: Final = 256 * 1024
MAX_MCP_SERVERS: Final = 256
MAX_LIST_ITEMS: Final = 4096
MAX_NAME_CHARS: Final = 256

_SEGMENT: Final = re.compile(r"^[A-Za-z0-9_$@:-]{1,128}$")
_HOSTILE: Final = frozenset({"__proto__", "constructor", "prototype"})
_SECRET_NAME: Final = re.compile(
    r"(?i)(api[-_]?key|secret|password|passwd|token|authorization|credentials?|cookie|"
    r"private[-_]?key)$"
)
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")

_MISSING: Final = object()


class SettingError(Exception):
    """An update the daemon refuses; ``key`` names the offending setting."""

    def __init__(self, key: str, message: str, code: str = "invalid_setting") -> None:
        super().__init__(message)
        self.key = key
        self.message = message
        self.code = code

    def to_body(self) -> dict[str, Any]:
        return {"error": self.message, "code": self.code, "key": self.key}


def dotted(path: tuple[str, ...]) -> str:
    return ".".join(path)


def parse_key(key: object) -> tuple[str, ...]:
    """Validate a dotted key; returns its segments."""
    if not isinstance(key, str) or not key:
        raise SettingError(str(key) if key is not None else "", "`key` must be a non-empty string")
    if len(key) > MAX_KEY_CHARS:
        raise SettingError(key[:64] + "…", f"`key` is longer than {MAX_KEY_CHARS} characters")
    segments = tuple(key.split("."))
    if len(segments) > MAX_KEY_DEPTH:
        raise SettingError(key, f"`key` has more than {MAX_KEY_DEPTH} segments")
    for segment in segments:
        if segment in _HOSTILE or not _SEGMENT.match(segment):
            raise SettingError(
                key, f"`key` segment {segment!r} is not allowed (use letters, digits, _$@:-)"
            )
    return segments


def get_path(doc: object, path: tuple[str, ...]) -> object:
    """The value at ``path`` or the module's missing marker (see :func:`is_missing`)."""
    node = doc
    for segment in path:
        if not isinstance(node, dict) or segment not in node:
            return _MISSING
        node = node[segment]
    return node


def is_missing(value: object) -> bool:
    return value is _MISSING


# ---- known keys ---------------------------------------------------------------------------

Check = Callable[[tuple[str, ...], object], tuple[str, str] | None]


def _string_list(value: object, *, max_items: int = MAX_LIST_ITEMS) -> bool:
    return (
        isinstance(value, list)
        and len(value) <= max_items
        and all(isinstance(v, str) and v and len(v) <= MAX_NAME_CHARS for v in value)
    )


def _check_disabled(path: tuple[str, ...], value: object) -> tuple[str, str] | None:
    if not _string_list(value):
        return dotted(path), (
            f"must be an array of non-empty tool names (at most {MAX_NAME_CHARS} characters "
            f"each, {MAX_LIST_ITEMS} names)"
        )
    return None


def _file_name_ok(name: object) -> bool:
    return (
        isinstance(name, str)
        and 0 < len(name) <= 255
        and "/" not in name
        and "\\" not in name
        and name not in (".", "..")
        and not _CONTROL.search(name)
    )


def _check_file_name(path: tuple[str, ...], value: object) -> tuple[str, str] | None:
    names = value if isinstance(value, list) else [value]
    if not names or len(names) > 32 or not all(_file_name_ok(n) for n in names):
        return dotted(path), (
            "must be a file name (no path separators) or a non-empty array of them"
        )
    return None


def _check_approval_mode(path: tuple[str, ...], value: object) -> tuple[str, str] | None:
    if value not in APPROVAL_MODES:
        return dotted(path), "must be one of: " + ", ".join(APPROVAL_MODES)
    return None


def _str_map(value: object) -> bool:
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


def _http_url(value: object) -> bool:
    return isinstance(value, str) and value.startswith(("http://", "https://"))


def _check_mcp_server(path: tuple[str, ...], raw: object) -> tuple[str, str] | None:
    where = dotted(path)
    if not isinstance(raw, dict):
        return where, "must be an object"
    command, http_url, url = raw.get("command"), raw.get("httpUrl"), raw.get("url")
    if command is None and http_url is None and url is None:
        return where, "must name a `command`, an `httpUrl` or a `url`"
    if command is not None and (not isinstance(command, str) or not command.strip()):
        return f"{where}.command", "must be a non-empty string"
    for field, value in (("httpUrl", http_url), ("url", url)):
        if value is not None and not _http_url(value):
            return f"{where}.{field}", "must be an http(s) URL"
    for field in ("args", "includeTools", "excludeTools"):
        if field in raw and not _string_list(raw[field]):
            return f"{where}.{field}", "must be an array of strings"
    for field in ("env", "headers"):
        if field in raw and not _str_map(raw[field]):
            return f"{where}.{field}", "must be an object of strings"
    for field in ("cwd", "description", "type"):
        if field in raw and not isinstance(raw[field], str):
            return f"{where}.{field}", "must be a string"
    for field in ("trust", "disabled"):
        if field in raw and not isinstance(raw[field], bool):
            return f"{where}.{field}", "must be a boolean"
    timeout = raw.get("timeout")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout < 0
    ):
        return f"{where}.timeout", "must be a non-negative number"
    return None


def _check_mcp_servers(path: tuple[str, ...], value: object) -> tuple[str, str] | None:
    if not isinstance(value, dict):
        return dotted(path), "must be an object of server objects"
    if len(value) > MAX_MCP_SERVERS:
        return dotted(path), f"must hold at most {MAX_MCP_SERVERS} servers"
    for name, server in value.items():
        if not name or len(name) > MAX_NAME_CHARS or _CONTROL.search(name):
            return dotted(path), f"server name {name[:64]!r} is not allowed"
        problem = _check_mcp_server((*path, name), server)
        if problem is not None:
            return problem
    return None


class KnownSetting(msgspec.Struct, frozen=True):
    """A setting whose type the daemon checks (and describes in ``GET``)."""

    key: str
    type: Literal["array", "string", "object", "enum"]
    label: str
    description: str
    default: object
    check: Check
    options: tuple[str, ...] = ()

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(self.key.split("."))

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "key": self.key,
            "type": self.type,
            "label": self.label,
            "category": self.key.split(".", 1)[0],
            "description": self.description,
            "requiresRestart": False,
            "appliesTo": "new_sessions",
            "default": self.default,
        }
        if self.options:
            out["options"] = [{"value": o, "label": o} for o in self.options]
        return out


KNOWN_SETTINGS: Final[tuple[KnownSetting, ...]] = (
    KnownSetting(
        "tools.disabled",
        "array",
        "Disabled tools",
        "Tool names the agent does not register (takes effect for new sessions).",
        [],
        _check_disabled,
    ),
    KnownSetting(
        "tools.approvalMode",
        "enum",
        "Approval mode",
        "Default approval mode of new sessions.",
        "default",
        _check_approval_mode,
        APPROVAL_MODES,
    ),
    KnownSetting(
        "context.fileName",
        "string",
        "Memory file name",
        "Name of the workspace memory file (QWEN.md by default).",
        "QWEN.md",
        _check_file_name,
    ),
    KnownSetting(
        "mcpServers",
        "object",
        "MCP servers",
        "MCP servers handed to new sessions (env and header values are redacted).",
        {},
        _check_mcp_servers,
    ),
)


def _related(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def touched_known(path: tuple[str, ...]) -> list[KnownSetting]:
    """The known settings an update at ``path`` can change."""
    return [k for k in KNOWN_SETTINGS if _related(k.path, path)]


def validate_known(doc: Mapping[str, Any], path: tuple[str, ...]) -> None:
    """Type-check every known setting the update at ``path`` touches, in ``doc``."""
    for known in touched_known(path):
        value = get_path(doc, known.path)
        if value is _MISSING:
            continue
        problem = known.check(known.path, value)
        if problem is not None:
            key, message = problem
            raise SettingError(key, f"{key} {message}")


# ---- update (pure) ------------------------------------------------------------------------


def apply_update(
    doc: Mapping[str, Any], path: tuple[str, ...], value: object, *, remove: bool = False
) -> dict[str, Any]:
    """A copy of ``doc`` with ``value`` set at ``path`` (or the key removed)."""
    out: dict[str, Any] = dict(doc)
    node = out
    for depth, segment in enumerate(path[:-1]):
        child = node.get(segment, _MISSING)
        if child is _MISSING:
            if remove:
                return out
            child = {}
        elif not isinstance(child, dict):
            if remove:
                return out
            raise SettingError(
                dotted(path[: depth + 1]),
                f"{dotted(path[: depth + 1])} is not an object, so "
                f"{dotted(path)} cannot be set inside it",
            )
        else:
            child = dict(child)
        node[segment] = child
        node = child
    if remove:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = copy.deepcopy(value)
    return out


def _walk_redact(value: object, path: tuple[str, ...]) -> object:
    if isinstance(value, dict):
        return {k: _walk_redact(v, (*path, k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk_redact(v, path) for v in value]
    if isinstance(value, str) and _is_secret_path(path):
        return REDACTED
    return value


def _is_secret_path(path: tuple[str, ...]) -> bool:
    if len(path) == 4 and path[0] == "mcpServers" and path[2] in ("env", "headers"):
        return True
    return bool(path) and bool(_SECRET_NAME.search(path[-1]))


def redact(value: object, path: tuple[str, ...] = ()) -> object:
    """``value`` (found at ``path`` in the settings) with secret strings replaced."""
    return _walk_redact(value, path)


def restore_redacted(value: object, stored: object, path: tuple[str, ...]) -> object:
    """``value`` with each :data:`REDACTED` string replaced by the stored secret."""
    if isinstance(value, str) and value == REDACTED:
        if isinstance(stored, str):
            return stored
        raise SettingError(
            dotted(path),
            f"{dotted(path)} is {REDACTED!r} but there is no stored value to keep",
        )
    if isinstance(value, dict):
        old = stored if isinstance(stored, dict) else {}
        return {k: restore_redacted(v, old.get(k, _MISSING), (*path, k)) for k, v in value.items()}
    if isinstance(value, list):
        old_list = stored if isinstance(stored, list) else []
        return [
            restore_redacted(v, old_list[i] if i < len(old_list) else _MISSING, path)
            for i, v in enumerate(value)
        ]
    return value


def changed_keys(old: object, new: object, *, depth: int = 2) -> list[str]:
    """Dotted keys (at most ``depth`` segments) whose values differ, sorted."""
    out: list[str] = []

    def as_dict(value: object, other: object) -> dict[str, Any] | None:
        if isinstance(value, dict):
            return value
        return {} if value is _MISSING and isinstance(other, dict) else None

    def walk(a: object, b: object, path: tuple[str, ...]) -> None:
        if a == b:
            return
        left, right = as_dict(a, b), as_dict(b, a)
        if len(path) < depth and left is not None and right is not None:
            for key in list(left) + [k for k in right if k not in left]:
                walk(left.get(key, _MISSING), right.get(key, _MISSING), (*path, key))
            return
        if path:
            out.append(dotted(path))

    walk(old if isinstance(old, dict) else {}, new if isinstance(new, dict) else {}, ())
    return sorted(out)


# ---- the read-modify-write (blocking) -----------------------------------------------------


class SettingUpdate(msgspec.Struct, frozen=True):
    """What an update did. ``value`` is the stored value, redacted (None after a removal)."""

    changed: bool
    value: object = None


def update_setting(
    ws: Workspace, path: tuple[str, ...], value: object, *, remove: bool = False
) -> SettingUpdate:
    """Set (or remove) the setting at ``path`` in the workspace settings file.

    Raises :class:`SettingError` (the update is invalid), :class:`SettingsFileError` (the
    file is unusable or kept changing) or :class:`~serve.workspaces.files.WorkspaceFsError` (the
    boundary refused the write).
    """
    public: object = None

    def change(doc: dict[str, Any]) -> dict[str, Any] | None:
        nonlocal public
        new_value = None
        if not remove:
            new_value = restore_redacted(value, get_path(doc, path), path)
        updated = apply_update(doc, path, new_value, remove=remove)
        validate_known(updated, path)
        stored = None if remove else get_path(updated, path)
        public = None if remove else redact(stored, path)
        return None if updated == doc else updated

    changed = update_settings(ws, change)
    return SettingUpdate(changed=changed, value=public)
