"""Workspace file operations on real files: reads, writes, edits, races, limits, listing."""

from __future__ import annotations

import base64
import codecs
import hashlib
import os
import stat as stat_mod
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from serve.errors import FS_STATUS
from serve.workspaces.files import (
    Workspace,
    WorkspaceFsError,
    edit_text,
    glob,
    hash_bytes,
    list_dir,
    overwrite_text,
    read_bytes,
    read_text,
    stat,
    write_text,
)
from serve.workspaces.files.contents import MAX_BYTES_WINDOW, MAX_TEXT_READ_BYTES, MAX_WRITE_BYTES
from serve.workspaces.files.results import ReadTextResult


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path)


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def error_of(fn: Callable[[], object]) -> WorkspaceFsError:
    with pytest.raises(WorkspaceFsError) as info:
        fn()
    return info.value


def kind_of(fn: Callable[[], object]) -> str:
    return error_of(fn).kind


def no_temp_files(root: Path) -> bool:
    return not any(p.name.startswith(".acp-serve-") for p in root.rglob("*"))


# -- reads ----------------------------------------------------------------------------------


def test_read_text_wire_shape(ws: Workspace, tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "index.ts").write_bytes(b"export {};\n")
    body = msgspec.json.decode(msgspec.json.encode(read_text(ws, "src/index.ts")))
    assert body == {
        "kind": "file",
        "path": "src/index.ts",
        "content": "export {};\n",
        "encoding": "utf-8",
        "bom": False,
        "lineEnding": "lf",
        "sizeBytes": 11,
        "returnedBytes": 11,
        "truncated": False,
        "hash": sha(b"export {};\n"),
        "matchedIgnore": None,
        "originalLineCount": None,
        "nextCursor": None,
        "hasMore": False,
    }


def test_read_text_windows(ws: Workspace, tmp_path: Path) -> None:
    raw = b"l1\nl2\r\nl3\nl4"
    (tmp_path / "f.txt").write_bytes(raw)
    r = read_text(ws, "f.txt", line=2, limit=2)
    assert (r.content, r.original_line_count, r.truncated, r.has_more) == (
        "l2\r\nl3\n",
        4,
        True,
        True,
    )
    assert r.hash == sha(raw)  # whole file, not the window
    r = read_text(ws, "f.txt", line=3)
    assert (r.content, r.truncated) == ("l3\nl4", False)
    r = read_text(ws, "f.txt", line=9, limit=5)
    assert (r.content, r.returned_bytes, r.has_more) == ("", 0, False)


def test_read_text_max_bytes_cuts_on_code_points(ws: Workspace, tmp_path: Path) -> None:
    (tmp_path / "u.txt").write_text("é" * 10)
    r = read_text(ws, "u.txt", max_bytes=5)
    assert (r.content, r.returned_bytes, r.size_bytes, r.truncated) == ("éé", 4, 20, True)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_bytes": 0},
        {"max_bytes": MAX_TEXT_READ_BYTES + 1},
        {"line": 0},
        {"limit": 0},
        {"limit": 2001},
        {"line": True},
        {"max_bytes": "10"},
    ],
)
def test_read_text_rejects_bad_arguments(
    ws: Workspace, tmp_path: Path, kwargs: dict[str, Any]
) -> None:
    (tmp_path / "f.txt").write_text("x")
    assert kind_of(lambda: read_text(ws, "f.txt", **kwargs)) == "parse_error"


