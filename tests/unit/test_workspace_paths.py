"""Path attacks against the workspace boundary: 0 escapes, 0 reads of outside content.

Every attack runs against every operation on real files in ``tmp_path``; the outside
directory holds a secret marker that must never appear in any result, and must be
byte-for-byte unchanged (no write lands outside) after the whole table has run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote

import msgspec
import pytest

from serve.errors import fs_error
from serve.workspaces.files import (
    StatResult,
    Workspace,
    WorkspaceFsError,
    edit_text,
    glob,
    list_dir,
    overwrite_text,
    read_bytes,
    read_text,
    stat,
    write_text,
)
from serve.workspaces.files.paths import MAX_NAME_BYTES, MAX_PATH_CHARS, suspicious_reason

SECRET = "TOP-SECRET-7f3a9c"
SECRET_HASH_INPUT = f"{SECRET}\n"


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Workspace, Path, Path]:
    """A workspace with legit and hostile symlinks, and an outside directory."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET_HASH_INPUT)
    (outside / "d").mkdir()
    (outside / "d" / "ok.txt").write_text(SECRET_HASH_INPUT)
    ws_dir = tmp_path / "ws"
    (ws_dir / "src").mkdir(parents=True)
    (ws_dir / "src" / "ok.txt").write_text("inside\n")
    (ws_dir / "sub").mkdir()
    os.symlink("../outside/secret.txt", ws_dir / "link_out")
    os.symlink(str(outside / "secret.txt"), ws_dir / "link_abs")
    os.symlink(str(outside), ws_dir / "dir_out")
    os.symlink("chain2", ws_dir / "chain1")
    os.symlink("sub/chain3", ws_dir / "chain2")
    os.symlink("../link_out", ws_dir / "sub" / "chain3")
    os.symlink("loop_b", ws_dir / "loop_a")
    os.symlink("loop_a", ws_dir / "loop_b")
    os.symlink(str(outside / "new.txt"), ws_dir / "dangling_out")
    os.symlink("../..", ws_dir / "sub" / "up")
    os.symlink("src/ok.txt", ws_dir / "inside_link")
    os.symlink("src", ws_dir / "inside_dirlink")
    # out and back in: the real path is inside, so this one is allowed.
    os.symlink(str(ws_dir / "src" / "ok.txt"), outside / "back")
    os.symlink("../outside/back", ws_dir / "bounce")
    return Workspace(ws_dir), ws_dir, outside


def _snapshot(directory: Path) -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    for path in sorted(directory.rglob("*")):
        if path.is_symlink():
            out[str(path)] = "->" + os.readlink(path)
        elif path.is_file():
            out[str(path)] = path.read_bytes()
        else:
            out[str(path)] = "dir"
    return out


