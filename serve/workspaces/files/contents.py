"""Workspace file contents: read, read bytes, write, overwrite, edit (+ listing re-exports).

Theory of operation
-------------------
Synchronous functions over a :class:`~serve.workspaces.files.paths.Workspace`; the HTTP routes
and the ACP ``fs/*`` handlers call them through ``trio.to_thread.run_sync`` (they block on
disk). Each one resolves its path through :meth:`Workspace.resolve`, then acts through
descriptors opened *beneath the root without following symlinks*
(:mod:`serve.workspaces.files.leaf`: :meth:`Workspace.open_dir` + ``openat``-style calls
with ``dir_fd``), so a symlink swapped in after resolution fails the operation instead of
escaping. Results are frozen
``msgspec`` Structs whose encoded form is the spec's response body (``kind`` included,
camelCase names); failures raise :class:`~serve.workspaces.files.errors.WorkspaceFsError`.

Reads are snapshots: the file is read through one descriptor and ``fstat``-ed before and
after; a change in between (an in-place write by another process) is ``hash_mismatch``.
``hash`` is always ``sha256:<hex>`` of the whole file's raw bytes. Text reads refuse
binary files (``binary_file``) and files over :data:`MAX_TEXT_READ_BYTES`, or over
:data:`MAX_TEXT_SCAN_BYTES` when a line ``limit`` asks for a window (``file_too_large``).

Writes (:func:`write_text`, :func:`overwrite_text`, :func:`edit_text`) run under the
workspace's per-path ``threading.Lock`` (:class:`~serve.workspaces.files.locks.PathLocks`), so the
daemon's writers of one file are serialised; each one:

1. re-reads the current file through the parent-directory descriptor and checks the
   caller's ``expectedHash`` (stale → ``hash_mismatch``);
2. writes the encoded bytes to a fresh temporary file in the *same directory*
   (``O_EXCL|O_NOFOLLOW``, the target's permission bits applied before any content),
   ``fsync``\\s it;
3. re-checks the target's hash immediately before publishing (closes most of the window
   against writers outside the daemon; it is not a kernel compare-and-swap);
4. publishes atomically: ``rename`` for replace/overwrite, ``link`` (fails if the name
   exists) for create, then ``fsync``\\s the directory. On any failure the temporary file
   is removed. Readers see the old bytes or the new bytes, never a torn file; of two
   writers holding the same hash, exactly one wins and the other gets ``hash_mismatch``.

Writes keep the file's profile unless overridden: encoding, BOM, and line endings (a
pure-LF or pure-CRLF file keeps its style, whatever the client sent; a mixed or
single-line file gets the content as sent). Edits change only the replaced span, byte for
byte; in a pure-CRLF file ``newText``'s bare LFs become CRLF, and an ``oldText`` written
with bare LFs still matches its CRLF spelling. Permission bits are preserved (without
setuid/setgid); ownership becomes the daemon's, as with any editor that saves by rename.

Limits are the named constants below (units in the names). Trust: write/overwrite/edit
raise ``untrusted_workspace`` in an untrusted workspace; reads never do.
"""

from __future__ import annotations

import base64
import errno
import os
import secrets
import stat as stat_mod
from typing import Final

import msgspec

from serve.workspaces.files.errors import WorkspaceFsError, from_os_error, make_error
from serve.workspaces.files.leaf import (
    changed,
    hash_leaf,
    lstat_leaf,
    open_regular,
    parent_dir,
    read_leaf,
    swapped,
    too_large,
)
from serve.workspaces.files.listing import glob, list_dir, stat
from serve.workspaces.files.paths import ResolvedPath, Workspace
from serve.workspaces.files.results import (
    EditResult,
    ReadBytesResult,
    ReadTextResult,
    WriteResult,
    hash_arg,
    hash_bytes,
    int_arg,
    is_content_hash,
    str_arg,
)
from serve.workspaces.files.textio import (
    LineEnding,
    apply_line_ending,
    decode_text,
    encode_text,
    looks_binary,
    normalize_encoding,
    supports_bom,
    wire_line_ending,
)

