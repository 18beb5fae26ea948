"""A small `.gitignore` matcher, and the glob→regex translation the file routes share.

Theory of operation
-------------------
Pure part (no I/O): :func:`parse_gitignore` turns a file's text into
:class:`IgnoreRule`\\s, each a compiled regex over a path relative to the directory that
holds the ignore file; :func:`translate_glob` and :func:`expand_braces` are shared with
``GET /glob``. Supported syntax (gitignore(5)): blank and ``#`` lines, ``\\#``/``\\!``
escapes, trailing-space trimming (unless escaped), ``!`` negation, trailing ``/``
(directories only), anchoring (a ``/`` at the start or in the middle ties the pattern to
the ignore file's directory; otherwise it matches a name at any depth), ``*``, ``?``,
``[...]``/``[!...]`` (never matching ``/``), leading ``**/``, inner ``/**/`` and trailing
``/**``; a line longer than :data:`MAX_PATTERN_BYTES` is skipped. Matching never backtracks
more than linearly (:func:`translate_glob`), so no pattern can stall a worker. Not
supported: ``core.excludesFile`` and the global ignore file (a daemon must not depend on
its user's home directory).

I/O part: :class:`IgnoreRules` is bound to a workspace through an ``opener`` callable that
opens a workspace-relative file *beneath the root without following symlinks* and returns
a descriptor (see :meth:`serve.workspaces.files.paths.Workspace.open_file`). Sources, lowest
precedence first: ``.git/info/exclude``, the root ``.gitignore``, the root
``.qwenignore``, then each nested directory's ``.gitignore`` (deeper overrides
shallower); within the sources, the last matching rule wins. As in git, a path inside an
ignored directory is ignored whatever later rules say (no re-inclusion below an excluded
directory), and ``.git`` is always ignored. Verdicts:

* ``"directory"``: the path is an ignored directory or lies inside one;
* ``"file"``: the path itself (not a directory) matched;
* ``None``: not ignored.

Parsed files are cached, keyed by (inode, mtime, size) so an edited ``.gitignore`` takes
effect on the next call; the cache holds at most :data:`MAX_CACHED_IGNORE_FILES` entries
and each file is read up to :data:`MAX_IGNORE_FILE_BYTES`. Per-operation work goes through
an :class:`IgnoreSnapshot` (memoises directory verdicts for one list/glob). Thread-safe:
the cache is guarded by a lock because the file functions run in worker threads.
A missing or unreadable ignore file counts as empty (ignore rules never fail a request).
"""

from __future__ import annotations

import os
import re
import stat as stat_mod
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Final, Literal

import msgspec

from serve.workspaces.files.errors import WorkspaceFsError

__all__ = [
    "MAX_BRACE_EXPANSIONS",
    "MAX_CACHED_IGNORE_FILES",
    "MAX_IGNORE_FILE_BYTES",
    "MAX_PATTERN_BYTES",
    "IgnoreRule",
    "IgnoreRules",
    "IgnoreSnapshot",
    "IgnoreVerdict",
    "expand_braces",
    "parse_gitignore",
    "translate_glob",
]

IgnoreVerdict = Literal["file", "directory"] | None

#: Bytes read from one ignore file; the rest is ignored (1 MiB).
MAX_IGNORE_FILE_BYTES: Final = 1024 * 1024
#: Parsed ignore files kept in the cache (entries).
MAX_CACHED_IGNORE_FILES: Final = 4096
#: Alternatives a single glob pattern may expand to through ``{a,b}`` braces.
MAX_BRACE_EXPANSIONS: Final = 64
#: Largest glob pattern (UTF-8 bytes): ``GET /glob`` refuses a longer one, an ignore file's
#: longer line is skipped. Matching costs O(path length × pattern length) (see
#: :func:`translate_glob`), so this bounds one match.
MAX_PATTERN_BYTES: Final = 1024

