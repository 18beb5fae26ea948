"""Errors raised by the workspace file system boundary.

Theory of operation
-------------------
Every failure the workspace module reports is a :class:`WorkspaceFsError` carrying an
``errorKind`` from the closed set of the ``qwen serve`` file routes (spec §4.5, seed
"工作区文件路由"), a human message, and an optional hint; nothing here knows HTTP. The wire
status and body of a kind live in the one error table, :mod:`serve.errors`
(``FS_STATUS``, ``fs_error``), which the REST file routes and the ``/acp``
``_qwen/file/*`` handlers both use.

Who failed is encoded in the subclass, so callers can catch by cause:

    WorkspaceFsError                      base; never raised directly (use make_error)
    ├── FsRequestError        the client  parse_error, path_outside_workspace,
    │                                     symlink_escape, binary_file, text_not_found,
    │                                     ambiguous_text_match
    ├── FsNotFoundError       the client  path_not_found
    ├── FsConflictError       a racer     hash_mismatch, file_already_exists
    ├── FsLimitError          a limit     file_too_large
    ├── FsDeniedError         the policy  untrusted_workspace, permission_denied
    └── FsIoError             the host    io_error, internal_error

:func:`make_error` picks the subclass from the kind; :func:`from_os_error` maps an
``OSError`` by errno with the spec's table (ENOENT→path_not_found, EACCES/EPERM→
permission_denied, ELOOP→symlink_escape, EISDIR/ENOTDIR→parse_error, resource errors→
io_error). Messages name workspace-relative paths, never absolute host paths, because they
reach remote clients.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping
from typing import Final, Literal, get_args

__all__ = [
    "ERROR_KINDS",
    "ErrorKind",
    "FsConflictError",
    "FsDeniedError",
    "FsIoError",
    "FsLimitError",
    "FsNotFoundError",
    "FsRequestError",
    "WorkspaceFsError",
    "from_os_error",
    "make_error",
]

ErrorKind = Literal[
    "path_outside_workspace",
    "symlink_escape",
    "parse_error",
    "path_not_found",
    "hash_mismatch",
    "file_already_exists",
    "file_too_large",
    "binary_file",
    "text_not_found",
    "ambiguous_text_match",
    "untrusted_workspace",
    "permission_denied",
    "io_error",
    "internal_error",
]

#: The closed set of kinds (their wire status is :data:`serve.errors.FS_STATUS`).
ERROR_KINDS: Final[frozenset[ErrorKind]] = frozenset(get_args(ErrorKind))


class WorkspaceFsError(Exception):
    """A workspace file operation failed; ``kind`` is the wire ``errorKind``."""

    kind: ErrorKind
    message: str
    hint: str | None

    def __init__(self, kind: ErrorKind, message: str, hint: str | None = None) -> None:
        if kind not in ERROR_KINDS:
            raise ValueError(f"unknown workspace errorKind {kind!r}")
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.hint = hint

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.kind!r}, {self.message!r}, hint={self.hint!r})"


class FsRequestError(WorkspaceFsError):
    """The request itself is unacceptable (bad path, bad field, wrong kind of file)."""


class FsNotFoundError(WorkspaceFsError):
    """The named path does not exist inside the workspace."""


class FsConflictError(WorkspaceFsError):
    """The file changed under the caller, or already exists (optimistic concurrency)."""


class FsLimitError(WorkspaceFsError):
    """A size cap was hit."""


class FsDeniedError(WorkspaceFsError):
    """Policy (workspace trust) or the host's permissions refuse the operation."""


class FsIoError(WorkspaceFsError):
    """The host failed (disk full, I/O error, descriptor exhaustion) or we have a bug."""


_CLASS_BY_KIND: Final[Mapping[ErrorKind, type[WorkspaceFsError]]] = {
    "path_outside_workspace": FsRequestError,
    "symlink_escape": FsRequestError,
    "parse_error": FsRequestError,
    "binary_file": FsRequestError,
    "text_not_found": FsRequestError,
    "ambiguous_text_match": FsRequestError,
    "path_not_found": FsNotFoundError,
    "hash_mismatch": FsConflictError,
    "file_already_exists": FsConflictError,
    "file_too_large": FsLimitError,
    "untrusted_workspace": FsDeniedError,
    "permission_denied": FsDeniedError,
    "io_error": FsIoError,
    "internal_error": FsIoError,
}


def make_error(kind: ErrorKind, message: str, hint: str | None = None) -> WorkspaceFsError:
    """Build the subclass of :class:`WorkspaceFsError` that matches ``kind``."""
    return _CLASS_BY_KIND[kind](kind, message, hint)


_ERRNO_KIND: Final[Mapping[int, ErrorKind]] = {
    errno.ENOENT: "path_not_found",
    errno.EACCES: "permission_denied",
    errno.EPERM: "permission_denied",
    errno.EROFS: "permission_denied",
    errno.ELOOP: "symlink_escape",
    errno.EISDIR: "parse_error",
    errno.ENOTDIR: "parse_error",
    errno.ENOSPC: "io_error",
    errno.EIO: "io_error",
    errno.EBUSY: "io_error",
    errno.ETXTBSY: "io_error",
    errno.ENAMETOOLONG: "io_error",
    errno.EMFILE: "io_error",
    errno.ENFILE: "io_error",
    errno.EDQUOT: "io_error",
}

_ERRNO_HINT: Final[Mapping[ErrorKind, str]] = {
    "symlink_escape": "a symlink in the path forms a cycle or was swapped during the operation",
    "parse_error": "a path component is not a directory where one was expected",
    "io_error": "the daemon host could not complete the operation; retry later",
}


def from_os_error(err: OSError, rel_path: str, action: str) -> WorkspaceFsError:
    """Map an ``OSError`` from acting on ``rel_path`` to a typed error (spec errno table).

    ``rel_path`` must be the workspace-relative spelling: the OS message (which names
    absolute paths) is deliberately not forwarded to the client.
    """
    kind: ErrorKind = _ERRNO_KIND.get(err.errno or 0, "io_error")
    reason = err.strerror or type(err).__name__
    return make_error(kind, f"cannot {action} {rel_path!r}: {reason}", _ERRNO_HINT.get(kind))