__all__ = [
    "DEFAULT_BYTES_WINDOW",
    "MAX_BYTES_WINDOW",
    "MAX_EDIT_SOURCE_BYTES",
    "MAX_READ_LINES",
    "MAX_TEXT_READ_BYTES",
    "MAX_TEXT_SCAN_BYTES",
    "MAX_WRITE_BYTES",
    "edit_text",
    "glob",
    "hash_bytes",
    "is_content_hash",
    "list_dir",
    "overwrite_text",
    "read_bytes",
    "read_text",
    "stat",
    "write_text",
]

KIB: Final = 1024
MIB: Final = 1024 * KIB

#: Largest file ``read_text`` returns whole, and the largest ``maxBytes`` (256 KiB).
MAX_TEXT_READ_BYTES: Final = 256 * KIB
#: Largest file ``read_text`` scans for a ``line``/``limit`` window (8 MiB).
MAX_TEXT_SCAN_BYTES: Final = 8 * MIB
#: Largest ``limit`` (lines) of one text read.
MAX_READ_LINES: Final = 2000
#: Largest file an ACP agent may read through ``fs/read_text_file`` (64 MiB, as ACP's
#: reference client allows for base64-heavy content).
MAX_AGENT_READ_BYTES: Final = 64 * 1024 * 1024
#: Largest and default ``maxBytes`` of ``read_bytes`` (256 KiB, 64 KiB).
MAX_BYTES_WINDOW: Final = 256 * KIB
DEFAULT_BYTES_WINDOW: Final = 64 * KIB
#: Largest encoded file ``write_text``/``overwrite_text``/``edit_text`` produce (5 MiB).
MAX_WRITE_BYTES: Final = 5 * MIB
#: Largest existing file ``replace``/``edit`` will read back (5 MiB).
MAX_EDIT_SOURCE_BYTES: Final = 5 * MIB

_MAX_OFFSET: Final = 2**63 - 1
_MAX_LINE: Final = 2**31 - 1
_TEMP_PREFIX: Final = ".acp-serve-"
_LINK_UNSUPPORTED: Final = frozenset(
    {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS}
)

# -- reads --------------------------------------------------------------------------------


def _utf8_prefix(text: str, max_bytes: int) -> tuple[str, int, bool]:
    """Longest prefix of ``text`` within ``max_bytes`` UTF-8 bytes, cut on a code point."""
    encoded = text.encode("utf-8")
    if len(encoded) <= max_bytes:
        return text, len(encoded), False
    cut = encoded[:max_bytes].decode("utf-8", errors="ignore")
    return cut, len(cut.encode("utf-8")), True


def _split_lines(text: str) -> list[str]:
    """Lines with their ``\\n`` (and any ``\\r`` before it); no empty line after a final break."""
    pieces = text.split("\n")
    lines = [piece + "\n" for piece in pieces[:-1]]
    if pieces[-1]:
        lines.append(pieces[-1])
    return lines