_ALWAYS_IGNORED_DIRS: Final = frozenset({".git"})
_ROOT_SOURCES: Final = (".git/info/exclude", ".gitignore", ".qwenignore")


class IgnoreRule(msgspec.Struct, frozen=True):
    """One parsed line: ``regex`` full-matches a path relative to the rule's directory."""

    pattern: str
    negated: bool
    dir_only: bool
    regex: re.Pattern[str]


def _translate_class(pat: str, i: int) -> tuple[str, int] | None:
    """Translate ``[...]`` starting at ``pat[i] == '['``; None if it never closes."""
    j = i + 1
    negate = j < len(pat) and pat[j] in "!^"
    if negate:
        j += 1
    body: list[str] = []
    first = True
    while j < len(pat):
        c = pat[j]
        if c == "]" and not first:
            inner = "".join(body)
            return ("[^/" + inner + "]" if negate else "(?!/)[" + inner + "]"), j + 1
        first = False
        if c == "\\" and j + 1 < len(pat):
            body.append(re.escape(pat[j + 1]))
            j += 2
            continue
        body.append(c if c == "-" else re.escape(c))
        j += 1
    return None


_SLASH: Final = "/"
_STAR: Final = "*"
_GLOBSTAR_DIR: Final = "**/"  # zero or more whole segments, each with its "/"
_GLOBSTAR_END: Final = "**"  # a trailing "**": anything


def _glob_tokens(pat: str) -> list[tuple[str, str]]:
    """``(kind, regex)`` tokens: one-character atoms (kind ``""``) and the markers above."""
    out: list[tuple[str, str]] = []
    i, n = 0, len(pat)
    while i < n:
        c = pat[i]
        if c == "*":
            j = i
            while j < n and pat[j] == "*":
                j += 1
            if j - i >= 2 and (i == 0 or pat[i - 1] == "/") and (j == n or pat[j] == "/"):
                out.append((_GLOBSTAR_END, ".*") if j == n else (_GLOBSTAR_DIR, ""))
                i = j if j == n else j + 1
                continue
            out.append((_STAR, ""))
            i = j
        elif c == "?":
            out.append(("", "[^/]"))
            i += 1
        elif c == "[":
            translated = _translate_class(pat, i)
            if translated is None:
                out.append(("", re.escape(c)))
                i += 1
            else:
                out.append(("", translated[0]))
                i = translated[1]
        elif c == "/" or (c == "\\" and i + 1 < n and pat[i + 1] == "/"):
            out.append((_SLASH, "/"))
            i += 1 if c == "/" else 2
        elif c == "\\" and i + 1 < n:
            out.append(("", re.escape(pat[i + 1])))
            i += 2
        else:
            out.append(("", re.escape(c)))
            i += 1
    return out


def _segment_source(tokens: list[tuple[str, str]]) -> str:
    """One path segment: pieces of fixed width between ``*``s (see :func:`translate_glob`)."""
    pieces: list[str] = [""]
    for kind, regex in tokens:
        if kind == _STAR:
            pieces.append("")
        else:
            pieces[-1] += regex
    if len(pieces) == 1:
        return pieces[0]
    middle = "".join(f"(?>[^/]*?{piece})" for piece in pieces[1:-1])
    return pieces[0] + middle + "[^/]*" + pieces[-1]


def _block_source(tokens: list[tuple[str, str]]) -> str:
    segments: list[list[tuple[str, str]]] = [[]]
    for token in tokens:
        if token[0] == _SLASH:
            segments.append([])
        else:
            segments[-1].append(token)
    return "/".join(_segment_source(segment) for segment in segments)


