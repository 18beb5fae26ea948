"""``POST /workspace/init``: create the workspace memory file (``QWEN.md`` by default).

Theory of operation
-------------------
Synchronous (run in a worker thread), through the shared workspace boundary. The outcome
table, from the seed:

==========================================  ==================  =========================
file state                                   ``force``           outcome
==========================================  ==================  =========================
absent                                       any                 create empty → ``created``
empty or whitespace only (a UTF-8 BOM too)   any                 nothing written → ``noop``
non-whitespace content                       false / absent      :class:`InitConflict` (409)
non-whitespace content                       true                replaced by empty →
                                                                 ``overwrote``
==========================================  ==================  =========================

Refusals (:class:`InitError`, 400): the name resolves outside the workspace
(``workspace_init_path_escape``), the file or a parent is a symlink
(``workspace_init_symlink``: the memory file is always written in place, never through a
link), or the file changed between our read and our write (``workspace_init_race``; the
write is a create that never overwrites, or a replace checked against the hash we read).
A directory (or other non-file) where the memory file should be is a conflict that
``force`` cannot clear.
"""

from __future__ import annotations

import base64
import codecs
import hashlib
from typing import Final, Literal

import msgspec

from serve.workspaces.files import (
    Workspace,
    WorkspaceFsError,
    read_bytes,
    stat,
    write_text,
)

__all__ = ["InitConflict", "InitError", "InitResult", "init_memory_file", "memory_file_name"]

#: Bytes read per window while inspecting an existing memory file.
_WINDOW: Final = 256 * 1024
#: Largest existing memory file ``force`` replaces (5 MiB, the write cap).
MAX_EXISTING_BYTES: Final = 5 * 1024 * 1024
DEFAULT_MEMORY_FILE: Final = "QWEN.md"

Action = Literal["created", "noop", "overwrote"]


class InitResult(msgspec.Struct, frozen=True):
    action: Action
    path: str  # absolute, as the seed's response shows


class InitError(Exception):
    """A 400 refusal with a wire ``code``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class InitConflict(Exception):
    """The memory file exists with content (409 ``workspace_init_conflict``)."""

    def __init__(self, path: str, size: int, message: str) -> None:
        super().__init__(message)
        self.path = path
        self.size = size
        self.message = message


def memory_file_name(flag_value: str, settings: dict[str, object]) -> str:
    """``--memory-file-name`` when changed from the default, else ``context.fileName``."""
    if flag_value != DEFAULT_MEMORY_FILE:
        return flag_value
    context = settings.get("context")
    name = context.get("fileName") if isinstance(context, dict) else None
    if isinstance(name, list) and name:
        name = name[0]
    if isinstance(name, str) and name and "/" not in name and name not in (".", ".."):
        return name
    return DEFAULT_MEMORY_FILE


def _map(err: WorkspaceFsError, name: str) -> Exception:
    if err.kind == "path_outside_workspace":
        return InitError(
            "workspace_init_path_escape", f"memory file {name!r} is outside the workspace"
        )
    if err.kind == "symlink_escape":
        return InitError("workspace_init_symlink", f"memory file {name!r} is behind a symlink")
    if err.kind in ("hash_mismatch", "file_already_exists"):
        return InitError("workspace_init_race", f"memory file {name!r} changed during init")
    return err


def _scan(ws: Workspace, name: str, size: int) -> tuple[bool, str]:
    """``(whitespace only, sha256 hash)`` of the existing file, read in windows."""
    digest = hashlib.sha256()
    blank = True
    offset = 0
    while offset < size:
        window = read_bytes(ws, name, offset=offset, max_bytes=_WINDOW)
        chunk = base64.b64decode(window.content_base64)
        if not chunk:
            break
        digest.update(chunk)
        if blank:
            body = (
                chunk[len(codecs.BOM_UTF8) :]
                if offset == 0 and chunk.startswith(codecs.BOM_UTF8)
                else chunk
            )
            blank = body.strip() == b""
        offset += len(chunk)
    return blank, "sha256:" + digest.hexdigest()


def init_memory_file(ws: Workspace, name: str, *, force: bool) -> InitResult:
    """Apply the outcome table for the memory file ``name`` at the workspace root."""
    try:
        resolved = ws.resolve(name, must_exist=False, follow_symlinks=False)
        absolute = resolved.absolute
        try:
            info = stat(ws, name)
        except WorkspaceFsError as err:
            if err.kind != "path_not_found":
                raise
            write_text(ws, name, "", mode="create")
            return InitResult("created", absolute)
        if info.type == "symlink":
            raise InitError("workspace_init_symlink", f"memory file {name!r} is a symlink")
        if info.type != "file":
            raise InitConflict(absolute, info.size_bytes, f"{name!r} exists and is not a file")
        if info.size_bytes > MAX_EXISTING_BYTES:
            if not force:
                raise InitConflict(absolute, info.size_bytes, f"{name!r} already has content")
            raise InitConflict(
                absolute, info.size_bytes, f"{name!r} is too large to overwrite safely"
            )
        blank, current = _scan(ws, name, info.size_bytes)
        if blank:
            return InitResult("noop", absolute)
        if not force:
            raise InitConflict(absolute, info.size_bytes, f"{name!r} already has content")
        write_text(ws, name, "", mode="replace", expected_hash=current, encoding="utf-8", bom=False)
        return InitResult("overwrote", absolute)
    except WorkspaceFsError as err:
        raise _map(err, name) from None