def read_text(
    ws: Workspace,
    path: str,
    *,
    max_bytes: int | None = None,
    line: int | None = None,
    limit: int | None = None,
    agent: bool = False,
) -> ReadTextResult:
    """Read a text file (``GET /file``, ACP ``fs/read_text_file``).

    ``agent``: the caller is an ACP agent (``fs/read_text_file``), which expects the whole
    file or any window it asks for: the file may be up to :data:`MAX_AGENT_READ_BYTES` and
    ``limit`` is not capped at :data:`MAX_READ_LINES` (the HTTP route keeps its caps).

    ``line`` (1-based) and ``limit`` (lines, ≤ :data:`MAX_READ_LINES`) select a window;
    each returned line keeps its own line break. ``max_bytes`` (≤
    :data:`MAX_TEXT_READ_BYTES`, the default) caps the UTF-8 size of ``content``, cut on a
    code point. ``truncated``/``hasMore``: content stops before the end of the file.
    ``originalLineCount`` is the file's line count when a window was asked for, else None.
    ``lineEnding``, ``encoding``, ``bom`` and ``hash`` describe the whole file.
    """
    read_cap = MAX_AGENT_READ_BYTES if agent else MAX_TEXT_READ_BYTES
    cap_bytes = read_cap if max_bytes is None else int_arg("maxBytes", max_bytes, 1, read_cap)
    first = 1 if line is None else int_arg("line", line, 1, _MAX_LINE)
    max_lines = _MAX_LINE if agent else MAX_READ_LINES
    count = None if limit is None else int_arg("limit", limit, 1, max_lines)
    rp = ws.resolve(path)
    if agent:
        cap_file = MAX_AGENT_READ_BYTES
    else:
        cap_file = MAX_TEXT_SCAN_BYTES if count is not None else MAX_TEXT_READ_BYTES
    with parent_dir(ws, rp) as pfd:
        raw, _ = read_leaf(
            pfd,
            rp,
            cap_file,
            "read a window with line/limit, or raw bytes with GET /file/bytes",
        )
    if looks_binary(raw):
        raise make_error("binary_file", f"{rp.relative!r} is a binary file", "use GET /file/bytes")
    decoded = decode_text(raw)
    original_line_count: int | None = None
    if line is None and limit is None:
        window, more_lines = decoded.text, False
    else:
        lines = _split_lines(decoded.text)
        original_line_count = len(lines)
        start = first - 1
        end = len(lines) if count is None else start + count
        window = "".join(lines[start:end])
        more_lines = end < len(lines)
    content, returned, cut = _utf8_prefix(window, cap_bytes)
    more = cut or more_lines
    return ReadTextResult(
        path=rp.relative,
        content=content,
        encoding=decoded.encoding,
        bom=decoded.bom,
        line_ending=decoded.line_ending,
        size_bytes=len(raw),
        returned_bytes=returned,
        truncated=more,
        hash=hash_bytes(raw),
        matched_ignore=ws.ignore_verdict(rp, False),
        original_line_count=original_line_count,
        next_cursor=None,
        has_more=more,
    )


def read_bytes(
    ws: Workspace, path: str, *, offset: int = 0, max_bytes: int = DEFAULT_BYTES_WINDOW
) -> ReadBytesResult:
    """Read a raw byte window of a regular file (``GET /file/bytes``), base64-encoded.

    ``hash`` is present only when the window is the whole file; a file that changes
    while being read is ``hash_mismatch``; a non-regular file is ``parse_error``.
    """
    start = int_arg("offset", offset, 0, _MAX_OFFSET)
    window = int_arg("maxBytes", max_bytes, 1, MAX_BYTES_WINDOW)
    rp = ws.resolve(path)
    with parent_dir(ws, rp) as pfd:
        fd, st = open_regular(pfd, rp)
        try:
            want = min(window, max(0, st.st_size - start))
            chunks: list[bytes] = []
            position = start
            while want > 0:
                chunk = os.pread(fd, want, position)
                if not chunk:
                    break
                chunks.append(chunk)
                position += len(chunk)
                want -= len(chunk)
            after = os.fstat(fd)
        except OSError as err:
            raise from_os_error(err, rp.relative, "read") from None
        finally:
            os.close(fd)
    if after.st_size != st.st_size or after.st_mtime_ns != st.st_mtime_ns:
        raise changed(rp.relative)
    data = b"".join(chunks)
    whole = start == 0 and len(data) == st.st_size
    return ReadBytesResult(
        path=rp.relative,
        offset=start,
        size_bytes=st.st_size,
        returned_bytes=len(data),
        truncated=not whole,
        content_base64=base64.b64encode(data).decode("ascii"),
        hash=hash_bytes(data) if whole else None,
    )


# -- writes -------------------------------------------------------------------------------