def translate_glob(pat: str) -> str:
    """Regex source (for ``fullmatch``) for a gitignore-style glob over ``/`` paths.

    The regex cannot backtrack more than linearly, whatever the pattern (a glob such as
    ``*?*?*?*?*?*?*?*?*?*Q`` took CPython's ``re`` minutes on a 40-character name, holding the
    GIL). Within a segment the pattern is fixed-width pieces between ``*``s; matching each
    middle piece at its leftmost place is always right (the ``*`` after it takes up the
    rest), so each is an atomic group ``(?>[^/]*?piece)`` that is never re-entered; only the
    last piece, pinned to the segment's end, is free. Likewise a block of segments between two
    ``**/`` is matched at its leftmost place (the next ``**/`` takes up whole segments) in an
    atomic group, and only the last block is free. A match then costs O(path × pattern)."""
    blocks: list[list[tuple[str, str]]] = [[]]
    for token in _glob_tokens(pat):
        if token[0] == _GLOBSTAR_DIR:
            blocks.append([])
        else:
            blocks[-1].append(token)
    out = [_block_source(blocks[0])]
    for k, block in enumerate(blocks[1:], start=1):
        source = "(?:[^/]*/)*?" + _block_source(block)
        out.append(source if k == len(blocks) - 1 else f"(?>{source})")
    return "".join(out)


def _find_brace(pat: str) -> tuple[int, int, list[str]] | None:
    """First top-level ``{a,b}`` group: (start, end, alternatives)."""
    i = 0
    while i < len(pat):
        c = pat[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth, j, alts, last = 1, i + 1, [], i + 1
            while j < len(pat) and depth:
                d = pat[j]
                if d == "\\":
                    j += 2
                    continue
                if d == "{":
                    depth += 1
                elif d == "}":
                    depth -= 1
                    if depth == 0:
                        alts.append(pat[last:j])
                        if len(alts) > 1:
                            return i, j, alts
                        break
                elif d == "," and depth == 1:
                    alts.append(pat[last:j])
                    last = j + 1
                j += 1
        i += 1
    return None


def expand_braces(pat: str, limit: int = MAX_BRACE_EXPANSIONS) -> list[str]:
    """Expand ``{a,b}`` groups (nested allowed); ValueError past ``limit`` results."""
    found = _find_brace(pat)
    if found is None:
        return [pat]
    start, end, alts = found
    out: list[str] = []
    for alt in alts:
        for expanded in expand_braces(pat[:start] + alt + pat[end + 1 :], limit):
            out.append(expanded)
            if len(out) > limit:
                raise ValueError(f"pattern expands to more than {limit} alternatives")
    return out


def parse_gitignore(text: str) -> tuple[IgnoreRule, ...]:
    """Parse the text of one ignore file (rules in file order)."""
    rules: list[IgnoreRule] = []
    for raw in text.splitlines():
        line = raw.rstrip("\r")
        while line.endswith(" ") and not line.endswith("\\ "):
            line = line[:-1]
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        if negated:
            line = line[1:]
        dir_only = line.endswith("/") and not line.endswith("\\/")
        if dir_only:
            line = line.rstrip("/")
        anchored = "/" in line
        line = line.lstrip("/")
        if not line or len(line.encode()) > MAX_PATTERN_BYTES:
            continue
        source = translate_glob(line if anchored else "**/" + line)
        try:
            regex = re.compile(source, re.DOTALL)
        except re.error:
            continue
        rules.append(IgnoreRule(raw, negated, dir_only, regex))
    return tuple(rules)


def _ancestors(rel: str) -> Iterator[str]:
    """Proper ancestor directories of ``rel``, outermost first ("a", "a/b" for "a/b/c")."""
    parts = rel.split("/")
    for k in range(1, len(parts)):
        yield "/".join(parts[:k])


class IgnoreRules:
    """Ignore rules of one workspace, read lazily through ``opener`` (see module doc)."""

    def __init__(self, opener: Callable[[str], int]) -> None:
        self._opener = opener
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[tuple[int, int, int], tuple[IgnoreRule, ...]]] = {}

    def snapshot(self) -> IgnoreSnapshot:
        """A per-operation view that memoises directory verdicts."""
        return IgnoreSnapshot(self)

    def match(self, rel: str, is_dir: bool) -> IgnoreVerdict:
        """Verdict for one workspace-relative POSIX path (``"."``/``""`` is never ignored)."""
        return self.snapshot().match(rel, is_dir)

    def rules_in(self, rel_file: str) -> tuple[IgnoreRule, ...]:
        """Parsed rules of the ignore file at ``rel_file`` (empty when absent)."""
        try:
            fd = self._opener(rel_file)
        except (OSError, ValueError, WorkspaceFsError):
            return ()
        try:
            st = os.fstat(fd)
            if not stat_mod.S_ISREG(st.st_mode):
                return ()
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
            with self._lock:
                cached = self._cache.get(rel_file)
            if cached is not None and cached[0] == key:
                return cached[1]
            chunks: list[bytes] = []
            remaining = MAX_IGNORE_FILE_BYTES
            while remaining > 0:
                chunk = os.read(fd, min(remaining, 64 * 1024))
                if not chunk:
                    break
                chunks.append(chunk)
                remaining -= len(chunk)
        except OSError:
            return ()
        finally:
            os.close(fd)
        rules = parse_gitignore(b"".join(chunks).decode("utf-8", errors="replace"))
        with self._lock:
            if len(self._cache) >= MAX_CACHED_IGNORE_FILES:
                self._cache.pop(next(iter(self._cache)))
            self._cache[rel_file] = (key, rules)
        return rules


