"""Start-up refuses what cannot work, naming the flag and the value, in one short line.

A newcomer's mistakes (issue 46): a state directory that cannot be created or written (the
daemon used to start, answer ``/health`` ok and fail every create, blaming the agent), a busy
port given with ``--port`` (it used to move on to the next port and start a second daemon),
and a mistyped flag (61 lines of usage, no "did you mean").
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUARD_S = 30.0


def _acp_serve(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    """``acp-serve ARGS`` in a workspace of its own; it must exit by itself."""
    workspace = tmp / "ws"
    workspace.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("QWEN_SERVER_TOKEN",)}
    env["HOME"] = str(tmp)  # the default state dir, should a test not name one
    return subprocess.run(
        [sys.executable, "-m", "serve", "--workspace", str(workspace), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )


@pytest.mark.parametrize("where", ["under-a-file", "a-file", "in-proc"])
def test_a_state_dir_that_cannot_be_created_stops_start_up(tmp_path: Path, where: str) -> None:
    blocker = tmp_path / "plain-file"
    blocker.write_text("not a directory\n")
    state_dir = {
        "under-a-file": blocker / "state",
        "a-file": blocker,
        "in-proc": Path("/proc/acp-serve-state-test"),
    }[where]
    done = _acp_serve("--port", "0", "--state-dir", str(state_dir), tmp=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "listening" not in done.stdout  # it never served /health
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "--state-dir" in lines[0] and str(state_dir) in lines[0], lines[0]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through directory permissions")
def test_a_state_dir_that_cannot_be_written_stops_start_up(tmp_path: Path) -> None:
    state_dir = tmp_path / "read-only"
    state_dir.mkdir(mode=0o500)
    try:
        done = _acp_serve("--port", "0", "--state-dir", str(state_dir), tmp=tmp_path)
    finally:
        state_dir.chmod(0o700)
    assert done.returncode == 1, done.stderr
    assert "not writable" in done.stderr and str(state_dir) in done.stderr


def test_a_busy_port_given_with_the_flag_is_refused(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = _acp_serve("--port", str(port), "--state-dir", str(tmp_path / "state"), tmp=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "listening" not in done.stdout, done.stdout  # no second daemon on another port
    assert "trying" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert f"--port {port}" in last and "in use" in last, done.stderr


def test_an_unknown_flag_is_one_line_with_did_you_mean(tmp_path: Path) -> None:
    done = _acp_serve("--prot", "4171", tmp=tmp_path)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "--prot" in lines[0] and "did you mean --port?" in lines[0], lines[0]
    assert "--help" in lines[0]


def test_help_is_grouped_and_names_every_default(tmp_path: Path) -> None:
    done = _acp_serve("--help", tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    headings = [line[:-1] for line in text.splitlines() if line and line.endswith(":")]
    for section in ("serving", "agents", "isolation", "sessions", "multi-user", "observability"):
        assert section in headings, headings
    # Every flag's entry says its default.
    entries: list[str] = []
    for line in text.splitlines():
        if line.startswith("  --"):
            entries.append(line)
        elif line.startswith("    ") and entries:
            entries[-1] += " " + line.strip()
    assert len(entries) > 60
    missing = [e.split()[0] for e in entries if "default" not in e]
    assert missing == [], missing


@pytest.mark.parametrize("what", ["missing", "a-file"])
def test_a_shared_dir_that_is_not_a_directory_stops_start_up(tmp_path: Path, what: str) -> None:
    shared = tmp_path / "shared"
    if what == "a-file":
        shared.write_text("not a directory\n")
    done = _acp_serve(
        "--port",
        "0",
        "--state-dir",
        str(tmp_path / "state"),
        "--shared-dir",
        str(shared),
        tmp=tmp_path,
    )
    assert done.returncode == 1, done.stderr
    assert "listening" not in done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "--shared-dir" in lines[0] and str(shared) in lines[0], lines[0]
    expected = "does not exist" if what == "missing" else "not a directory"
    assert expected in lines[0], lines[0]
    assert not shared.is_dir()  # a missing mount is never made a local directory


@pytest.mark.parametrize("where", ["mode-0500", "in-proc"])
def test_a_shared_dir_that_cannot_be_written_stops_start_up(tmp_path: Path, where: str) -> None:
    if where == "mode-0500" and os.geteuid() == 0:
        pytest.skip("root writes through directory permissions")
    shared = tmp_path / "read-only" if where == "mode-0500" else Path("/proc/sys")
    if where == "mode-0500":
        shared.mkdir(mode=0o500)
    try:
        done = _acp_serve(
            "--port",
            "0",
            "--state-dir",
            str(tmp_path / "state"),
            "--shared-dir",
            str(shared),
            tmp=tmp_path,
        )
    finally:
        if where == "mode-0500":
            shared.chmod(0o700)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "--shared-dir" in lines[0] and "not writable" in lines[0] and str(shared) in lines[0]
