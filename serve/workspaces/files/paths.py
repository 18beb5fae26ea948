"""The workspace boundary: turn a client's or an agent's path into one provably inside.

Theory of operation
-------------------
A :class:`Workspace` is bound once, at daemon start, to a canonical root (``realpath`` of
the configured directory). Every file operation, from the HTTP file routes and from the
ACP ``fs/*`` handlers alike, first calls :meth:`Workspace.resolve`, which returns a
:class:`ResolvedPath` or raises a :class:`~serve.workspaces.files.errors.WorkspaceFsError`:

1. **Syntax.** A non-string or empty path, one over :data:`MAX_PATH_CHARS` characters, or
   one with a name over :data:`MAX_NAME_BYTES` UTF-8 bytes is a ``parse_error``.
2. **Suspicious patterns** (:func:`suspicious_reason`) are ``path_outside_workspace``,
   checked on the literal input before any I/O. From the reference, on every platform:
   device-namespace prefixes ``\\\\?\\`` ``\\\\.\\`` ``//?/`` ``//./``; UNC prefixes
   ``//host``/``\\\\host``; a segment of three or more dots; a segment ending in a dot or a
   space; DOS device names ``CON PRN AUX NUL COM1-9 LPT1-9`` as a segment's base or any
   dotted part. On Windows also ``:`` after index 2 (NTFS streams) and ``~N`` short names.
   Extras, each because it lets a path *look* different from what it is, or breaks the
   layers behind us:

   * NUL: C APIs truncate at it, and Python raises ``ValueError`` (a 500) on it;
   * other C0/C1 controls (``\\n``, ``\\r``, ``ESC``…): they forge lines in logs and audit
     events and rewrite terminals that display paths;
   * Unicode format characters (category Cf: bidi embeddings/overrides/isolates such as
     U+202E, zero-width space/joiners, word joiner, BOM, tag characters): the "Trojan
     Source" class (CVE-2021-42574) — a permission prompt or audit line shows a different
     name from the one that is written;
   * line/paragraph separators (Zl, Zp), non-ASCII spaces (Zs other than U+0020, such as
     NBSP and the ideographic space), and invisible letters (Hangul fillers U+115F U+1160
     U+3164 U+FFA0, braille blank U+2800, combining grapheme joiner U+034F): names that
     render identically to a different name or to nothing;
   * lone surrogates (Cs): they cannot be encoded for the OS and would surface as a 500.

3. **Lexical containment.** A relative path is joined to the root; an absolute path is
   taken as is. The result is normalised lexically (``a/../b`` → ``b``) and must lie in
   the root, or in the root as spelled before canonicalisation (so absolute paths built
   from a symlinked spelling of the workspace still work), else ``path_outside_workspace``.
4. **Symlinks.** The path is walked component by component from the canonical root with
   ``lstat``/``readlink``, following every symlink (chains included, at most
   :data:`MAX_SYMLINK_HOPS` hops, else ``symlink_escape``, which also covers loops). The
   first missing component ends the walk; the rest is the not-yet-existing tail. The real
   path (walked part + tail) must lie in the canonical root, else ``symlink_escape``;
   while the walk is outside the root every error is reported as ``symlink_escape``, so
   the result never reveals anything about outside paths. A dangling symlink is followed
   too: writing through ``ws/leak -> /etc/x`` is an escape even though ``/etc/x`` does not
   exist. With ``follow_symlinks=False`` the last component is not followed (``lstat``
   semantics for ``GET /stat``). Only then, ``must_exist=True`` turns a tail into
   ``path_not_found``; a file where a directory is needed is ``parse_error``.

The walk is checked at one instant; the file functions then act through
:meth:`Workspace.open_dir`, which re-walks the *canonical* components from the root with
``O_NOFOLLOW`` at every step (``openat``), so a symlink swapped in after resolution makes
the operation fail (``symlink_escape``) instead of escaping. POSIX only.

:meth:`Workspace.relative` renders canonical paths for responses: workspace-relative,
``/``-separated, ``"."`` for the root. Error messages quote the caller's own input or
workspace-relative paths, never the host path of the root.
"""

from __future__ import annotations

import errno
import os
import re
import stat as stat_mod
import unicodedata
from collections import deque
from typing import Final

import msgspec

