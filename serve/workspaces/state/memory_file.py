"""The workspace memory file (``QWEN.md`` or its configured name): read, append, replace.

Theory of operation
-------------------
The file lives at the workspace root; its name is ``--memory-file-name`` when set, else
``context.fileName`` from the workspace settings, else ``QWEN.md``
(:func:`serve.status.init.memory_file_name`). Everything goes through the shared
:class:`~serve.workspaces.files.Workspace` boundary, so a memory file that is a symlink out of
the workspace is refused like any other escape and writes are atomic (temp file +
rename) and serialised with the file routes' and agents' writes of the same path.

Append is qwen-code's composition (:func:`compose_appended`, pure, table-tested): new
text goes under the ``## Qwen Added Memories`` section, created at the end of the file if
missing; text that is only whitespace changes nothing. Replace writes the content as
sent. A write is a read (whole file, in windows, with its hash) then a write checked
against that hash (``create`` when the file is absent); a concurrent change makes the
write fail and the update is redone from a fresh read, at most
:data:`MAX_UPDATE_ATTEMPTS` times. The existing file's encoding, BOM and line endings
are kept.

Bounds: requests carry at most :data:`MAX_CONTENT_BYTES`; an existing file larger than
:data:`MAX_MEMORY_FILE_BYTES` is neither appended to nor returned whole
(:class:`MemoryFileTooLarge`); reads return at most :data:`MAX_READ_CONTENT_BYTES` of
text (``truncated``).

Blocking: :func:`read_memory` and :func:`write_memory` do file I/O (worker thread).
Errors: :class:`MemoryFileTooLarge`, :class:`MemoryBusy`, and
:class:`~serve.workspaces.files.WorkspaceFsError` from the boundary (escape, binary file...).
"""

from __future__ import annotations

import base64
from typing import Final, Literal

import msgspec

from serve.workspaces.files import Workspace, WorkspaceFsError, hash_bytes, read_bytes, write_text
from serve.workspaces.files.errors import make_error
from serve.workspaces.files.textio import decode_text, looks_binary

__all__ = [
    "MAX_CONTENT_BYTES",
    "MAX_MEMORY_FILE_BYTES",
    "MAX_READ_CONTENT_BYTES",
    "MEMORY_SECTION_HEADER",
    "MemoryBusy",
    "MemoryFile",
    "MemoryFileTooLarge",
    "MemoryWrite",
    "compose_appended",
    "read_memory",
    "write_memory",
]

MEMORY_SECTION_HEADER: Final = "## Qwen Added Memories"
#: Largest ``content`` a write request may carry (UTF-8 bytes), as in qwen serve.
MAX_CONTENT_BYTES: Final = 1024 * 1024
#: Largest existing memory file read whole or appended to (the workspace write cap).
MAX_MEMORY_FILE_BYTES: Final = 5 * 1024 * 1024
#: Largest text returned by a read (UTF-8 bytes, cut on a code point).
MAX_READ_CONTENT_BYTES: Final = 1024 * 1024
#: Read-modify-write rounds before giving up on a file that keeps changing.
MAX_UPDATE_ATTEMPTS: Final = 5
_WINDOW: Final = 256 * 1024

Mode = Literal["append", "replace"]


class MemoryFileTooLarge(Exception):
    """The existing memory file is larger than :data:`MAX_MEMORY_FILE_BYTES` (413)."""

    def __init__(self, path: str, size: int) -> None:
        super().__init__(f"{path} is {size} bytes; the limit is {MAX_MEMORY_FILE_BYTES} bytes")
        self.path = path
        self.size = size


class MemoryBusy(Exception):
    """The memory file kept changing during the update (409, retry)."""


class MemoryFile(msgspec.Struct, frozen=True):
    """What a read found. ``content`` is ``None`` when the file does not exist."""

    name: str
    path: str  # absolute
    exists: bool
    content: str | None = None
    size_bytes: int = 0
    hash: str | None = None
    encoding: str | None = None
    truncated: bool = False


class MemoryWrite(msgspec.Struct, frozen=True):
    """What a write did; ``bytes_written`` is the file's new size (0 when unchanged)."""

    path: str  # absolute
    mode: Mode
    changed: bool
    bytes_written: int


# ---- pure composition ---------------------------------------------------------------------


def _trim_newlines(text: str) -> str:
    return text.strip("\n")


def _next_top_level_heading(text: str, start: int) -> int:
    """Offset (from ``start``) of the line break before the next ``## `` heading, or -1.

    Lines inside ``` / ~~~ fences do not count, as in qwen-code.
    """
    in_fence = False
    line_start = start
    for i in range(start, len(text)):
        if text[i] != "\n":
            continue
        if text.startswith("```", line_start) or text.startswith("~~~", line_start):
            in_fence = not in_fence
        if not in_fence and text.startswith("## ", i + 1):
            return i - start
        line_start = i + 1
    return -1


