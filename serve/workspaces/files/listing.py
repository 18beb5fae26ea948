"""Workspace metadata and listing: ``stat``, ``list_dir``, ``glob``.

Theory of operation
-------------------
Synchronous functions (run them in a worker thread), resolving through
:meth:`~serve.workspaces.files.paths.Workspace.resolve` and reading directories through
descriptors opened beneath the root without following symlinks. ``stat`` has ``lstat``
semantics: the last component is reported as ``symlink`` and never followed (so a link to
outside reveals only that it exists, which ``list_dir`` shows anyway). ``list_dir`` and
``glob`` never follow symlinked directories; entries carry the ``.gitignore`` verdict of
:mod:`serve.workspaces.files.gitignore`, and ignored entries are left out unless asked for.

Bounds: ``list_dir`` returns at most :data:`MAX_LIST_ENTRIES` entries and scans at most
:data:`MAX_LIST_SCAN_ENTRIES`; ``glob`` returns at most ``maxResults`` (≤
:data:`MAX_GLOB_RESULTS`), looks at most at :data:`MAX_GLOB_VISITED_ENTRIES` directory
entries, descends at most :data:`MAX_GLOB_DEPTH` levels, and holds one descriptor per
level; hitting any bound sets ``truncated`` rather than failing.
"""

from __future__ import annotations

import os
import re
import stat as stat_mod
import time
from typing import Final

from serve.workspaces.files.errors import WorkspaceFsError, from_os_error, make_error
from serve.workspaces.files.gitignore import MAX_PATTERN_BYTES, expand_braces, translate_glob
from serve.workspaces.files.paths import ResolvedPath, Workspace
from serve.workspaces.files.results import (
    EntryKind,
    GlobResult,
    ListEntry,
    ListResult,
    StatResult,
    int_arg,
    str_arg,
)

__all__ = [
    "DEFAULT_GLOB_RESULTS",
    "MAX_GLOB_DEPTH",
    "MAX_GLOB_PATTERN_BYTES",
    "MAX_GLOB_RESULTS",
    "MAX_GLOB_VISITED_ENTRIES",
    "MAX_LIST_ENTRIES",
    "MAX_LIST_SCAN_ENTRIES",
    "glob",
    "list_dir",
    "stat",
]

#: Largest number of entries one ``list_dir`` returns, and directory entries it scans.
MAX_LIST_ENTRIES: Final = 2000
MAX_LIST_SCAN_ENTRIES: Final = 100_000
#: Default and largest ``maxResults`` of ``glob``.
DEFAULT_GLOB_RESULTS: Final = 5000
MAX_GLOB_RESULTS: Final = 50_000
#: Directory entries one ``glob`` may look at, directory depth it descends, pattern bytes.
MAX_GLOB_VISITED_ENTRIES: Final = 200_000
MAX_GLOB_DEPTH: Final = 64
MAX_GLOB_PATTERN_BYTES: Final = MAX_PATTERN_BYTES

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_GLOB_PRUNED_DIRS: Final = frozenset({".git", "node_modules"})
_GLOB_META: Final = frozenset("*?[{\\")


def _entry_kind(entry: os.DirEntry[str]) -> EntryKind:
    try:
        if entry.is_symlink():
            return "symlink"
        if entry.is_dir(follow_symlinks=False):
            return "directory"
        if entry.is_file(follow_symlinks=False):
            return "file"
    except OSError:
        pass
    return "other"


def _kind_of_mode(mode: int) -> EntryKind:
    if stat_mod.S_ISLNK(mode):
        return "symlink"
    if stat_mod.S_ISDIR(mode):
        return "directory"
    if stat_mod.S_ISREG(mode):
        return "file"
    return "other"


def stat(ws: Workspace, path: str) -> StatResult:
    """``lstat`` a workspace path (``GET /stat``); the last component is not followed."""
    rp = ws.resolve(path, follow_symlinks=False)
    dir_fd = ws.open_dir(rp.parts[:-1])
    try:
        if rp.parts:
            st = os.stat(rp.name, dir_fd=dir_fd, follow_symlinks=False)
        else:
            st = os.fstat(dir_fd)
    except FileNotFoundError:
        raise make_error("path_not_found", f"path {rp.relative!r} does not exist") from None
    except OSError as err:
        raise from_os_error(err, rp.relative, "stat") from None
    finally:
        os.close(dir_fd)
    return StatResult(
        path=rp.relative,
        type=_kind_of_mode(st.st_mode),
        size_bytes=st.st_size,
        modified_ms=st.st_mtime_ns // 1_000_000,
    )