from serve.workspaces.files.errors import WorkspaceFsError, from_os_error, make_error
from serve.workspaces.files.gitignore import IgnoreRules, IgnoreVerdict
from serve.workspaces.files.locks import PathLocks

__all__ = [
    "MAX_NAME_BYTES",
    "MAX_PATH_CHARS",
    "MAX_SYMLINK_HOPS",
    "ResolvedPath",
    "Workspace",
    "suspicious_reason",
]

#: Longest accepted path, in characters (Linux PATH_MAX).
MAX_PATH_CHARS: Final = 4096
#: Longest accepted single name, in UTF-8 bytes (Linux NAME_MAX).
MAX_NAME_BYTES: Final = 255
#: Symlinks followed while resolving one path (Linux MAXSYMLINKS).
MAX_SYMLINK_HOPS: Final = 40

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DOS_DEVICE = re.compile(r"(^|\.)(CON|PRN|AUX|NUL|COM[1-9]|LPT[1-9])(\.|$)", re.IGNORECASE)
_SHORT_NAME = re.compile(r"~\d+")
_DEVICE_PREFIXES: Final = ("\\\\?\\", "\\\\.\\", "//?/", "//./")
_INVISIBLE_LETTERS: Final = frozenset("\u034f\u115f\u1160\u2800\u3164\uffa0")


def _describe(ch: str) -> str:
    name = unicodedata.name(ch, "")
    return f"U+{ord(ch):04X}" + (f" {name}" if name else "")


def _char_reason(ch: str) -> str | None:
    if ch == "\x00":
        return "NUL byte"
    if ch == " ":
        return None
    category = unicodedata.category(ch)
    if category == "Cc":
        return f"control character {_describe(ch)}"
    if category == "Cf":
        return f"invisible formatting character {_describe(ch)}"
    if category == "Cs":
        return f"lone surrogate {_describe(ch)}"
    if category in ("Zl", "Zp", "Zs"):
        return f"hard-to-see space or separator {_describe(ch)}"
    if ch in _INVISIBLE_LETTERS:
        return f"invisible character {_describe(ch)}"
    return None


def suspicious_reason(path: str, *, windows: bool = False) -> str | None:
    """Why ``path`` is refused before any I/O, or None (see the module docstring)."""
    for ch in path:
        if ord(ch) < 0x80 and " " <= ch <= "~":
            continue
        reason = _char_reason(ch)
        if reason is not None:
            return reason
    if windows:
        if path.find(":", 2) != -1:
            return "':' after the drive letter (NTFS alternate data stream)"
        if _SHORT_NAME.search(path):
            return "8.3 short name ('~N')"
    if path.startswith(_DEVICE_PREFIXES):
        return "device namespace prefix"
    if len(path) > 2 and path[:2] in ("//", "\\\\") and path[2] not in "/\\":
        return "UNC path"
    for segment in re.split(r"[\\/]", path):
        if segment in ("", ".", ".."):
            continue
        if len(segment) >= 3 and segment.strip(".") == "":
            return f"segment of dots {segment!r}"
        if segment[-1] in ". \t":
            return f"segment ending in a dot or space {segment!r}"
        if _DOS_DEVICE.search(segment):
            return f"reserved device name {segment!r}"
    return None


class ResolvedPath(msgspec.Struct, frozen=True):
    """A path proven inside the workspace at resolution time.

    ``absolute`` is canonical (no symlinks, except the last component when resolved with
    ``follow_symlinks=False``); ``parts`` are its components below the root (empty for the
    root); ``relative`` is the wire spelling; ``exists`` is False when a tail is missing.
    """

    absolute: str
    relative: str
    parts: tuple[str, ...]
    exists: bool

    @property
    def name(self) -> str:
        """The last component (``""`` for the root)."""
        return self.parts[-1] if self.parts else ""


def _within(path: str, root: str) -> bool:
    return root == "/" or path == root or path.startswith(root + "/")


def _parts_below(path: str, root: str) -> tuple[str, ...]:
    if path == root:
        return ()
    rest = path[1:] if root == "/" else path[len(root) + 1 :]
    return tuple(rest.split("/"))