def compose_appended(existing: str, new: str) -> str:
    """``existing`` with ``new`` appended under :data:`MEMORY_SECTION_HEADER`."""
    trimmed = _trim_newlines(new)
    if not trimmed:
        return existing
    if not existing:
        return f"{MEMORY_SECTION_HEADER}\n{trimmed}\n"
    at = existing.find(MEMORY_SECTION_HEADER)
    if at == -1:
        sep = "" if existing.endswith("\n") else "\n"
        return f"{existing}{sep}\n{MEMORY_SECTION_HEADER}\n{trimmed}\n"
    after_header = at + len(MEMORY_SECTION_HEADER)
    next_heading = _next_top_level_heading(existing, after_header)
    if next_heading == -1:
        sep = "" if existing.endswith("\n") else "\n"
        return f"{existing}{sep}{trimmed}\n"
    insert_at = after_header + next_heading
    before, after = existing[:insert_at], existing[insert_at:]
    sep = "" if before.endswith("\n") else "\n"
    return f"{before}{sep}{trimmed}\n{after}"


# ---- file I/O (blocking) ------------------------------------------------------------------


def _read_all(ws: Workspace, name: str) -> tuple[bytes, str] | None:
    """``(bytes, hash)`` of the memory file, or None when it does not exist."""
    chunks: list[bytes] = []
    offset = 0
    size = None
    while True:
        try:
            window = read_bytes(ws, name, offset=offset, max_bytes=_WINDOW)
        except WorkspaceFsError as err:
            if err.kind == "path_not_found" and offset == 0:
                return None
            raise
        if size is None:
            size = window.size_bytes
            if size > MAX_MEMORY_FILE_BYTES:
                raise MemoryFileTooLarge(ws.resolve(name, must_exist=False).absolute, size)
        elif window.size_bytes != size:
            raise MemoryBusy(f"{name} changed while it was read")
        chunk = base64.b64decode(window.content_base64)
        chunks.append(chunk)
        offset += len(chunk)
        if not chunk or offset >= size:
            break
    data = b"".join(chunks)
    return data, hash_bytes(data)


def _decode(ws: Workspace, name: str, data: bytes) -> tuple[str, str]:
    if looks_binary(data):
        raise make_error("binary_file", f"{name!r} is a binary file", "the memory file is text")
    decoded = decode_text(data)
    return decoded.text, decoded.encoding


def read_memory(ws: Workspace, name: str) -> MemoryFile:
    """The memory file ``name`` at the workspace root (``exists=False`` when absent)."""
    absolute = ws.resolve(name, must_exist=False).absolute
    found = _read_all(ws, name)
    if found is None:
        return MemoryFile(name=name, path=absolute, exists=False)
    data, digest = found
    text, encoding = _decode(ws, name, data)
    encoded = text.encode("utf-8")
    truncated = len(encoded) > MAX_READ_CONTENT_BYTES
    if truncated:
        text = encoded[:MAX_READ_CONTENT_BYTES].decode("utf-8", errors="ignore")
    return MemoryFile(
        name=name,
        path=absolute,
        exists=True,
        content=text,
        size_bytes=len(data),
        hash=digest,
        encoding=encoding,
        truncated=truncated,
    )


def write_memory(ws: Workspace, name: str, content: str, mode: Mode) -> MemoryWrite:
    """Append ``content`` to (or replace) the memory file; see the module docstring."""
    absolute = ws.resolve(name, must_exist=False).absolute
    if mode == "append" and not content.strip():
        return MemoryWrite(path=absolute, mode=mode, changed=False, bytes_written=0)
    for _ in range(MAX_UPDATE_ATTEMPTS):
        try:
            found = _read_all(ws, name)
        except MemoryBusy:
            continue
        if found is None:
            text = compose_appended("", content) if mode == "append" else content
            try:
                result = write_text(ws, name, text, mode="create")
            except WorkspaceFsError as err:
                if err.kind == "file_already_exists":
                    continue
                raise
            return MemoryWrite(absolute, mode, True, result.size_bytes)
        data, digest = found
        existing, _ = _decode(ws, name, data)
        text = compose_appended(existing, content) if mode == "append" else content
        try:
            result = write_text(ws, name, text, mode="replace", expected_hash=digest)
        except WorkspaceFsError as err:
            if err.kind in ("hash_mismatch", "path_not_found"):
                continue
            raise
        return MemoryWrite(absolute, mode, True, result.size_bytes)
    raise MemoryBusy(f"{name} kept changing during the update; retry")