def _publish(
    pfd: int,
    rp: ResolvedPath,
    data: bytes,
    *,
    create: bool,
    expected_hash: str | None,
    perm: int | None,
) -> None:
    """Temp file beside the target, fsync, re-check, atomic publish (module docstring)."""
    tmp = f"{_TEMP_PREFIX}{secrets.token_hex(8)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, 0o600 if perm is not None else 0o666, dir_fd=pfd)
    except OSError as err:
        raise from_os_error(err, rp.relative, "create a temporary file for") from None
    published = False
    try:
        try:
            if perm is not None:
                os.fchmod(fd, perm)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        if create:
            try:
                os.link(tmp, rp.name, src_dir_fd=pfd, dst_dir_fd=pfd, follow_symlinks=False)
            except FileExistsError:
                raise _exists(rp) from None
            except OSError as err:
                if err.errno not in _LINK_UNSUPPORTED:
                    raise
                if lstat_leaf(pfd, rp) is not None:
                    raise _exists(rp) from None
                os.rename(tmp, rp.name, src_dir_fd=pfd, dst_dir_fd=pfd)
                published = True
            else:
                published = True
                try:
                    os.unlink(tmp, dir_fd=pfd)
                except OSError:
                    pass
        else:
            if expected_hash is not None:
                current = hash_leaf(pfd, rp)
                if current != expected_hash:
                    raise _mismatch(expected_hash, current)
            os.rename(tmp, rp.name, src_dir_fd=pfd, dst_dir_fd=pfd)
            published = True
        try:
            os.fsync(pfd)
        except OSError:
            pass
    except OSError as err:
        raise from_os_error(err, rp.relative, "write") from None
    finally:
        if not published:
            try:
                os.unlink(tmp, dir_fd=pfd)
            except OSError:
                pass


def _exists(rp: ResolvedPath) -> WorkspaceFsError:
    return make_error(
        "file_already_exists",
        f"{rp.relative!r} already exists",
        'use mode "replace" with the current expectedHash to overwrite it',
    )


def _mismatch(expected: str, actual: str | None) -> WorkspaceFsError:
    found = actual if actual is not None else "no file"
    return make_error(
        "hash_mismatch",
        f"expected {expected}, found {found}",
        "re-read the file and retry with the latest hash",
    )


class _Profile(msgspec.Struct, frozen=True):
    encoding: str
    bom: bool
    ending: LineEnding | None


def _existing_profile(
    raw: bytes, rel: str, encoding: str | None, bom: bool | None, ending: LineEnding | None
) -> _Profile:
    if looks_binary(raw):
        raise make_error(
            "binary_file",
            f"{rel!r} is a binary file; text writes cannot replace it",
            "binary writes are not supported",
        )
    decoded = decode_text(raw)
    name = encoding or decoded.encoding
    keep_bom = decoded.bom and supports_bom(name)
    kept: LineEnding | None = None
    if decoded.line_style == "lf":
        kept = "lf"
    elif decoded.line_style == "crlf":
        kept = "crlf"
    return _Profile(encoding=name, bom=keep_bom if bom is None else bom, ending=ending or kept)


def _encode(content: str, profile: _Profile) -> tuple[str, bytes]:
    text = apply_line_ending(content, profile.ending) if profile.ending else content
    return text, encode_text(text, profile.encoding, profile.bom)


def _check_size(data: bytes, rel: str) -> None:
    if len(data) > MAX_WRITE_BYTES:
        raise too_large(rel, len(data), MAX_WRITE_BYTES, "write", "write a smaller file")


def _check_content(content: object, rel_hint: str) -> str:
    text = str_arg("content", content)
    if len(text) > MAX_WRITE_BYTES:  # every supported encoding needs ≥ 1 byte per character
        raise too_large(rel_hint, len(text), MAX_WRITE_BYTES, "write", "write a smaller file")
    return text


