"""The wire surface of the workspace file functions: response bodies and argument checks.

Every response is a frozen ``msgspec.Struct`` tagged with ``kind`` and renamed to
camelCase, so ``msgspec.json.encode(result)`` *is* the spec's response body (§4.5). The
argument checks raise ``parse_error`` with the wire field name, so a route can pass query
and body values through unconverted and still answer precisely.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final, Literal

import msgspec

from serve.workspaces.files.errors import make_error
from serve.workspaces.files.gitignore import IgnoreVerdict
from serve.workspaces.files.textio import LineEnding

__all__ = [
    "EditResult",
    "EntryKind",
    "GlobResult",
    "ListEntry",
    "ListResult",
    "ReadBytesResult",
    "ReadTextResult",
    "StatResult",
    "WriteResult",
    "hash_arg",
    "hash_bytes",
    "int_arg",
    "is_content_hash",
    "str_arg",
]

EntryKind = Literal["file", "directory", "symlink", "other"]

_HASH_RE: Final = re.compile(r"sha256:[0-9a-f]{64}")


# -- wire results -------------------------------------------------------------------------


class _Result(msgspec.Struct, frozen=True, rename="camel", tag_field="kind"):
    """Base of the response bodies; ``kind`` is the msgspec tag."""


class ReadTextResult(_Result, frozen=True, tag="file"):
    """``GET /file`` body."""

    path: str
    content: str
    encoding: str
    bom: bool
    line_ending: LineEnding
    size_bytes: int
    returned_bytes: int
    truncated: bool
    hash: str
    matched_ignore: IgnoreVerdict
    original_line_count: int | None
    next_cursor: str | None
    has_more: bool


class ReadBytesResult(_Result, frozen=True, tag="file_bytes", omit_defaults=True):
    """``GET /file/bytes`` body; ``hash`` only when the window is the whole file."""

    path: str
    offset: int
    size_bytes: int
    returned_bytes: int
    truncated: bool
    content_base64: str
    hash: str | None = None


class StatResult(_Result, frozen=True, tag="stat"):
    """``GET /stat`` body (``lstat`` semantics: a symlink is reported as ``symlink``)."""

    path: str
    type: EntryKind
    size_bytes: int
    modified_ms: int


class ListEntry(msgspec.Struct, frozen=True):
    """One ``GET /list`` entry."""

    name: str
    kind: EntryKind
    ignored: bool


class ListResult(_Result, frozen=True, tag="list"):
    """``GET /list`` body; entries sorted by name."""

    path: str
    entries: tuple[ListEntry, ...]
    truncated: bool
    matched_ignore: IgnoreVerdict


class GlobResult(_Result, frozen=True, tag="glob"):
    """``GET /glob`` body; ``matches`` are workspace-relative, in walk (name) order."""

    pattern: str
    cwd: str
    matches: tuple[str, ...]
    count: int
    truncated: bool
    duration_ms: int


class WriteResult(_Result, frozen=True, tag="file_write"):
    """``POST /file/write`` body (``mode`` ``overwrite`` only from :func:`overwrite_text`)."""

    path: str
    mode: Literal["create", "replace", "overwrite"]
    created: bool
    size_bytes: int
    hash: str
    encoding: str
    bom: bool
    line_ending: LineEnding
    matched_ignore: IgnoreVerdict


class EditResult(_Result, frozen=True, tag="file_edit"):
    """``POST /file/edit`` body."""

    path: str
    replacements: int
    size_bytes: int
    hash: str
    encoding: str
    bom: bool
    line_ending: LineEnding
    matched_ignore: IgnoreVerdict


# -- arguments and hashes ----------------------------------------------------------------------


def hash_bytes(data: bytes) -> str:
    """The wire hash of raw file bytes: ``sha256:<64 lowercase hex>``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def is_content_hash(value: object) -> bool:
    """True for a well-formed ``sha256:<64 lowercase hex>`` string."""
    return isinstance(value, str) and _HASH_RE.fullmatch(value) is not None


def hash_arg(value: object) -> str | None:
    if value is None:
        return None
    if not is_content_hash(value):
        raise make_error(
            "parse_error",
            "expectedHash must be sha256: followed by 64 lowercase hex characters",
            "use the hash returned by GET /file",
        )
    assert isinstance(value, str)
    return value


def int_arg(name: str, value: object, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise make_error("parse_error", f"{name} must be an integer in [{low}, {high}]")
    return value


def str_arg(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise make_error("parse_error", f"{name} must be a string")
    return value
