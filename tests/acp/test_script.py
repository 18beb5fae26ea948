"""The scripted agent's prompt language (pure parsing), table-driven."""

from __future__ import annotations

import pytest

from acp.agents.scripted.script import Directive, Step, Text, parse, split_path_arg


@pytest.mark.parametrize(
    ("text", "steps"),
    [
        ("hello", [Text("hello")]),
        ("  ", []),
        ("[crash]", [Directive("crash")]),
        ("a [think b c] d", [Text("a"), Directive("think", "b c"), Text("d")]),
        ("[plan x|y] [flood 3]", [Directive("plan", "x|y"), Directive("flood", "3")]),
        ("[write dir/f.txt two words ]", [Directive("write", "dir/f.txt two words")]),
        ("[spawn-grandchild]", [Directive("spawn-grandchild")]),
        ("[unknown 1] x", [Text("[unknown 1] x")]),
        ("[thinking] x", [Text("[thinking] x")]),  # only exact names are directives
        ("[sleep 5][error]", [Directive("sleep", "5"), Directive("error")]),
        ("multi\nline [read a.txt]", [Text("multi\nline"), Directive("read", "a.txt")]),
    ],
)
def test_parse(text: str, steps: list[Step]) -> None:
    assert parse(text) == steps


@pytest.mark.parametrize(
    ("arg", "expected"),
    [("f.txt hello world", ("f.txt", "hello world")), ("f.txt", ("f.txt", "")), ("", ("", ""))],
)
def test_split_path_arg(arg: str, expected: tuple[str, str]) -> None:
    assert split_path_arg(arg) == expected