def write_text(
    ws: Workspace,
    path: str,
    content: str,
    *,
    mode: str,
    expected_hash: str | None = None,
    encoding: str | None = None,
    bom: bool | None = None,
    line_ending: str | None = None,
    create_parents: bool = False,
) -> WriteResult:
    """Create or replace a text file atomically (``POST /file/write``).

    ``mode="create"`` never overwrites (``file_already_exists``); ``mode="replace"`` needs
    ``expected_hash`` (missing or malformed → ``parse_error``; stale → ``hash_mismatch``;
    absent file → ``path_not_found``). ``encoding``/``bom``/``line_ending`` override the
    kept (replace) or default (create: UTF-8, no BOM, content as sent) profile. Missing
    parent directories are ``path_not_found`` unless ``create_parents``.
    """
    ws.require_trusted("write")
    if mode not in ("create", "replace"):
        raise make_error("parse_error", 'mode must be "create" or "replace"')
    expected = hash_arg(expected_hash)
    if mode == "replace" and expected is None:
        raise make_error(
            "parse_error",
            'expectedHash is required when mode is "replace"',
            "read the file first and pass its hash",
        )
    name = None if encoding is None else normalize_encoding(str_arg("encoding", encoding))
    if bom is not None and not isinstance(bom, bool):
        raise make_error("parse_error", "bom must be a boolean")
    if line_ending not in (None, "lf", "crlf"):
        raise make_error("parse_error", 'lineEnding must be "lf" or "crlf"')
    ending: LineEnding | None = (
        None if line_ending is None else "lf" if line_ending == "lf" else "crlf"
    )
    text = _check_content(content, str(path))
    rp = ws.resolve(path, must_exist=False)
    with ws.locks.hold(rp.absolute, rp.relative):
        with parent_dir(ws, rp, create_missing=create_parents) as pfd:
            st = lstat_leaf(pfd, rp)
            if mode == "create":
                if st is not None:
                    if stat_mod.S_ISLNK(st.st_mode):
                        raise swapped(rp.relative)
                    raise _exists(rp)
                profile = _Profile(name or "utf-8", bool(bom), ending)
                perm = None
            else:
                if st is None:
                    raise make_error("path_not_found", f"{rp.relative!r} does not exist")
                raw, st = read_leaf(pfd, rp, MAX_EDIT_SOURCE_BYTES, "replace smaller files")
                actual = hash_bytes(raw)
                if actual != expected:
                    assert expected is not None
                    raise _mismatch(expected, actual)
                profile = _existing_profile(raw, rp.relative, name, bom, ending)
                perm = stat_mod.S_IMODE(st.st_mode) & 0o777
            written, data = _encode(text, profile)
            _check_size(data, rp.relative)
            _publish(pfd, rp, data, create=mode == "create", expected_hash=expected, perm=perm)
    return WriteResult(
        path=rp.relative,
        mode="create" if mode == "create" else "replace",
        created=mode == "create",
        size_bytes=len(data),
        hash=hash_bytes(data),
        encoding=normalize_encoding(profile.encoding),
        bom=profile.bom,
        line_ending=wire_line_ending(written),
        matched_ignore=ws.ignore_verdict(rp, False),
    )


def overwrite_text(
    ws: Workspace, path: str, content: str, *, create_parents: bool = True
) -> WriteResult:
    """Create or overwrite a text file without a hash check (ACP ``fs/write_text_file``).

    Same atomic publish as :func:`write_text`. The existing file's profile is kept when
    it can be read as text (not binary, ≤ :data:`MAX_EDIT_SOURCE_BYTES`, readable); when
    the content cannot be encoded in a kept non-UTF-8 encoding, UTF-8 is written instead
    (an agent has no way to choose). Never exposed as an HTTP mode.
    """
    ws.require_trusted("write")
    text = _check_content(content, str(path))
    rp = ws.resolve(path, must_exist=False)
    default = _Profile("utf-8", False, None)
    with ws.locks.hold(rp.absolute, rp.relative):
        with parent_dir(ws, rp, create_missing=create_parents) as pfd:
            st = lstat_leaf(pfd, rp)
            profile, perm = default, None
            if st is not None:
                if stat_mod.S_ISLNK(st.st_mode):
                    raise swapped(rp.relative)
                if not stat_mod.S_ISREG(st.st_mode):
                    raise make_error("parse_error", f"{rp.relative!r} is not a regular file")
                perm = stat_mod.S_IMODE(st.st_mode) & 0o777
                try:
                    raw, _ = read_leaf(pfd, rp, MAX_EDIT_SOURCE_BYTES, "")
                    profile = _existing_profile(raw, rp.relative, None, None, None)
                except WorkspaceFsError as err:
                    if err.kind not in ("file_too_large", "binary_file", "permission_denied"):
                        raise
            try:
                written, data = _encode(text, profile)
            except WorkspaceFsError:
                if profile.encoding == "utf-8":
                    raise
                profile = _Profile("utf-8", False, profile.ending)
                written, data = _encode(text, profile)
            _check_size(data, rp.relative)
            _publish(pfd, rp, data, create=False, expected_hash=None, perm=perm)
    return WriteResult(
        path=rp.relative,
        mode="overwrite",
        created=st is None,
        size_bytes=len(data),
        hash=hash_bytes(data),
        encoding=profile.encoding,
        bom=profile.bom,
        line_ending=wire_line_ending(written),
        matched_ignore=ws.ignore_verdict(rp, False),
    )