def list_dir(
    ws: Workspace,
    path: str = ".",
    *,
    include_ignored: bool = False,
    max_entries: int = MAX_LIST_ENTRIES,
) -> ListResult:
    """List one directory (``GET /list``), entries sorted by name; symlinks not followed.

    Ignored entries are left out unless ``include_ignored``; ``truncated`` when more than
    ``max_entries`` (≤ :data:`MAX_LIST_ENTRIES`) qualify or more than
    :data:`MAX_LIST_SCAN_ENTRIES` had to be scanned.
    """
    cap = int_arg("maxEntries", max_entries, 1, MAX_LIST_ENTRIES)
    rp = ws.resolve(path)
    dir_fd = ws.open_dir(rp.parts)
    snapshot = ws.ignore.snapshot()
    prefix = "" if not rp.parts else rp.relative + "/"
    entries: list[ListEntry] = []
    truncated = False
    try:
        with os.scandir(dir_fd) as it:
            for scanned, entry in enumerate(it, start=1):
                if scanned > MAX_LIST_SCAN_ENTRIES:
                    truncated = True
                    break
                kind = _entry_kind(entry)
                verdict = snapshot.match(prefix + entry.name, kind == "directory")
                if verdict is not None and not include_ignored:
                    continue
                if len(entries) >= cap:
                    truncated = True
                    break
                entries.append(ListEntry(entry.name, kind, verdict is not None))
    except OSError as err:
        raise from_os_error(err, rp.relative, "list") from None
    finally:
        os.close(dir_fd)
    entries.sort(key=lambda e: e.name)
    return ListResult(
        path=rp.relative,
        entries=tuple(entries),
        truncated=truncated,
        matched_ignore=snapshot.match(rp.relative, True),
    )


def _compile_glob(pattern: object) -> tuple[str, list[re.Pattern[str]], tuple[str, ...]]:
    """Validate a glob pattern: (pattern, regexes, literal leading directory parts)."""
    text = str_arg("pattern", pattern)
    if not text or len(text.encode(errors="surrogatepass")) > MAX_GLOB_PATTERN_BYTES:
        raise make_error(
            "parse_error", f"pattern must be 1 to {MAX_GLOB_PATTERN_BYTES} bytes (UTF-8)"
        )
    if any(ord(c) < 0x20 or c == "\x7f" for c in text):
        raise make_error("parse_error", "pattern contains control characters")
    if text.startswith(("/", "\\")) or re.match(r"[A-Za-z]:[\\/]", text):
        raise make_error(
            "parse_error",
            f"glob pattern must be workspace-relative: {text!r}",
            'pass a relative pattern such as "src/**/*.py"',
        )
    if ".." in re.split(r"[\\/]", text):
        raise make_error("parse_error", f"glob pattern may not contain '..' segments: {text!r}")
    try:
        alternatives = expand_braces(text)
    except ValueError as err:
        raise make_error("parse_error", f"glob pattern: {err}") from None
    cleaned = [alt[2:] if alt.startswith("./") else alt for alt in alternatives]
    regexes = [re.compile(translate_glob(alt), re.DOTALL) for alt in cleaned]
    split = [alt.split("/")[:-1] for alt in cleaned]
    prefix: list[str] = []
    for column in zip(*split, strict=False):
        name = column[0]
        if any(part != name for part in column) or name in ("", ".") or _GLOB_META & set(name):
            break
        prefix.append(name)
    return text, regexes, tuple(prefix)