def test_binary_and_oversized_files(ws: Workspace, tmp_path: Path) -> None:
    png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256))
    (tmp_path / "logo.png").write_bytes(png)
    assert kind_of(lambda: read_text(ws, "logo.png")) == "binary_file"
    whole = read_bytes(ws, "logo.png")
    assert base64.b64decode(whole.content_base64) == png
    assert (whole.hash, whole.truncated) == (sha(png), False)

    big = (b"0123456789abcde\n" * (MAX_TEXT_READ_BYTES // 16)) + b"tail\n"
    (tmp_path / "big.txt").write_bytes(big)
    err = error_of(lambda: read_text(ws, "big.txt"))
    assert (err.kind, FS_STATUS[err.kind]) == ("file_too_large", 413)
    window = read_text(ws, "big.txt", line=2, limit=3)
    assert window.content == "0123456789abcde\n" * 3
    assert window.hash == sha(big)
    assert window.original_line_count == MAX_TEXT_READ_BYTES // 16 + 1
    part = read_bytes(ws, "big.txt", offset=len(big) - 5, max_bytes=MAX_BYTES_WINDOW)
    assert base64.b64decode(part.content_base64) == b"tail\n"
    assert (part.truncated, part.hash, part.size_bytes) == (True, None, len(big))
    encoded = msgspec.json.decode(msgspec.json.encode(part))
    assert "hash" not in encoded and encoded["kind"] == "file_bytes"


def test_read_bytes_arguments_and_non_regular(ws: Workspace, tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"abc")
    (tmp_path / "d").mkdir()
    os.mkfifo(tmp_path / "fifo")
    assert kind_of(lambda: read_bytes(ws, "f", max_bytes=MAX_BYTES_WINDOW + 1)) == "parse_error"
    assert kind_of(lambda: read_bytes(ws, "f", offset=-1)) == "parse_error"
    assert kind_of(lambda: read_bytes(ws, "d")) == "parse_error"
    assert kind_of(lambda: read_bytes(ws, "fifo")) == "parse_error"  # and does not block
    assert kind_of(lambda: read_text(ws, "fifo")) == "parse_error"
    assert kind_of(lambda: read_bytes(ws, ".")) == "parse_error"
    beyond = read_bytes(ws, "f", offset=10)
    assert (beyond.returned_bytes, beyond.content_base64, beyond.hash) == (0, "", None)


def test_stat(ws: Workspace, tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_bytes(b"12345")
    os.symlink("f.txt", tmp_path / "link")
    (tmp_path / "d").mkdir()
    s = stat(ws, "f.txt")
    assert (s.path, s.type, s.size_bytes) == ("f.txt", "file", 5)
    assert s.modified_ms == os.stat(tmp_path / "f.txt").st_mtime_ns // 1_000_000
    assert stat(ws, "link").type == "symlink"
    assert stat(ws, "d").type == "directory"
    assert stat(ws, ".").path == "."
    assert kind_of(lambda: stat(ws, "missing")) == "path_not_found"
    body = msgspec.json.decode(msgspec.json.encode(s))
    assert set(body) == {"kind", "path", "type", "sizeBytes", "modifiedMs"}


# -- list and glob ----------------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Workspace:
    (tmp_path / ".gitignore").write_text("build/\n*.log\n")
    for rel in ("src/a.py", "src/b.pyi", "src/deep/c.py", "build/out.py", "x.log", "README.md"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD.py").write_text("ref")
    (tmp_path / "node_modules" / "m").mkdir(parents=True)
    (tmp_path / "node_modules" / "m" / "i.py").write_text("x")
    return Workspace(tmp_path)


def test_list_dir(tree: Workspace) -> None:
    listed = list_dir(tree, ".")
    names = [(e.name, e.kind, e.ignored) for e in listed.entries]
    assert names == [
        (".gitignore", "file", False),
        ("README.md", "file", False),
        ("node_modules", "directory", False),
        ("src", "directory", False),
    ]
    everything = list_dir(tree, ".", include_ignored=True)
    assert {e.name for e in everything.entries if e.ignored} == {".git", "build", "x.log"}
    capped = list_dir(tree, ".", include_ignored=True, max_entries=2)
    assert (len(capped.entries), capped.truncated) == (2, True)
    assert list_dir(tree, "build", include_ignored=True).matched_ignore == "directory"
    assert kind_of(lambda: list_dir(tree, "README.md")) == "parse_error"
    assert kind_of(lambda: list_dir(tree, "nope")) == "path_not_found"


def test_glob(tree: Workspace) -> None:
    assert glob(tree, "**/*.py").matches == ("src/a.py", "src/deep/c.py")
    assert glob(tree, "**/*.{py,pyi}").matches == ("src/a.py", "src/b.pyi", "src/deep/c.py")
    assert glob(tree, "**/*.py", include_ignored=True).matches == (
        "build/out.py",
        "src/a.py",
        "src/deep/c.py",
    )
    assert glob(tree, "*.py", cwd="src").matches == ("src/a.py",)
    assert glob(tree, "*.py", cwd="src").cwd == "src"
    assert glob(tree, "src/deep/*").matches == ("src/deep/c.py",)
    assert glob(tree, "missing/dir/*").matches == ()
    assert glob(tree, "src/*").matches == ("src/a.py", "src/b.pyi", "src/deep")
    capped = glob(tree, "**/*", max_results=2)
    assert (capped.count, capped.truncated) == (2, True)
    for bad in ("../x", "src/../../x", "/etc/*", "C:\\x", "", "a\nb"):
        assert kind_of(partial(glob, tree, bad)) == "parse_error", bad
    assert kind_of(lambda: glob(tree, "*", max_results=50_001)) == "parse_error"
    assert kind_of(lambda: glob(tree, "*", cwd="README.md")) == "parse_error"
    assert kind_of(lambda: glob(tree, "*", cwd="nope")) == "path_not_found"
    body = msgspec.json.decode(msgspec.json.encode(glob(tree, "*.md")))
    assert body["kind"] == "glob" and body["cwd"] == "" and body["count"] == 1


# -- writes -----------------------------------------------------------------------------------


def test_create_never_overwrites(ws: Workspace, tmp_path: Path) -> None:
    result = write_text(ws, "new.txt", "hello\n", mode="create")
    assert (result.created, result.mode, result.size_bytes) == (True, "create", 6)
    assert result.hash == sha(b"hello\n") == read_text(ws, "new.txt").hash
    err = error_of(lambda: write_text(ws, "new.txt", "x", mode="create"))
    assert (err.kind, FS_STATUS[err.kind]) == ("file_already_exists", 409)
    assert (tmp_path / "new.txt").read_text() == "hello\n"
    assert kind_of(lambda: write_text(ws, "a/b/c.txt", "x", mode="create")) == "path_not_found"
    made = write_text(ws, "a/b/c.txt", "x", mode="create", create_parents=True)
    assert made.path == "a/b/c.txt" and (tmp_path / "a" / "b" / "c.txt").read_text() == "x"
    assert no_temp_files(tmp_path)


def test_replace_hash_rules(ws: Workspace, tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("v1\n")
    h1 = read_text(ws, "f.txt").hash
    assert kind_of(lambda: write_text(ws, "f.txt", "v2\n", mode="replace")) == "parse_error"
    for bad in ("abc", "sha256:" + "A" * 64, "sha256:" + "0" * 63, "md5:" + "0" * 64):
        assert (
            kind_of(partial(write_text, ws, "f.txt", "v2\n", mode="replace", expected_hash=bad))
            == "parse_error"
        )
    stale = "sha256:" + "0" * 64
    err = error_of(lambda: write_text(ws, "f.txt", "v2\n", mode="replace", expected_hash=stale))
    assert (err.kind, FS_STATUS[err.kind]) == ("hash_mismatch", 409)
    assert h1 in err.message
    assert (tmp_path / "f.txt").read_text() == "v1\n"
    done = write_text(ws, "f.txt", "v2\n", mode="replace", expected_hash=h1)
    assert (done.created, done.mode) == (False, "replace")
    assert (tmp_path / "f.txt").read_text() == "v2\n"
    assert (
        kind_of(lambda: write_text(ws, "f.txt", "v3\n", mode="replace", expected_hash=h1))
        == "hash_mismatch"
    )
    assert (
        kind_of(lambda: write_text(ws, "gone.txt", "x", mode="replace", expected_hash=h1))
        == "path_not_found"
    )
    assert kind_of(lambda: write_text(ws, "f.txt", "x", mode="overwrite")) == "parse_error"
    assert no_temp_files(tmp_path)


def test_write_preserves_permission_bits(ws: Workspace, tmp_path: Path) -> None:
    secret = tmp_path / "secret.env"
    secret.write_text("A=1\n")
    secret.chmod(0o600)
    h = read_text(ws, "secret.env").hash
    write_text(ws, "secret.env", "A=2\n", mode="replace", expected_hash=h)
    assert stat_mod.S_IMODE(secret.stat().st_mode) == 0o600
    edit_text(ws, "secret.env", "A=2", "A=3")
    assert stat_mod.S_IMODE(secret.stat().st_mode) == 0o600
    overwrite_text(ws, "secret.env", "A=4\n")
    assert stat_mod.S_IMODE(secret.stat().st_mode) == 0o600


def test_write_size_cap(ws: Workspace, tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("small\n")
    h = read_text(ws, "f.txt").hash
    too_big = "x" * (MAX_WRITE_BYTES + 1)
    err = error_of(lambda: write_text(ws, "f.txt", too_big, mode="replace", expected_hash=h))
    assert (err.kind, FS_STATUS[err.kind]) == ("file_too_large", 413)
    # fits as characters, not once encoded as UTF-16
    half = "y" * (MAX_WRITE_BYTES // 2 + 1)
    assert (
        kind_of(lambda: write_text(ws, "g.txt", half, mode="create", encoding="utf-16le"))
        == "file_too_large"
    )
    assert (tmp_path / "f.txt").read_text() == "small\n"
    assert not (tmp_path / "g.txt").exists()
    assert no_temp_files(tmp_path)


def test_write_refuses_binary_target_and_directories(ws: Workspace, tmp_path: Path) -> None:
    (tmp_path / "b.bin").write_bytes(b"\x00\x01\x02")
    (tmp_path / "d").mkdir()
    h = sha(b"\x00\x01\x02")
    assert (
        kind_of(lambda: write_text(ws, "b.bin", "t", mode="replace", expected_hash=h))
        == "binary_file"
    )
    assert kind_of(lambda: write_text(ws, "d", "t", mode="create")) == "file_already_exists"
    assert kind_of(lambda: write_text(ws, ".", "t", mode="create")) == "parse_error"
    assert kind_of(lambda: overwrite_text(ws, "d", "t")) == "parse_error"


def test_untrusted_workspace_reads_but_never_writes(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("v1\n")
    ws = Workspace(tmp_path, trusted=False)
    h = read_text(ws, "f.txt").hash
    assert list_dir(ws, ".").entries and stat(ws, "f.txt") and glob(ws, "*")
    for op in (
        lambda: write_text(ws, "n.txt", "x", mode="create"),
        lambda: write_text(ws, "f.txt", "x", mode="replace", expected_hash=h),
        lambda: overwrite_text(ws, "f.txt", "x"),
        lambda: edit_text(ws, "f.txt", "v1", "v2", expected_hash=h),
    ):
        err = error_of(op)
        assert (err.kind, FS_STATUS[err.kind]) == ("untrusted_workspace", 403)
    assert (tmp_path / "f.txt").read_text() == "v1\n"
    assert not (tmp_path / "n.txt").exists()


def test_overwrite_creates_and_keeps_profile(ws: Workspace, tmp_path: Path) -> None:
    created = overwrite_text(ws, "dir/new.txt", "a\n")
    assert (created.created, created.mode) == (True, "overwrite")
    (tmp_path / "crlf.txt").write_bytes(codecs.BOM_UTF8 + b"a\r\nb\r\n")
    result = overwrite_text(ws, "crlf.txt", "x\ny\n")
    assert (tmp_path / "crlf.txt").read_bytes() == codecs.BOM_UTF8 + b"x\r\ny\r\n"
    assert (result.created, result.bom, result.line_ending) == (False, True, "crlf")
    (tmp_path / "latin.txt").write_bytes(b"caf\xe9\n")
    fallback = overwrite_text(ws, "latin.txt", "emoji 🎉\n")
    assert fallback.encoding == "utf-8"
    assert (tmp_path / "latin.txt").read_text(encoding="utf-8") == "emoji 🎉\n"


# -- round trips ------------------------------------------------------------------------------


def test_bom_crlf_round_trip(ws: Workspace, tmp_path: Path) -> None:
    raw = codecs.BOM_UTF8 + b"first\r\nsecond\r\n"
    (tmp_path / "w.txt").write_bytes(raw)
    r = read_text(ws, "w.txt")
    assert (r.content, r.encoding, r.bom, r.line_ending) == (
        "first\r\nsecond\r\n",
        "utf-8",
        True,
        "crlf",
    )
    assert r.hash == sha(raw)
    # a client that normalised to LF still gets the file's CRLF and BOM back
    w = write_text(ws, "w.txt", "first\nchanged\n", mode="replace", expected_hash=r.hash)
    assert (tmp_path / "w.txt").read_bytes() == codecs.BOM_UTF8 + b"first\r\nchanged\r\n"
    assert (w.bom, w.line_ending, w.encoding) == (True, "crlf", "utf-8")
    # explicit overrides win
    w2 = write_text(
        ws, "w.txt", "a\r\nb\r\n", mode="replace", expected_hash=w.hash, bom=False, line_ending="lf"
    )
    assert (tmp_path / "w.txt").read_bytes() == b"a\nb\n"
    assert (w2.bom, w2.line_ending) == (False, "lf")


@pytest.mark.parametrize(
    ("encoding", "bom_bytes", "codec"),
    [
        ("utf-16le", codecs.BOM_UTF16_LE, "utf-16-le"),
        ("utf-16be", codecs.BOM_UTF16_BE, "utf-16-be"),
    ],
)
def test_utf16_round_trip(
    ws: Workspace, tmp_path: Path, encoding: str, bom_bytes: bytes, codec: str
) -> None:
    created = write_text(ws, "u.txt", "héllo\nwörld\n", mode="create", encoding=encoding, bom=True)
    assert (tmp_path / "u.txt").read_bytes() == bom_bytes + "héllo\nwörld\n".encode(codec)
    r = read_text(ws, "u.txt")
    assert (r.content, r.encoding, r.bom, r.hash) == (
        "héllo\nwörld\n",
        encoding,
        True,
        created.hash,
    )
    e = edit_text(ws, "u.txt", "wörld", "wélt €", expected_hash=r.hash)
    assert (tmp_path / "u.txt").read_bytes() == bom_bytes + "héllo\nwélt €\n".encode(codec)
    assert (e.encoding, e.bom) == (encoding, True)


def test_latin1_fallback_edits_are_byte_exact(ws: Workspace, tmp_path: Path) -> None:
    raw = b"caf\xe9 \x80\x99 na\xefve\n"  # not UTF-8: decoded as latin-1, losslessly
    (tmp_path / "l.txt").write_bytes(raw)
    r = read_text(ws, "l.txt")
    assert r.encoding == "iso-8859-1"
    edit_text(ws, "l.txt", "caf", "CAF", expected_hash=r.hash)
    assert (tmp_path / "l.txt").read_bytes() == b"CAF\xe9 \x80\x99 na\xefve\n"
    h = read_text(ws, "l.txt").hash
    assert (
        kind_of(lambda: write_text(ws, "l.txt", "€", mode="replace", expected_hash=h))
        == "parse_error"
    )
    w = write_text(ws, "l.txt", "€", mode="replace", expected_hash=h, encoding="utf-8")
    assert (tmp_path / "l.txt").read_bytes() == "€".encode() and w.encoding == "utf-8"


# -- edit semantics ---------------------------------------------------------------------------


def test_edit_semantics(ws: Workspace, tmp_path: Path) -> None:
    path = tmp_path / "c.ts"
    path.write_text("timeout: 30000\nretries: 3\nretries: 3\naaa\n")
    h = read_text(ws, "c.ts").hash
    result = edit_text(ws, "c.ts", "timeout: 30000", "timeout: 60000", expected_hash=h)
    assert path.read_text() == "timeout: 60000\nretries: 3\nretries: 3\naaa\n"
    assert result.hash == sha(path.read_bytes()) and result.replacements == 1
    before = path.read_bytes()
    h = result.hash
    cases = [
        (("nope", "x"), "text_not_found", 422),
        (("retries: 3", "x"), "ambiguous_text_match", 422),
        (("aa", "b"), "ambiguous_text_match", 422),  # overlapping occurrences count
        (("", "x"), "parse_error", 400),
    ]
    for (old, new), kind, status in cases:
        with pytest.raises(WorkspaceFsError) as info:
            edit_text(ws, "c.ts", old, new, expected_hash=h)
        assert (info.value.kind, FS_STATUS[info.value.kind]) == (kind, status)
    stale = "sha256:" + "f" * 64
    assert (
        kind_of(lambda: edit_text(ws, "c.ts", "aaa", "b", expected_hash=stale)) == "hash_mismatch"
    )
    assert kind_of(lambda: edit_text(ws, "c.ts", "aaa", "b", expected_hash="bad")) == "parse_error"
    assert kind_of(lambda: edit_text(ws, "missing.ts", "a", "b")) == "path_not_found"
    assert path.read_bytes() == before
    assert no_temp_files(tmp_path)


def test_edit_keeps_crlf_and_mixed_files_byte_exact(ws: Workspace, tmp_path: Path) -> None:
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes(b"one\r\ntwo\r\nthree\r\n")
    edit_text(ws, "crlf.txt", "one\ntwo", "ONE\nTWO\nextra")  # LF-spelled oldText matches
    assert crlf.read_bytes() == b"ONE\r\nTWO\r\nextra\r\nthree\r\n"
    mixed = tmp_path / "mixed.txt"
    mixed.write_bytes(b"a\r\nb\nc\r\nd\n")
    edit_text(ws, "mixed.txt", "c", "C")
    assert mixed.read_bytes() == b"a\r\nb\nC\r\nd\n"
    bom = tmp_path / "bom.txt"
    bom.write_bytes(codecs.BOM_UTF8 + b"x = 1\r\n")
    result = edit_text(ws, "bom.txt", "x = 1", "x = 2")
    assert bom.read_bytes() == codecs.BOM_UTF8 + b"x = 2\r\n"
    assert (result.bom, result.line_ending) == (True, "crlf")


def test_edit_refuses_binary(ws: Workspace, tmp_path: Path) -> None:
    (tmp_path / "b.bin").write_bytes(b"ab\x00cd")
    assert kind_of(lambda: edit_text(ws, "b.bin", "ab", "x")) == "binary_file"
    assert (tmp_path / "b.bin").read_bytes() == b"ab\x00cd"


def test_matched_ignore_on_writes(ws: Workspace, tmp_path: Path) -> None:
    (tmp_path / ".gitignore").write_text("*.log\ndist/\n")
    (tmp_path / "dist").mkdir()
    assert write_text(ws, "a.log", "x", mode="create").matched_ignore == "file"
    assert write_text(ws, "dist/b.js", "x", mode="create").matched_ignore == "directory"
    assert write_text(ws, "c.txt", "x", mode="create").matched_ignore is None
    assert read_text(ws, "a.log").matched_ignore == "file"


# -- races ------------------------------------------------------------------------------------


def _race(*ops: Callable[[], object]) -> list[object]:
    """Run ``ops`` in threads released together; returns each result or error."""
    barrier = threading.Barrier(len(ops))
    results: list[object] = [None] * len(ops)

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = ops[i]()
        except WorkspaceFsError as err:
            results[i] = err

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(ops))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_two_writers_with_the_same_hash_one_wins(ws: Workspace, tmp_path: Path) -> None:
    target = tmp_path / "race.txt"
    for i in range(60):
        target.write_text(f"base {i}\n")
        h = hash_bytes(target.read_bytes())
        a, b = f"A{i}\n" * 1000, f"B{i}\n" * 1000
        results = _race(
            partial(write_text, ws, "race.txt", a, mode="replace", expected_hash=h),
            partial(write_text, ws, "race.txt", b, mode="replace", expected_hash=h),
        )
        errors = [r for r in results if isinstance(r, WorkspaceFsError)]
        assert len(errors) == 1 and errors[0].kind == "hash_mismatch", results
        winner = a if not isinstance(results[0], WorkspaceFsError) else b
        assert target.read_text() == winner
    assert len(ws.locks) == 0
    assert no_temp_files(tmp_path)


def test_edit_and_write_race_never_tears(ws: Workspace, tmp_path: Path) -> None:
    target = tmp_path / "race.txt"
    for _ in range(40):
        target.write_text("key: old\n" * 50 + "marker\n")
        h = hash_bytes(target.read_bytes())
        results = _race(
            partial(edit_text, ws, "race.txt", "marker", "edited", expected_hash=h),
            partial(write_text, ws, "race.txt", "rewritten\n", mode="replace", expected_hash=h),
            partial(write_text, ws, "race.txt", "created?\n", mode="create"),
        )
        assert isinstance(results[2], WorkspaceFsError) and results[2].kind == "file_already_exists"
        errors = [r for r in results[:2] if isinstance(r, WorkspaceFsError)]
        assert len(errors) == 1 and errors[0].kind == "hash_mismatch"
        assert target.read_text() in ("key: old\n" * 50 + "edited\n", "rewritten\n")


def test_readers_never_see_a_torn_file(ws: Workspace, tmp_path: Path) -> None:
    size = 200 * 1024
    contents = ["A" * size, "B" * size]
    (tmp_path / "big.txt").write_text(contents[0])
    stop = threading.Event()
    seen: set[str] = set()
    problems: list[object] = []

    def writer() -> None:
        for i in range(80):
            overwrite_text(ws, "big.txt", contents[i % 2])
        stop.set()

    def reader() -> None:
        while not stop.is_set():
            try:
                r: ReadTextResult = read_text(ws, "big.txt")
            except WorkspaceFsError as err:  # an in-place change would be reported, not torn
                problems.append(err)
                continue
            if r.content not in contents or r.hash != sha(r.content.encode()):
                problems.append(r.content[:10])
            seen.add(r.content[0])

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert problems == []
    assert seen


async def test_concurrent_writers_from_trio_threads(ws: Workspace, tmp_path: Path) -> None:
    """The way the routes call it: several trio tasks, each in a worker thread."""
    (tmp_path / "t.txt").write_text("start\n")
    h = hash_bytes(b"start\n")
    outcomes: list[str] = []

    async def client(n: int) -> None:
        try:
            await trio.to_thread.run_sync(
                lambda: write_text(ws, "t.txt", f"client {n}\n", mode="replace", expected_hash=h)
            )
            outcomes.append(f"ok {n}")
        except WorkspaceFsError as err:
            outcomes.append(err.kind)

    async with trio.open_nursery() as nursery:
        for n in range(8):
            nursery.start_soon(client, n)
    winners = [o for o in outcomes if o.startswith("ok")]
    assert len(winners) == 1
    assert outcomes.count("hash_mismatch") == 7
    assert (tmp_path / "t.txt").read_text() == f"client {winners[0].split()[1]}\n"
