"""The `.gitignore` matcher: pattern table (pure) and rule sources on real files."""

from __future__ import annotations

import functools
import os
import random
import re
from pathlib import Path

import pytest

from serve.workspaces.files import Workspace
from serve.workspaces.files.gitignore import expand_braces, parse_gitignore, translate_glob

# (ignore file text, path, is_dir, ignored?) — one rules file at the root, no nesting.
PATTERN_CASES: list[tuple[str, str, bool, bool]] = [
    ("*.log", "a.log", False, True),
    ("*.log", "deep/er/a.log", False, True),
    ("*.log", "a.log.txt", False, False),
    ("build/", "build", True, True),
    ("build/", "build", False, False),  # dir-only pattern, a file named build
    ("build/", "src/build", True, True),
    ("/build", "build", True, True),
    ("/build", "src/build", True, False),  # anchored
    ("doc/*.txt", "doc/a.txt", False, True),
    ("doc/*.txt", "doc/sub/a.txt", False, False),  # * does not cross /
    ("doc/*.txt", "x/doc/a.txt", False, False),  # middle slash anchors
    ("**/foo", "foo", False, True),
    ("**/foo", "a/b/foo", False, True),
    ("**/foo/bar", "a/foo/bar", False, True),
    ("a/**/b", "a/b", False, True),
    ("a/**/b", "a/x/y/b", False, True),
    ("a/**", "a/x/y", False, True),
    ("a/**", "a", True, False),
    ("*.log\n!keep.log", "keep.log", False, False),
    ("*.log\n!keep.log", "other.log", False, True),
    ("!keep.log\n*.log", "keep.log", False, True),  # last match wins
    ("file?.txt", "file1.txt", False, True),
    ("file?.txt", "file10.txt", False, False),
    ("[abc].py", "b.py", False, True),
    ("[!abc].py", "d.py", False, True),
    ("[!abc].py", "a.py", False, False),
    ("[a-c]x", "bx", False, True),
    ("\\#notcomment", "#notcomment", False, True),
    ("# comment\n", "# comment", False, False),
    ("\\!bang", "!bang", False, True),
    ("trailing   ", "trailing", False, True),
    ("space\\ ", "space ", False, True),
    ("", "anything", False, False),
    ("/", "anything", False, False),
    ("crlf.txt\r\n", "crlf.txt", False, True),
]


@pytest.mark.parametrize(("rules", "path", "is_dir", "ignored"), PATTERN_CASES)
def test_pattern_semantics(rules: str, path: str, is_dir: bool, ignored: bool) -> None:
    result = False
    for rule in parse_gitignore(rules):
        if rule.dir_only and not is_dir:
            continue
        if rule.regex.fullmatch(path):
            result = not rule.negated
    assert result is ignored


def test_translate_glob_basics() -> None:
    assert re.fullmatch(translate_glob("*.py"), "a.py")
    assert not re.fullmatch(translate_glob("*.py"), "d/a.py")
    assert re.fullmatch(translate_glob("**/*.py"), "d/e/a.py")
    assert re.fullmatch(translate_glob("**/*.py"), "a.py")
    assert re.fullmatch(translate_glob("[unclosed"), "[unclosed")
    assert re.fullmatch(translate_glob("a\\*b"), "a*b")
    assert not re.fullmatch(translate_glob("a\\*b"), "axb")


def test_expand_braces() -> None:
    assert expand_braces("*.{py,pyi}") == ["*.py", "*.pyi"]
    assert expand_braces("{a,{b,c}}/x") == ["a/x", "b/x", "c/x"]
    assert expand_braces("no{brace") == ["no{brace"]
    assert expand_braces("{single}") == ["{single}"]
    with pytest.raises(ValueError, match="alternatives"):
        expand_braces("{a,b}{c,d}{e,f}{g,h}{i,j}{k,l}{m,n}", limit=64)


@pytest.fixture
def repo(tmp_path: Path) -> Workspace:
    (tmp_path / ".gitignore").write_text("*.log\nbuild/\n!important.log\n/rooted.txt\n")
    (tmp_path / ".qwenignore").write_text("secrets/\n")
    (tmp_path / ".git" / "info").mkdir(parents=True)
    (tmp_path / ".git" / "info" / "exclude").write_text("local-only\n")
    (tmp_path / "pkg" / "inner").mkdir(parents=True)
    (tmp_path / "pkg" / ".gitignore").write_text("!debug.log\n*.tmp\n")
    (tmp_path / "pkg" / "inner" / ".gitignore").write_text("/only-here\n")
    return Workspace(tmp_path)