def glob(
    ws: Workspace,
    pattern: str,
    *,
    cwd: str | None = None,
    include_ignored: bool = False,
    max_results: int = DEFAULT_GLOB_RESULTS,
) -> GlobResult:
    """Match a glob under ``cwd`` (default the root) (``GET /glob``).

    Syntax: ``*``, ``?``, ``[...]``, ``**`` (any depth), ``{a,b}``; dot files match. The
    pattern is matched against paths relative to ``cwd``; ``matches`` are
    workspace-relative and include directories. The walk never follows symlinked
    directories and never enters ``.git`` or ``node_modules``; ignored entries are
    skipped (and ignored directories pruned) unless ``include_ignored``. A symlink that
    matches is listed only if its target is inside the workspace. ``truncated`` when
    ``max_results`` (≤ :data:`MAX_GLOB_RESULTS`) or a walk bound
    (:data:`MAX_GLOB_VISITED_ENTRIES`, :data:`MAX_GLOB_DEPTH`) cut the walk short.
    """
    started = time.monotonic()
    text, regexes, literal = _compile_glob(pattern)
    cap = int_arg("maxResults", max_results, 1, MAX_GLOB_RESULTS)
    if cwd is None or cwd == "":
        base = ws.resolve(".")
        cwd_echo = ""
    else:
        base = ws.resolve(str_arg("cwd", cwd))
        cwd_echo = base.relative
        os.close(ws.open_dir(base.parts))  # cwd must be a directory (else parse_error)
    matches: list[str] = []
    truncated = False
    start_rel = "/".join(literal)
    try:
        start = ws.resolve("/".join((*base.parts, *literal)) or ".") if literal else base
    except WorkspaceFsError as err:
        if err.kind != "path_not_found":
            raise
        start = None
    if start is not None:
        truncated = _glob_walk(ws, start, start_rel, regexes, include_ignored, cap, matches)
    return GlobResult(
        pattern=text,
        cwd=cwd_echo,
        matches=tuple(matches),
        count=len(matches),
        truncated=truncated,
        duration_ms=int((time.monotonic() - started) * 1000),
    )


def _scan_sorted(fd: int, budget: int) -> tuple[list[os.DirEntry[str]], bool]:
    """Up to ``budget`` entries of a directory, in reverse name order (for ``pop``)."""
    out: list[os.DirEntry[str]] = []
    exhausted = False
    with os.scandir(fd) as it:
        for entry in it:
            if len(out) >= budget:
                exhausted = True
                break
            out.append(entry)
    out.sort(key=lambda e: e.name, reverse=True)
    return out, exhausted


def _glob_walk(
    ws: Workspace,
    start: ResolvedPath,
    start_rel: str,
    regexes: list[re.Pattern[str]],
    include_ignored: bool,
    cap: int,
    matches: list[str],
) -> bool:
    """Depth-first walk from ``start``; appends matches; returns ``truncated``."""
    snapshot = ws.ignore.snapshot()
    if not include_ignored and snapshot.match(start.relative, True) is not None:
        return False
    try:
        root_fd = ws.open_dir(start.parts)
    except WorkspaceFsError as err:
        if err.kind in ("parse_error", "path_not_found"):
            return False
        raise
    ws_prefix = "" if not start.parts else start.relative + "/"
    rel_prefix = start_rel + "/" if start_rel else ""
    truncated = False
    budget = MAX_GLOB_VISITED_ENTRIES
    stack: list[tuple[int, str, str, list[os.DirEntry[str]]]] = []
    try:
        entries, exhausted = _scan_sorted(root_fd, budget)
        budget -= len(entries)
        truncated |= exhausted
        stack.append((root_fd, ws_prefix, rel_prefix, entries))
        while stack:
            fd, ws_pre, rel_pre, pending = stack[-1]
            if not pending:
                os.close(fd)
                stack.pop()
                continue
            entry = pending.pop()
            kind = _entry_kind(entry)
            ws_rel = ws_pre + entry.name
            if not include_ignored and snapshot.match(ws_rel, kind == "directory"):
                continue
            rel = rel_pre + entry.name
            if any(regex.fullmatch(rel) for regex in regexes) and _glob_hit_ok(ws, ws_rel, kind):
                if len(matches) >= cap:
                    return True
                matches.append(ws_rel)
            if kind != "directory" or entry.name in _GLOB_PRUNED_DIRS:
                continue
            if len(stack) >= MAX_GLOB_DEPTH or budget <= 0:
                truncated = True
                continue
            try:
                child = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue
            try:
                entries, exhausted = _scan_sorted(child, budget)
            except OSError:
                os.close(child)
                continue
            budget -= len(entries)
            truncated |= exhausted
            stack.append((child, ws_rel + "/", rel + "/", entries))
    except OSError as err:
        raise from_os_error(err, start.relative, "walk") from None
    finally:
        for fd, *_ in stack:
            os.close(fd)
    return truncated


def _glob_hit_ok(ws: Workspace, ws_rel: str, kind: EntryKind) -> bool:
    if kind != "symlink":
        return True
    try:
        ws.resolve(ws_rel, must_exist=False)
    except WorkspaceFsError:
        return False
    return True
