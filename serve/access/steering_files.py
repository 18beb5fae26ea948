"""Files that steer agents: the one list, and whether a workspace path is one of them.

An agent reads its instructions, tools, hooks and MCP servers from files in its working
directory: the memory files (``QWEN.md``, ``AGENTS.md``, ``CLAUDE.md`` ...), nested ones
too (``sub/AGENTS.md``: agents read those of the directories they work in), and the agents'
configuration folders (``.qwen/``, ``.claude/`` ...) and files (``.mcp.json`` ...). Writing
one changes what every agent of the workspace does, for every user: it is the same as
``POST /workspace/memory`` or ``/workspace/settings``, which need the daemon role
``admin``. So, with multi-user auth, a non-admin's write, edit or any other change of such
a path through the files routes (REST and ``/acp`` ``_qwen/file/*``) is refused
``403 forbidden need: admin`` (``serve/api/steering.py``), and so is a session-shell
command that names one (a tripwire only: see docs/multi-user.md for what the shell can and
cannot be stopped from doing).

Pure: :func:`steering_part` says whether the parts of a workspace-relative path name a
steering file or folder; names compare case-insensitively (``qwen.md`` is ``QWEN.md`` on a
case-insensitive file system, and agents differ in how they spell them); the callers pass
both the path as written (normalized: ``./QWEN.md`` and ``sub/../QWEN.md`` are ``QWEN.md``)
and as resolved (symlinks followed), so neither spelling nor a link gets around it.
:func:`mentions` is the shell's textual check.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Final

__all__ = ["DIRS", "FILES", "PATHS", "mentions", "steering_part"]

#: Files an agent reads as its instructions or configuration, wherever they are.
FILES: Final = frozenset(
    {
        "qwen.md",
        "agents.md",
        "agent.md",
        "claude.md",
        "claude.local.md",
        "gemini.md",
        ".mcp.json",
        ".cursorrules",
        ".windsurfrules",
        ".clinerules",
        ".goosehints",
        "opencode.json",
        "opencode.jsonc",
    }
)
#: Folders of agent configuration (settings, hooks, commands, skills, MCP servers).
DIRS: Final = frozenset(
    {
        ".qwen",
        ".claude",
        ".codex",
        ".gemini",
        ".cursor",
        ".opencode",
        ".kimi",
        ".kiro",
        ".amazonq",
        ".roo",
        ".windsurf",
        ".continue",
        ".agents",
    }
)
#: Two-part paths (folder, file) whose folder is shared with other tools.
PATHS: Final = frozenset(
    {
        (".github", "copilot-instructions.md"),
        (".github", "instructions"),
        (".vscode", "mcp.json"),
    }
)

_WORD: Final = re.compile(
    "|".join(re.escape(n) for n in sorted(FILES | DIRS | {p[1] for p in PATHS}, key=len)[::-1]),
    re.IGNORECASE,
)


def steering_part(parts: Sequence[str], extra: Iterable[str] = ()) -> str | None:
    """The steering file or folder ``parts`` (a workspace-relative path, split) names or
    lies in, as a ``/``-joined prefix of it; None when it is none. ``extra``: more file
    names (the workspace's configured memory file name)."""
    files = FILES | {name.lower() for name in extra}
    for i, part in enumerate(parts):
        name = part.lower()
        if name in files or name in DIRS:
            return "/".join(parts[: i + 1])
        if i > 0 and (parts[i - 1].lower(), name) in PATHS:
            return "/".join(parts[: i + 1])
    return None


def mentions(text: str, extra: Iterable[str] = ()) -> str | None:
    """The first steering name ``text`` (a shell command) mentions, case-insensitively."""
    found = _WORD.search(text)
    if found is not None:
        return found.group(0)
    lowered = text.lower()
    return next((name for name in extra if name and name.lower() in lowered), None)
