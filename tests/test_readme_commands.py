"""The README's commands run as written, on the install ``scripts/serve`` makes (issue 46).

A newcomer copies them: ``acp-serve-client --url $U chat`` was ``command not found`` (the
entry points are in ``.venv/bin``, not on ``PATH``), and an editor was told to run a bare
``acp-serve attach``. Here every command the README shows that names an entry point must
name it by a path that exists, and the quick start's curl, client and attach commands run
against a daemon (the README's port replaced by the test daemon's, and the event stream,
which runs until Ctrl-C, given a time limit).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.daemon import running_daemon

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
VENV_BIN = ROOT / ".venv" / "bin"
FENCE = re.compile(r"^```(\w*)$")
INLINE = re.compile(r"`([^`]+)`")
ENTRY = re.compile(r"(^|/)acp-serve(-client)?$")
#: The README's daemon URL (scripts/serve's default port).
README_URL = "http://127.0.0.1:4170"
PLACEHOLDER = "/path/to/acp-serve/"
GUARD_S = 60


def blocks() -> list[str]:
    """The README's fenced bash blocks, in order."""
    out: list[str] = []
    current: list[str] | None = None
    fenced = False
    for line in README.read_text().splitlines():
        m = FENCE.match(line)
        if m and not fenced:
            fenced, current = True, [] if m.group(1) in ("bash", "sh") else None
        elif line.startswith("```") and fenced:
            if current is not None:
                out.append("\n".join(current))
            fenced, current = False, None
        elif current is not None:
            current.append(line)
    return out


def commands() -> list[str]:
    """Every command-like text: lines of fenced blocks, and inline code with a URL or a flag."""
    out = [line for block in blocks() for line in block.splitlines()]
    fenced = False
    for line in README.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            out += [c for c in INLINE.findall(line) if "http://" in c or " --" in c]
    return out


def test_every_entry_point_the_readme_shows_is_called_where_it_is() -> None:
    wrong = []
    for command in commands():
        for part in re.split(r"\||;|&&|\$\(|\{|\}", command):
            words = part.split()
            if not words or not ENTRY.search(words[0]):
                continue
            path = words[0].replace(PLACEHOLDER, "")  # the clone's absolute path
            if not (path.startswith(".venv/bin/") and (ROOT / path).exists()):
                wrong.append(command)
    assert wrong == [], f"not runnable as written from the repository root: {wrong}"


@pytest.mark.skipif(not (VENV_BIN / "acp-serve-client").exists(), reason="no .venv install")
@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_quick_start_commands_run(tmp_path: Path) -> None:
    found = blocks()
    curl_block = next(b for b in found if "/session/$S/prompt" in b)
    client_block = next(b for b in found if "acp-serve-client" in b)
    attach_block = next(b for b in found if " attach " in b)

    with running_daemon(workspace=ROOT, state_dir=tmp_path / "state") as daemon:

        def bash(block: str, stdin: str = "") -> str:
            script = block.replace(README_URL, daemon.url)
            script = script.replace("curl -sN ", "curl -sN --max-time 3 ")  # for Ctrl-C
            # The attach example's pause before stdin closes (the bridge then exits at
            # once): long enough for session/new on a loaded machine.
            script = script.replace("sleep 2;", "sleep 10;")
            done = subprocess.run(
                ["bash", "-c", script],
                cwd=ROOT,
                input=stdin,
                capture_output=True,
                text=True,
                timeout=GUARD_S,
            )
            return done.stdout + done.stderr

        out = bash(curl_block)
        assert '"stopReason":"end_turn"' in out.replace(" ", ""), out
        assert "echo: hello" in out and "turn_complete" in out, out

        out = bash(client_block, stdin="hello from the readme\n")
        assert "echo: hello from the readme" in out, out
        assert "command not found" not in out

        out = bash(attach_block)
        assert '"id":1,"result"' in out.replace(" ", ""), out
        assert '"id":2,"result"' in out.replace(" ", ""), out
