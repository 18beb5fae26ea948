r"""Descriptors beneath a workspace root, and snapshot reads of one file through them.

Every file operation of :mod:`serve.workspaces.files.contents` opens the *parent directory* of its
path beneath the root without following symlinks (:func:`parent_dir`, through
:meth:`~serve.workspaces.files.paths.Workspace.open_dir`) and then acts on the leaf name relative
to that descriptor (``dir_fd``, ``O_NOFOLLOW``): a symlink swapped in after resolution makes
the operation fail (``symlink_escape``) instead of escaping the root.

A snapshot read (:func:`read_leaf`) reads an open regular file through one descriptor and
``fstat``\s it before and after; a change in between (an in-place write by another
process) is ``hash_mismatch`` (:func:`changed`); past its cap, ``file_too_large``.
:func:`hash_leaf` is the streamed ``sha256:<hex>`` of the leaf as it is now (the writers'
re-check before they publish). Blocking; failures raise
:class:`~serve.workspaces.files.errors.WorkspaceFsError`.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat as stat_mod
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from serve.workspaces.files.errors import WorkspaceFsError, from_os_error, make_error
from serve.workspaces.files.paths import ResolvedPath, Workspace

#: Bytes read per ``os.read`` of a snapshot or a hash.
READ_CHUNK_BYTES: Final = 1024 * 1024
#: How a leaf is opened: read-only, never through a symlink, never blocking on a FIFO.
FILE_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@contextmanager
def parent_dir(ws: Workspace, rp: ResolvedPath, *, create_missing: bool = False) -> Iterator[int]:
    """The descriptor of ``rp``'s parent directory beneath the root (closed on exit)."""
    if not rp.parts:
        raise make_error("parse_error", "the workspace root is a directory, not a file")
    fd = ws.open_dir(rp.parts[:-1], create_missing=create_missing)
    try:
        yield fd
    finally:
        os.close(fd)


def lstat_leaf(pfd: int, rp: ResolvedPath) -> os.stat_result | None:
    """The leaf's own ``stat`` (a symlink not followed), or None when it does not exist."""
    try:
        return os.stat(rp.name, dir_fd=pfd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise from_os_error(err, rp.relative, "stat") from None


def swapped(rel: str) -> WorkspaceFsError:
    """The leaf became a symlink after resolution."""
    return make_error(
        "symlink_escape",
        f"{rel!r} became a symlink during the operation",
        "re-resolve the path and retry",
    )


def open_regular(pfd: int, rp: ResolvedPath) -> tuple[int, os.stat_result]:
    """Open the leaf read-only without following it; it must be a regular file."""
    try:
        fd = os.open(rp.name, FILE_FLAGS, dir_fd=pfd)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise swapped(rp.relative) from None
        raise from_os_error(err, rp.relative, "open") from None
    st = os.fstat(fd)
    if not stat_mod.S_ISREG(st.st_mode):
        os.close(fd)
        what = "a directory" if stat_mod.S_ISDIR(st.st_mode) else "not a regular file"
        raise make_error("parse_error", f"{rp.relative!r} is {what}")
    return fd, st


def changed(rel: str) -> WorkspaceFsError:
    """The file changed while it was being read."""
    return make_error(
        "hash_mismatch",
        f"{rel!r} changed while it was being read",
        "re-read the file and retry",
    )


def too_large(rel: str, size: int, cap: int, what: str, hint: str) -> WorkspaceFsError:
    """``file_too_large``: ``size`` bytes against the ``what`` limit ``cap``."""
    return make_error(
        "file_too_large", f"{rel!r} is {size} bytes; the {what} limit is {cap} bytes", hint
    )


def read_snapshot(fd: int, st: os.stat_result, rel: str, cap: int, hint: str) -> bytes:
    """All bytes of an open regular file, at most ``cap``; a concurrent change fails."""
    if st.st_size > cap:
        raise too_large(rel, st.st_size, cap, "read", hint)
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = os.read(fd, min(READ_CHUNK_BYTES, cap + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
        if total > cap:
            raise changed(rel)
    after = os.fstat(fd)
    if total != st.st_size or after.st_size != st.st_size or after.st_mtime_ns != st.st_mtime_ns:
        raise changed(rel)
    return b"".join(chunks)


def read_leaf(pfd: int, rp: ResolvedPath, cap: int, hint: str) -> tuple[bytes, os.stat_result]:
    """A snapshot of the leaf (at most ``cap`` bytes) and its ``stat``."""
    fd, st = open_regular(pfd, rp)
    try:
        return read_snapshot(fd, st, rp.relative, cap, hint), st
    except OSError as err:
        raise from_os_error(err, rp.relative, "read") from None
    finally:
        os.close(fd)


def hash_leaf(pfd: int, rp: ResolvedPath) -> str | None:
    """Hash of the leaf as it is now (streamed), or None if it no longer exists."""
    try:
        fd, _ = open_regular(pfd, rp)
    except WorkspaceFsError as err:
        if err.kind == "path_not_found":
            return None
        raise
    digest = hashlib.sha256()
    try:
        while chunk := os.read(fd, READ_CHUNK_BYTES):
            digest.update(chunk)
    except OSError as err:
        raise from_os_error(err, rp.relative, "read") from None
    finally:
        os.close(fd)
    return "sha256:" + digest.hexdigest()