class IgnoreSnapshot:
    """Verdicts for one operation; memoises ignore files and ancestor-directory results."""

    def __init__(self, rules: IgnoreRules) -> None:
        self._rules = rules
        self._sources: dict[str, Sequence[tuple[str, tuple[IgnoreRule, ...]]]] = {}
        self._dirs: dict[str, bool] = {}

    def _sources_for(self, directory: str) -> Sequence[tuple[str, tuple[IgnoreRule, ...]]]:
        """(base dir, rules) pairs that apply inside ``directory``, lowest precedence first."""
        cached = self._sources.get(directory)
        if cached is not None:
            return cached
        if "" not in self._sources:
            self._sources[""] = [("", self._rules.rules_in(name)) for name in _ROOT_SOURCES]
        result = self._sources[""]
        for ancestor in [*_ancestors(directory), directory] if directory else []:
            known = self._sources.get(ancestor)
            if known is None:
                known = [*result, (ancestor, self._rules.rules_in(ancestor + "/.gitignore"))]
                self._sources[ancestor] = known
            result = known
        return result

    def _matches_self(self, rel: str, is_dir: bool) -> bool:
        ignored = False
        for base, rules in self._sources_for(rel.rpartition("/")[0]):
            sub = rel[len(base) + 1 :] if base else rel
            for rule in rules:
                if rule.dir_only and not is_dir:
                    continue
                if rule.regex.fullmatch(sub):
                    ignored = not rule.negated
        return ignored

    def _dir_ignored(self, rel: str) -> bool:
        """True when directory ``rel`` is ignored itself or lies inside an ignored one."""
        cached = self._dirs.get(rel)
        if cached is not None:
            return cached
        ignored = False
        for directory in [*_ancestors(rel), rel]:
            known = self._dirs.get(directory)
            if known is None:
                known = ignored or (
                    directory.rpartition("/")[2] in _ALWAYS_IGNORED_DIRS
                    or self._matches_self(directory, True)
                )
                self._dirs[directory] = known
            ignored = known
        return ignored

    def match(self, rel: str, is_dir: bool) -> IgnoreVerdict:
        """Verdict for a workspace-relative POSIX path (see the module docstring)."""
        if rel in ("", "."):
            return None
        parent = rel.rpartition("/")[0]
        if parent and self._dir_ignored(parent):
            return "directory"
        if is_dir:
            return "directory" if self._dir_ignored(rel) else None
        return "file" if self._matches_self(rel, False) else None