def _occurrences(haystack: str, needle: str) -> tuple[int, int]:
    """(first index or -1, number of possibly overlapping matches, counted up to 2)."""
    first = haystack.find(needle)
    if first == -1:
        return -1, 0
    return first, 1 if haystack.find(needle, first + 1) == -1 else 2


def edit_text(
    ws: Workspace,
    path: str,
    old_text: str,
    new_text: str,
    *,
    expected_hash: str | None = None,
) -> EditResult:
    """Replace the one occurrence of ``old_text`` with ``new_text`` (``POST /file/edit``).

    ``old_text`` must be non-empty (``parse_error``) and occur exactly once, overlapping
    occurrences included (none → ``text_not_found``, several → ``ambiguous_text_match``).
    ``expected_hash``, when given, must match the current bytes (``hash_mismatch``); the
    HTTP route requires it, an internal caller may pass None. Everything outside the
    replaced span is kept byte for byte (encoding, BOM, line endings; see module doc).
    """
    ws.require_trusted("edit")
    old = str_arg("oldText", old_text)
    new = str_arg("newText", new_text)
    if old == "":
        raise make_error(
            "parse_error",
            "oldText must be a non-empty string",
            "an empty oldText would match everywhere",
        )
    expected = hash_arg(expected_hash)
    rp = ws.resolve(path)
    with ws.locks.hold(rp.absolute, rp.relative):
        with parent_dir(ws, rp) as pfd:
            raw, st = read_leaf(pfd, rp, MAX_EDIT_SOURCE_BYTES, "edit smaller files")
            current = hash_bytes(raw)
            if expected is not None and current != expected:
                raise _mismatch(expected, current)
            if looks_binary(raw):
                raise make_error("binary_file", f"{rp.relative!r} is a binary file")
            decoded = decode_text(raw)
            source = decoded.text
            index, found = _occurrences(source, old)
            replacement = new
            span = len(old)
            if decoded.line_style == "crlf":
                replacement = apply_line_ending(new, "crlf")
                if found == 0 and "\n" in old:
                    crlf_old = apply_line_ending(old, "crlf")
                    index, found = _occurrences(source, crlf_old)
                    span = len(crlf_old)
            if found == 0:
                snippet = old if len(old) <= 80 else old[:80] + "…"
                raise make_error(
                    "text_not_found",
                    f"oldText was not found in {rp.relative!r}",
                    f"searched for {snippet!r}; re-read the file",
                )
            if found > 1:
                raise make_error(
                    "ambiguous_text_match",
                    f"oldText occurs more than once in {rp.relative!r}",
                    "include more surrounding text so that oldText occurs exactly once",
                )
            edited = source[:index] + replacement + source[index + span :]
            data = encode_text(edited, decoded.encoding, decoded.bom)
            _check_size(data, rp.relative)
            _publish(
                pfd,
                rp,
                data,
                create=False,
                expected_hash=current,
                perm=stat_mod.S_IMODE(st.st_mode) & 0o777,
            )
    return EditResult(
        path=rp.relative,
        replacements=1,
        size_bytes=len(data),
        hash=hash_bytes(data),
        encoding=decoded.encoding,
        bom=decoded.bom,
        line_ending=wire_line_ending(edited),
        matched_ignore=ws.ignore_verdict(rp, False),
    )
