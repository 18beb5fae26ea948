"""The scripted agent's prompt language (pure parsing; see DESIGN.md's table).

A prompt's text is split into plain-text runs and bracketed directives, in order::

    hello [think hmm] world [flood 3]
    -> Text("hello"), Directive("think", "hmm"), Text("world"), Directive("flood", "3")

Only the known directive names below are directives; any other bracketed text is plain text.
A directive's argument is everything after the name up to the closing ``]`` (trimmed).
Plain-text runs are trimmed; empty runs are dropped.
"""

from __future__ import annotations

import re
from typing import Final

import msgspec

DIRECTIVES: Final = (
    "think",
    "plan",
    "write",
    "read",
    "shell",
    "sleep",
    "flood",
    "error",
    "crash",
    "hang",
    "spawn-grandchild",
    "usage",
    "touch",
    "elicit",
    "steer-late",
    "steer-fail",
    "steer-closed",
)

_DIRECTIVE_RE: Final = re.compile(
    r"\[(" + "|".join(re.escape(d) for d in DIRECTIVES) + r")(?:\s+([^\]]*))?\s*\]"
)


class Text(msgspec.Struct, frozen=True):
    text: str


class Directive(msgspec.Struct, frozen=True):
    name: str
    arg: str = ""


Step = Text | Directive


def parse(text: str) -> list[Step]:
    steps: list[Step] = []
    pos = 0
    for m in _DIRECTIVE_RE.finditer(text):
        before = text[pos : m.start()].strip()
        if before:
            steps.append(Text(before))
        steps.append(Directive(m.group(1), (m.group(2) or "").strip()))
        pos = m.end()
    rest = text[pos:].strip()
    if rest:
        steps.append(Text(rest))
    return steps


def split_path_arg(arg: str) -> tuple[str, str]:
    """``[write PATH TEXT]``: the first word is the path, the rest (maybe empty) the text."""
    parts = arg.split(None, 1)
    if not parts:
        return "", ""
    return parts[0], parts[1] if len(parts) > 1 else ""
