"""Why an agent child died at start-up, when our own file sandbox refused it a path.

An agent that dies during start-up because the Landlock sandbox
(:mod:`serve.isolation.sandbox`) refused it a path is a deterministic failure of the daemon's
configuration, not a transient outage: the operator must grant the path
(``--agent-allow-write DIR``) or point the agent elsewhere. :func:`explain` reads the dead
child's stderr tail (the kernel answers ``EACCES``/``EPERM``; runtimes print it as
``EACCES: permission denied, mkdir '/x'`` (node), ``PermissionError: [Errno 13] Permission
denied: '/x'`` (Python), ``/x: Permission denied`` (shells, C), ``open /x: permission denied``
(Go), ``... /x ... Permission denied (os error 13)`` (Rust)) and names the path when it lies
outside the child's write roots, or inside a protected place, and the daemon itself (not
sandboxed, same user) could write there: so the refusal was the sandbox's, not the file
mode's. The kernel's Landlock audit records (Linux 6.15+, through the audit subsystem) are
not read: they need an audit daemon or netlink listener the daemon does not run, and are
absent from the kernel log without one.

Pure functions over strings and ``stat`` calls (blocking: callers run :func:`explain` in a
worker thread, once per failed start); bounded by the stderr tail the process layer keeps
(64 KiB) and :data:`MAX_LINES` lines of it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

#: The last lines of a dead child's stderr searched for a denial.
MAX_LINES: Final = 200
#: The flag that grants a write root to every agent child.
GRANT_FLAG: Final = "--agent-allow-write"

_DENIED: Final = re.compile(r"permission denied|operation not permitted|\bEACCES\b|\bEPERM\b", re.I)
_QUOTED: Final = re.compile(r"""['"`](/[^'"`\n]*)['"`]""")
_BARE: Final = re.compile(r"""(?<![\w.~/-])(/[^\s'"`:,;()\[\]{}]+)""")


@dataclass(frozen=True)
class Denial:
    """A path the sandbox refused a child: ``path``, the stderr ``line`` that says so,
    and the directory to grant (``grant``; None: a protected place no flag grants)."""

    path: str
    line: str
    grant: str | None

    @property
    def flag(self) -> str | None:
        return f"{GRANT_FLAG} {self.grant}" if self.grant is not None else None

    def message(self) -> str:
        said = self.line if len(self.line) <= 200 else self.line[:199] + "…"
        if self.grant is None:
            return (
                f"the agent sandbox denied the agent {self.path}, a place it protects (the "
                f"daemon's state, its config or another workspace); no flag grants it "
                f"(agent stderr: {said!r})"
            )
        return (
            f"the agent sandbox denied the agent {self.path} (agent stderr: {said!r}); "
            f"start the daemon with {self.flag} (or sandbox.allowWrite in the config file) "
            "to let agents write there"
        )


def _under(path: str, root: str) -> bool:
    root = root.rstrip("/") or "/"
    return path == root or path.startswith(root if root == "/" else root + "/")


def _nearest_dir(path: str) -> str:
    """``path`` itself when it is a directory, else its nearest existing ancestor."""
    here = path
    while here != "/" and not os.path.isdir(here):
        here = os.path.dirname(here)
    return here


def _candidate(
    path: str, line: str, protected: Sequence[str], writable: Sequence[str]
) -> Denial | None:
    """``path`` (said refused by ``line``) as the sandbox's refusal, or None when the
    sandbox did not refuse it. ``protected``, ``writable``: the child's roots, canonical."""
    real = os.path.realpath(path)
    guards = [p for p in protected if _under(real, p)]
    if guards:
        # Unless a more specific write root (a child's own temp, the scripted store) holds it.
        deepest = max(guards, key=len)
        if any(_under(real, w) and len(w) > len(deepest) for w in writable):
            return None
        return Denial(real, line, None)
    if any(_under(real, w) for w in writable):
        return None
    grant = _nearest_dir(real)
    if not os.access(grant, os.W_OK):  # the file mode refuses it anyway: not the sandbox
        return None
    return Denial(real, line, grant)


def explain(stderr_tail: str, roots: Mapping[str, Sequence[str]]) -> Denial | None:
    """The sandbox's refusal that the stderr tail of a dead child reports (the last one),
    or None. ``roots``: the child's ``{"write": [...], "protected": [...]}`` (made canonical
    once here, not per path a line names)."""
    protected = [os.path.realpath(p) for p in roots.get("protected", ())]
    writable = [os.path.realpath(p) for p in roots.get("write", ())]
    lines = stderr_tail.splitlines()[-MAX_LINES:]
    for line in reversed(lines):
        if not _DENIED.search(line):
            continue
        for path in _QUOTED.findall(line) or _BARE.findall(line):
            found = _candidate(path.rstrip("."), line.strip(), protected, writable)
            if found is not None:
                return found
    return None