class Workspace:
    """The daemon's bound workspace: canonical root, resolution, safe opens, ignore rules.

    ``trusted=False`` keeps reads (read/list/glob/stat) and refuses writes and edits with
    ``untrusted_workspace``. Thread-safe; one instance serves the whole daemon.
    """

    def __init__(self, root: str | os.PathLike[str], *, trusted: bool = True) -> None:
        spelled = os.path.abspath(os.fspath(root))
        canonical = os.path.realpath(spelled)
        if not os.path.isdir(canonical):
            raise ValueError(f"workspace root {spelled!r} is not an existing directory")
        self.root: Final[str] = canonical
        self.trusted: Final[bool] = trusted
        self._roots: tuple[str, ...] = (
            (canonical,)
            if spelled == canonical
            else (
                canonical,
                os.path.normpath(spelled),
            )
        )
        self.locks: Final[PathLocks] = PathLocks()
        self.ignore: Final[IgnoreRules] = IgnoreRules(self.open_file)

    def __repr__(self) -> str:
        return f"Workspace({self.root!r}, trusted={self.trusted})"

    # -- resolution -------------------------------------------------------------------

    def resolve(
        self, user_path: str, *, must_exist: bool = True, follow_symlinks: bool = True
    ) -> ResolvedPath:
        """Resolve a workspace-relative or absolute path (see the module docstring)."""
        if not isinstance(user_path, str) or user_path == "":
            raise make_error("parse_error", "path must be a non-empty string")
        if len(user_path) > MAX_PATH_CHARS:
            raise make_error(
                "parse_error",
                f"path is longer than {MAX_PATH_CHARS} characters",
                "use a shorter path",
            )
        reason = suspicious_reason(user_path, windows=os.name == "nt")
        if reason is not None:
            raise make_error(
                "path_outside_workspace",
                f"path {user_path!r} contains a suspicious pattern: {reason}",
                "device names, UNC/device prefixes, dot-only or dot/space-terminated names, "
                "control characters and invisible Unicode are rejected",
            )
        for segment in user_path.split("/"):
            if len(segment.encode("utf-8")) > MAX_NAME_BYTES:
                raise make_error(
                    "parse_error",
                    f"path {user_path[:64]!r}… has a name longer than {MAX_NAME_BYTES} bytes",
                )
        lexical = os.path.normpath(
            user_path if os.path.isabs(user_path) else os.path.join(self.root, user_path)
        )
        for root in self._roots:
            if _within(lexical, root):
                parts = _parts_below(lexical, root)
                break
        else:
            raise make_error(
                "path_outside_workspace",
                f"path {user_path!r} is outside the workspace",
                "use a workspace-relative path or an absolute path inside the workspace",
            )
        walked, tail = self._walk(parts, user_path, follow_last=follow_symlinks)
        canonical = os.path.join(walked, *tail) if tail else walked
        if not _within(canonical, self.root):
            raise self._escape(user_path)
        if tail and must_exist:
            raise make_error("path_not_found", f"path {user_path!r} does not exist")
        rel_parts = _parts_below(canonical, self.root)
        return ResolvedPath(
            absolute=canonical,
            relative="/".join(rel_parts) if rel_parts else ".",
            parts=rel_parts,
            exists=not tail,
        )

    def _escape(self, user_path: str) -> WorkspaceFsError:
        return make_error(
            "symlink_escape",
            f"path {user_path!r} resolves through a symlink to outside the workspace",
            "symlinks may only point inside the workspace",
        )

    def _walk(
        self, parts: tuple[str, ...], user_path: str, *, follow_last: bool
    ) -> tuple[str, tuple[str, ...]]:
        """Follow ``parts`` from the root: (deepest existing real path, missing tail)."""
        current = self.root
        pending: deque[str] = deque(parts)
        hops = 0
        while pending:
            name = pending.popleft()
            if name in ("", "."):
                continue
            if name == "..":
                current = os.path.dirname(current)
                continue
            candidate = os.path.join(current, name)
            try:
                st = os.lstat(candidate)
            except FileNotFoundError:
                tail = tuple(p for p in (name, *pending) if p not in ("", "."))
                if ".." in tail:
                    if not _within(current, self.root):
                        raise self._escape(user_path) from None
                    raise make_error(
                        "path_not_found", f"path {user_path!r} crosses a missing directory"
                    ) from None
                return current, tail
            except OSError as err:
                if not _within(current, self.root):
                    raise self._escape(user_path) from None
                raise from_os_error(err, user_path, "resolve") from None
            if stat_mod.S_ISLNK(st.st_mode) and (pending or follow_last):
                hops += 1
                if hops > MAX_SYMLINK_HOPS:
                    raise make_error(
                        "symlink_escape",
                        f"path {user_path!r} follows more than {MAX_SYMLINK_HOPS} symlinks",
                        "a symlink chain is too long or forms a loop",
                    )
                try:
                    target = os.readlink(candidate)
                except OSError as err:
                    if not _within(current, self.root):
                        raise self._escape(user_path) from None
                    raise from_os_error(err, user_path, "resolve") from None
                if target.startswith("/"):
                    current = "/"
                pending.extendleft(reversed(target.split("/")))
                continue
            if pending and not stat_mod.S_ISDIR(st.st_mode):
                if not _within(candidate, self.root):
                    raise self._escape(user_path)
                raise make_error(
                    "parse_error",
                    f"path {user_path!r}: a component is not a directory",
                    "a file occupies a path segment where a directory is needed",
                )
            current = candidate
        return current, ()

    def relative(self, path: str) -> str:
        """Workspace-relative ``/`` spelling of a canonical absolute path (``"."`` = root)."""
        if not _within(path, self.root):
            raise make_error("path_outside_workspace", "path is outside the workspace")
        parts = _parts_below(path, self.root)
        return "/".join(parts) if parts else "."

    # -- policy -----------------------------------------------------------------------

    def require_trusted(self, action: str) -> None:
        """Raise ``untrusted_workspace`` for mutating ``action``s in an untrusted workspace."""
        if not self.trusted:
            raise make_error(
                "untrusted_workspace",
                f"the workspace is not trusted; {action} is not allowed",
                "mark the workspace as trusted in the daemon configuration to allow writes",
            )

    def ignore_verdict(self, path: ResolvedPath, is_dir: bool) -> IgnoreVerdict:
        """``matchedIgnore`` for a resolved path (None for the root)."""
        return self.ignore.match(path.relative, is_dir)

    # -- opening beneath the root -------------------------------------------------------

    def open_dir(self, parts: tuple[str, ...], *, create_missing: bool = False) -> int:
        """Open the directory ``parts`` below the root without following any symlink.

        Returns a descriptor the caller closes. With ``create_missing`` missing
        directories are created (mode 0o777 less umask). A component that is (now) a
        symlink raises ``symlink_escape``; one that is not a directory, ``parse_error``.
        """
        rel = "/".join(parts) or "."
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as err:
            raise from_os_error(err, ".", "open the workspace root") from None
        try:
            for name in parts:
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create_missing:
                        raise
                    try:
                        os.mkdir(name, 0o777, dir_fd=fd)
                    except FileExistsError:
                        pass
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError as err:
                    if err.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise self._not_dir_or_link(fd, name, rel) from None
                    raise
                os.close(fd)
                fd = child
        except WorkspaceFsError:
            os.close(fd)
            raise
        except OSError as err:
            os.close(fd)
            if err.errno in (errno.ELOOP, errno.ENOTDIR):
                raise make_error("parse_error", f"{rel!r} is not a directory") from None
            raise from_os_error(err, rel, "open directory") from None
        return fd

    @staticmethod
    def _not_dir_or_link(dir_fd: int, name: str, rel: str) -> WorkspaceFsError:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            st = None
        if st is not None and stat_mod.S_ISLNK(st.st_mode):
            return make_error(
                "symlink_escape",
                f"a component of {rel!r} became a symlink during the operation",
                "re-resolve the path and retry",
            )
        return make_error("parse_error", f"a component of {rel!r} is not a directory")

    def open_file(self, rel: str) -> int:
        """Open workspace-relative ``rel`` read-only beneath the root, never following links.

        ``O_NONBLOCK`` keeps a FIFO from blocking the open; callers must ``fstat`` and
        check the type. Raises ``OSError`` (this is the ignore-file opener).
        """
        parts = tuple(p for p in rel.split("/") if p not in ("", "."))
        if not parts or ".." in parts:
            raise IsADirectoryError(errno.EISDIR, "not a file", rel)
        dir_fd = self.open_dir(parts[:-1])
        try:
            return os.open(parts[-1], _FILE_FLAGS, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