# (input, expected errorKinds, final component is a symlink)
ATTACKS: list[tuple[str, set[str], bool]] = [
    ("../outside/secret.txt", {"path_outside_workspace"}, False),
    ("src/../../outside/secret.txt", {"path_outside_workspace"}, False),
    ("sub/../../outside/secret.txt", {"path_outside_workspace"}, False),
    (unquote("%2e%2e/outside/secret.txt"), {"path_outside_workspace"}, False),
    (unquote("%2E%2E%2Foutside%2Fsecret.txt"), {"path_outside_workspace"}, False),
    ("/etc/passwd", {"path_outside_workspace"}, False),
    ("/", {"path_outside_workspace"}, False),
    ("link_out", {"symlink_escape"}, True),
    ("link_abs", {"symlink_escape"}, True),
    ("dir_out/secret.txt", {"symlink_escape"}, False),
    ("dir_out/d/ok.txt", {"symlink_escape"}, False),
    ("chain1", {"symlink_escape"}, True),
    ("sub/chain3", {"symlink_escape"}, True),
    ("loop_a", {"symlink_escape"}, True),
    ("sub/up/outside/secret.txt", {"symlink_escape"}, False),
    ("dangling_out", {"symlink_escape"}, True),
    ("src/ok.txt\x00.png", {"path_outside_workspace"}, False),
    ("src/ok.txt\n", {"path_outside_workspace"}, False),
    ("src/\x1b[2Jok.txt", {"path_outside_workspace"}, False),
    ("src/\u202etxt.ko", {"path_outside_workspace"}, False),
    ("src/ok\u200b.txt", {"path_outside_workspace"}, False),
    ("src/ok\u2066.txt", {"path_outside_workspace"}, False),
    ("src/\ufeffok.txt", {"path_outside_workspace"}, False),
    ("src/\u00a0ok.txt", {"path_outside_workspace"}, False),
    ("src/ok\u3164.txt", {"path_outside_workspace"}, False),
    ("src/ok\ud800.txt", {"path_outside_workspace"}, False),
    ("CON", {"path_outside_workspace"}, False),
    ("src/aux.c", {"path_outside_workspace"}, False),
    ("NUL.txt", {"path_outside_workspace"}, False),
    ("logs/file.LPT9", {"path_outside_workspace"}, False),
    ("...", {"path_outside_workspace"}, False),
    ("src/..../ok.txt", {"path_outside_workspace"}, False),
    ("src/ok.txt.", {"path_outside_workspace"}, False),
    ("src/ok.txt ", {"path_outside_workspace"}, False),
    ("\\\\?\\C:\\outside\\secret.txt", {"path_outside_workspace"}, False),
    ("\\\\.\\PhysicalDrive0", {"path_outside_workspace"}, False),
    ("//?/C:/secret", {"path_outside_workspace"}, False),
    ("//server/share/secret.txt", {"path_outside_workspace"}, False),
    ("\\\\server\\share", {"path_outside_workspace"}, False),
    ("a" * (MAX_NAME_BYTES + 1), {"parse_error"}, False),
    ("é" * 128, {"parse_error"}, False),
    ("a/" * (MAX_PATH_CHARS // 2 + 1), {"parse_error"}, False),
    ("", {"parse_error"}, False),
]


def _operations(ws: Workspace, p: str) -> list[tuple[str, object]]:
    """Run every operation on ``p``; returns (name, result-or-error) pairs."""
    results: list[tuple[str, object]] = []
    ops: dict[str, Callable[[], object]] = {
        "read_text": lambda: read_text(ws, p),
        "read_text_window": lambda: read_text(ws, p, line=1, limit=5),
        "read_bytes": lambda: read_bytes(ws, p),
        "stat": lambda: stat(ws, p),
        "list_dir": lambda: list_dir(ws, p),
        "glob_cwd": lambda: glob(ws, "**/*", cwd=p),
        "write_create": lambda: write_text(ws, p, "pwned\n", mode="create"),
        "write_replace": lambda: write_text(
            ws, p, "pwned\n", mode="replace", expected_hash="sha256:" + "0" * 64
        ),
        "overwrite": lambda: overwrite_text(ws, p, "pwned\n"),
        "edit": lambda: edit_text(ws, p, SECRET, "pwned"),
    }
    if p == "":
        del ops["glob_cwd"]  # an empty cwd means "no cwd" (the root), not a path
    for name, op in ops.items():
        try:
            results.append((name, op()))
        except WorkspaceFsError as err:
            results.append((name, err))
    return results


@pytest.mark.parametrize(("attack", "kinds", "final_link"), ATTACKS)
def test_attack_never_escapes(
    layout: tuple[Workspace, Path, Path], attack: str, kinds: set[str], final_link: bool
) -> None:
    ws, _, outside = layout
    before = _snapshot(outside)
    for name, outcome in _operations(ws, attack):
        assert SECRET not in repr(outcome), (name, outcome)
        if name == "stat" and final_link:
            # lstat semantics: the link itself is reported, its target is not touched.
            assert isinstance(outcome, StatResult), outcome
            assert outcome.type == "symlink"
            continue
        assert isinstance(outcome, WorkspaceFsError), (name, outcome)
        assert outcome.kind in kinds, (name, outcome)
        body = fs_error(outcome).body
        assert SECRET not in repr(body)
        assert str(outside) not in str(body["error"]), body
    assert _snapshot(outside) == before
    assert not (outside / "new.txt").exists()


def test_encoded_traversal_is_not_decoded_again(layout: tuple[Workspace, Path, Path]) -> None:
    """The caller URL-decodes once; a still-encoded name is a literal file name inside."""
    ws, ws_dir, _ = layout
    for literal in ("%2e%2e/outside/secret.txt", unquote("%252e%252e/outside/secret.txt")):
        with pytest.raises(WorkspaceFsError) as info:
            read_text(ws, literal)
        assert info.value.kind == "path_not_found"
    result = write_text(ws, "%2e%2e", "literal\n", mode="create")
    assert result.path == "%2e%2e"
    assert (ws_dir / "%2e%2e").read_text() == "literal\n"


LEGIT: list[tuple[str, str]] = [
    ("src/ok.txt", "src/ok.txt"),
    ("./src/ok.txt", "src/ok.txt"),
    ("src//ok.txt", "src/ok.txt"),
    ("sub/../src/ok.txt", "src/ok.txt"),
    ("inside_link", "src/ok.txt"),
    ("inside_dirlink/ok.txt", "src/ok.txt"),
    ("bounce", "src/ok.txt"),
]


@pytest.mark.parametrize(("given", "relative"), LEGIT)
def test_legit_paths_resolve_inside(
    layout: tuple[Workspace, Path, Path], given: str, relative: str
) -> None:
    ws, _, _ = layout
    result = read_text(ws, given)
    assert result.content == "inside\n"
    assert result.path == relative


def test_absolute_paths_inside_are_accepted(layout: tuple[Workspace, Path, Path]) -> None:
    ws, ws_dir, _ = layout
    assert read_text(ws, str(ws_dir / "src" / "ok.txt")).path == "src/ok.txt"
    assert ws.resolve(str(ws_dir)).relative == "."
    assert ws.resolve(".").parts == ()


def test_sibling_with_common_prefix_is_outside(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws-other").mkdir()
    (tmp_path / "ws-other" / "f").write_text(SECRET)
    ws = Workspace(tmp_path / "ws")
    with pytest.raises(WorkspaceFsError) as info:
        read_text(ws, str(tmp_path / "ws-other" / "f"))
    assert info.value.kind == "path_outside_workspace"


def test_workspace_spelled_through_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (real / "src").mkdir(parents=True)
    (real / "src" / "a.txt").write_text("a\n")
    os.symlink(real, tmp_path / "alias")
    ws = Workspace(tmp_path / "alias")
    assert ws.root == str(real)
    assert read_text(ws, str(tmp_path / "alias" / "src" / "a.txt")).path == "src/a.txt"
    assert read_text(ws, str(real / "src" / "a.txt")).path == "src/a.txt"


def test_resolve_missing_tail_and_must_exist(layout: tuple[Workspace, Path, Path]) -> None:
    ws, ws_dir, _ = layout
    rp = ws.resolve("src/new/deeper.txt", must_exist=False)
    assert not rp.exists
    assert rp.relative == "src/new/deeper.txt"
    assert rp.absolute == str(ws_dir / "src" / "new" / "deeper.txt")
    with pytest.raises(WorkspaceFsError) as info:
        ws.resolve("src/new/deeper.txt")
    assert info.value.kind == "path_not_found"


def test_file_used_as_directory_is_parse_error(layout: tuple[Workspace, Path, Path]) -> None:
    ws, _, _ = layout
    with pytest.raises(WorkspaceFsError) as info:
        ws.resolve("src/ok.txt/child", must_exist=False)
    assert info.value.kind == "parse_error"


def test_follow_symlinks_false_keeps_the_link(layout: tuple[Workspace, Path, Path]) -> None:
    ws, _, _ = layout
    rp = ws.resolve("inside_dirlink/ok.txt", follow_symlinks=False)
    assert rp.relative == "src/ok.txt"
    rp = ws.resolve("link_out", follow_symlinks=False)
    assert rp.relative == "link_out"


def test_relative_rendering(layout: tuple[Workspace, Path, Path]) -> None:
    ws, ws_dir, outside = layout
    assert ws.relative(str(ws_dir)) == "."
    assert ws.relative(str(ws_dir / "src" / "ok.txt")) == "src/ok.txt"
    with pytest.raises(WorkspaceFsError) as info:
        ws.relative(str(outside / "secret.txt"))
    assert info.value.kind == "path_outside_workspace"


def test_swapped_directory_after_resolution_fails_closed(
    layout: tuple[Workspace, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory replaced by a symlink between resolve and open is not followed."""
    ws, ws_dir, outside = layout
    (ws_dir / "d").mkdir()
    (ws_dir / "d" / "ok.txt").write_text("inside\n")
    real_resolve = Workspace.resolve

    def resolve_then_swap(self: Workspace, user_path: str, **kwargs: bool) -> object:
        resolved = real_resolve(self, user_path, **kwargs)
        if (ws_dir / "d").is_dir() and not (ws_dir / "d").is_symlink():
            os.rename(ws_dir / "d", ws_dir / "d.orig")
            os.symlink(outside / "d", ws_dir / "d")
        return resolved

    monkeypatch.setattr(Workspace, "resolve", resolve_then_swap)
    for op in (
        lambda: read_text(ws, "d/ok.txt"),
        lambda: read_bytes(ws, "d/ok.txt"),
        lambda: edit_text(ws, "d/ok.txt", SECRET, "pwned"),
        lambda: overwrite_text(ws, "d/ok.txt", "pwned\n"),
    ):
        with pytest.raises(WorkspaceFsError) as info:
            op()
        assert info.value.kind == "symlink_escape"
        assert SECRET not in repr(info.value)
        os.unlink(ws_dir / "d")
        os.rename(ws_dir / "d.orig", ws_dir / "d")
    assert (outside / "d" / "ok.txt").read_text() == SECRET_HASH_INPUT


def test_glob_never_lists_escaping_links(layout: tuple[Workspace, Path, Path]) -> None:
    ws, _, _ = layout
    result = glob(ws, "**/*", include_ignored=True)
    encoded = msgspec.json.encode(result).decode()
    assert SECRET not in encoded
    for match in result.matches:
        ws.resolve(match, must_exist=False)  # every match resolves inside
    for hostile in ("link_out", "link_abs", "dir_out", "chain1", "loop_a", "dangling_out"):
        assert hostile not in result.matches
    assert "inside_link" in result.matches
    assert glob(ws, "**/secret.txt").matches == ()


SUSPICIOUS: list[tuple[str, bool, bool]] = [
    # (path, suspicious on POSIX, suspicious on Windows)
    ("src/main.py", False, False),
    ("a b/c d.txt", False, False),
    ("café/naïve.md", False, False),
    ("日本語/ファイル.txt", False, False),
    ("bacon/concat.txt", False, False),
    ("backup~1.txt", False, True),
    ("C:/work/x", False, False),
    ("src/file:stream", False, True),
    ("..", False, False),
    ("./x", False, False),
    ("...", True, True),
    ("a/.../b", True, True),
    ("x.", True, True),
    ("x\t", True, True),
    ("com1", True, True),
    ("COM1.json", True, True),
    ("foo.prn", True, True),
    ("con.foo.bar", True, True),
    ("//x/y", True, True),
    ("///x", False, False),
    ("\x7f", True, True),
    ("\u0085", True, True),
    ("a\u2028b", True, True),
    ("a\u200db", True, True),
    ("a\u00adb", True, True),
    ("a\U000e0041b", True, True),
]


@pytest.mark.parametrize(("path", "posix", "windows"), SUSPICIOUS)
def test_suspicious_reason_table(path: str, posix: bool, windows: bool) -> None:
    assert (suspicious_reason(path) is not None) is posix
    assert (suspicious_reason(path, windows=True) is not None) is windows


def test_workspace_root_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not an existing directory"):
        Workspace(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="not an existing directory"):
        Workspace(tmp_path / "file")