MATCH_CASES: list[tuple[str, bool, str | None]] = [
    ("src/a.py", False, None),
    ("a.log", False, "file"),
    ("important.log", False, None),
    ("build", True, "directory"),
    ("build/out.o", False, "directory"),  # inside an ignored directory
    ("build/important.log", False, "directory"),  # no re-inclusion below it
    ("rooted.txt", False, "file"),
    ("pkg/rooted.txt", False, None),
    ("secrets", True, "directory"),
    ("local-only", False, "file"),
    (".git", True, "directory"),
    (".git/config", False, "directory"),
    ("pkg/debug.log", False, None),  # nested negation overrides the root rule
    ("pkg/other.log", False, "file"),
    ("pkg/x.tmp", False, "file"),
    ("x.tmp", False, None),  # nested rule does not apply above its directory
    ("pkg/inner/only-here", False, "file"),
    ("pkg/only-here", False, None),
    (".", True, None),
]


@pytest.mark.parametrize(("path", "is_dir", "verdict"), MATCH_CASES)
def test_rule_sources_on_disk(
    repo: Workspace, path: str, is_dir: bool, verdict: str | None
) -> None:
    assert repo.ignore.match(path, is_dir) == verdict


def test_edited_ignore_file_takes_effect(tmp_path: Path) -> None:
    ws = Workspace(tmp_path)
    assert ws.ignore.match("a.txt", False) is None
    (tmp_path / ".gitignore").write_text("a.txt\n")
    assert ws.ignore.match("a.txt", False) == "file"
    (tmp_path / ".gitignore").write_text("# nothing\n")
    assert ws.ignore.match("a.txt", False) is None


def test_symlinked_ignore_file_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "rules").write_text("*\n")
    (tmp_path / "ws").mkdir()
    os.symlink(outside / "rules", tmp_path / "ws" / ".gitignore")
    ws = Workspace(tmp_path / "ws")
    assert ws.ignore.match("a.txt", False) is None


# ---- matching cost and agreement with a reference (issue 22, item 20) ------------------------


def reference_match(pat: str, path: str) -> bool:
    """Glob semantics by plain recursion over (pattern, path) positions, memoised: ``*`` any
    run without ``/``, ``**`` between slashes any whole segments, a trailing ``/**``
    anything, ``?`` and ``[ab]``/``[!ab]`` one character other than ``/``."""

    @functools.cache
    def at(i: int, j: int) -> bool:
        if i == len(pat):
            return j == len(path)
        c = pat[i]
        if c == "*":
            end = i
            while end < len(pat) and pat[end] == "*":
                end += 1
            if end - i >= 2 and (i == 0 or pat[i - 1] == "/"):
                if end == len(pat):
                    return True
                if pat[end] == "/":
                    starts = [k for k in range(j, len(path) + 1) if k == j or path[k - 1] == "/"]
                    return any(at(end + 1, k) for k in starts)
            k = j
            while True:
                if at(end, k):
                    return True
                if k == len(path) or path[k] == "/":
                    return False
                k += 1
        if j == len(path) or (path[j] == "/") != (c == "/"):
            return False
        if c == "[":
            close = pat.index("]", i + 2)
            body = pat[i + 1 : close]
            negate = body.startswith("!")
            return ((path[j] in body.lstrip("!")) != negate) and at(close + 1, j + 1)
        return (c == "?" or c == path[j]) and at(i + 1, j + 1)

    return at(0, 0)


def test_glob_translation_agrees_with_the_reference_matcher() -> None:
    rng = random.Random(22)
    pieces = ["a", "b", "*", "**", "?", "/", "**/", "/**", "[ab]", "[!a]"]
    for _ in range(3000):
        pat = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 7)))
        regex = re.compile(translate_glob(pat), re.DOTALL)
        for _ in range(12):
            path = "".join(rng.choice("ab/") for _ in range(rng.randint(0, 9)))
            assert bool(regex.fullmatch(path)) == reference_match(pat, path), (pat, path)


@pytest.mark.timeout(60)  # a hang guard: backtracking took hours on these
def test_hostile_patterns_match_without_backtracking_blowup() -> None:
    name = "a" * 2000
    deep = "/".join([name[:50]] * 40)
    cases = [
        ("*?" * 400 + "*Q", False),
        ("*a" * 400 + "Q", False),
        ("**/" * 100 + "*a*a*a*Q", False),
        ("a*" * 300, True),
        ("**/a*" * 100 + "a", False),
    ]
    for pat, matches_name in cases:
        regex = re.compile(translate_glob(pat), re.DOTALL)
        assert bool(regex.fullmatch(name)) is matches_name, pat
        assert regex.fullmatch(deep) is None, pat
    (rule,) = parse_gitignore("*?" * 400 + "*Q\n")
    assert rule.regex.fullmatch("dir/" + name) is None
    assert rule.regex.fullmatch("dir/" + name + "Q") is not None
