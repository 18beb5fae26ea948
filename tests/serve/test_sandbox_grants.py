"""Operator grants and clear refusals of the agents' file sandbox (serve/isolation/sandbox.py,
serve/isolation/denials.py): ``--agent-allow-write`` and ``sandbox.allowWrite`` validated at
start, an agent writing to a granted directory works, and without the grant the create answers
``agent_sandbox_denied`` naming the path and the flag (not retryable), as ``/readyz`` and
``/daemon/status`` do. A real daemon, a real agent (tests/serve/sandbox_logging_agent.py), the
real kernel."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from acp import landlock
from serve.config import load_daemon_config, with_config_grants
from serve.isolation.denials import explain
from serve.settings import SettingsError, parse_settings
from tests.conftest import AUTH, TOKEN
from tests.support.daemon import ROOT, DaemonProcess, running_daemon

AGENT = Path(__file__).with_name("sandbox_logging_agent.py")
needs_landlock = pytest.mark.skipif(landlock.abi_version() < 1, reason="needs Landlock")


@pytest.fixture
def logdir(tmp_path: Path) -> Path:
    path = tmp_path / "agent-logs"
    path.mkdir()
    return path


@contextmanager
def _daemon(logdir: Path, *extra: str) -> Iterator[DaemonProcess]:
    with running_daemon(
        ["--agent", f"{sys.executable} {AGENT} {logdir}", "--warm-agents", "0", *extra],
        env={"QWEN_SERVER_TOKEN": TOKEN},
    ) as daemon:
        yield daemon


# ---- end to end ---------------------------------------------------------------------------


@needs_landlock
def test_without_the_grant_the_create_says_which_path_and_which_flag(logdir: Path) -> None:
    with _daemon(logdir) as daemon:
        with httpx.Client(base_url=daemon.url, headers=AUTH, timeout=60) as client:
            for _ in range(2):  # the first spawns and fails; the second is answered at once
                r = client.post("/session", json={})
                assert r.status_code == 503, r.text
                body = r.json()
                assert body["code"] == "agent_sandbox_denied", body
                assert body["retryable"] is False
                assert "retry-after" not in r.headers
                assert body["path"] == str(logdir / "agent.log")
                assert body["grantFlag"] == f"--agent-allow-write {logdir}"
                assert f"--agent-allow-write {logdir}" in body["error"]
                assert "PermissionError" in body["error"]  # the agent's own words
            ready = client.get("/readyz")
            assert ready.status_code == 503
            assert ready.json()["reason"] == "agent_sandbox_denied"
            [denied] = ready.json()["sandboxDenied"]
            assert (denied["path"], denied["grantFlag"]) == (body["path"], body["grantFlag"])
            issues = client.get("/daemon/status").json()["issues"]
            [issue] = [i for i in issues if i["code"] == "agent_sandbox_denied"]
            assert f"--agent-allow-write {logdir}" in issue["message"]
    assert not (logdir / "agent.log").exists()


@needs_landlock
def test_a_warm_child_refused_a_path_after_initialize_is_the_sandboxs_refusal(
    logdir: Path,
) -> None:
    """The warm spare answers ``initialize``, then dies when it writes its log: that death
    is classified too (the pool is failing with the refusal, a create gets it at once)."""
    agent = f"{sys.executable} {AGENT} --late {logdir}"
    with running_daemon(
        ["--agent", agent, "--warm-agents", "1"], env={"QWEN_SERVER_TOKEN": TOKEN}
    ) as daemon:
        with httpx.Client(base_url=daemon.url, headers=AUTH, timeout=60) as client:
            deadline = time.monotonic() + 30
            while client.get("/readyz").json().get("reason") != "agent_sandbox_denied":
                assert time.monotonic() < deadline, client.get("/daemon/status").json()
                time.sleep(0.1)
            r = client.post("/session", json={})
            assert r.status_code == 503, r.text
            body = r.json()
            assert (body["code"], body["retryable"]) == ("agent_sandbox_denied", False), body
            assert body["grantFlag"] == f"--agent-allow-write {logdir}"
    assert not (logdir / "agent.log").exists()


@needs_landlock
def test_with_the_grant_the_agent_writes_there(logdir: Path) -> None:
    with _daemon(logdir, "--agent-allow-write", str(logdir)) as daemon:
        with httpx.Client(base_url=daemon.url, headers=AUTH, timeout=60) as client:
            r = client.post("/session", json={})
            assert r.status_code == 200, f"{r.text}\n{daemon.stderr()[-2000:]}"
            assert client.get("/readyz").json()["status"] == "ready"
            sandbox = client.get("/daemon/status").json()["isolation"]["sandbox"]
            assert sandbox["allowWrite"] == [str(logdir)]
            assert str(logdir) in sandbox["roots"]["write"]
    assert (logdir / "agent.log").read_text().startswith("started ")


@needs_landlock
def test_a_grant_does_not_open_the_protected_places(tmp_path: Path, logdir: Path) -> None:
    """A grant holding the state directory (the daemon's journals) leaves it carved out."""
    state = logdir / "state"
    with running_daemon(
        [
            "--agent",
            f"{sys.executable} {AGENT} {state}",
            "--warm-agents",
            "0",
            "--agent-allow-write",
            str(logdir),
        ],
        state_dir=state,
        env={"QWEN_SERVER_TOKEN": TOKEN},
    ) as daemon:
        with httpx.Client(base_url=daemon.url, headers=AUTH, timeout=60) as client:
            r = client.post("/session", json={})
            assert r.status_code == 503 and r.json()["code"] == "agent_sandbox_denied", r.text
            assert r.json()["path"] == str(state / "agent.log")
            assert r.json()["grantFlag"] is None  # a protected place: no flag grants it
    assert not (state / "agent.log").exists()


# ---- validation at start ------------------------------------------------------------------


def _parse(tmp_path: Path, *args: str) -> tuple[str, ...]:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    argv = ["--workspace", str(ws), "--state-dir", str(tmp_path / "state"), *args]
    return parse_settings(argv, {"HOME": str(tmp_path)}).agent_allow_write


def test_grants_are_canonical_and_repeatable(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "b")
    grants = _parse(
        tmp_path,
        *("--agent-allow-write", str(tmp_path / "a")),
        *("--agent-allow-write", str(tmp_path / "link")),
    )
    assert grants == (str(tmp_path / "a"), str(tmp_path / "b"))
    # A grant holding the state directory and the workspace is fine (they are carved out).
    assert _parse(tmp_path, "--agent-allow-write", str(tmp_path)) == (str(tmp_path),)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("relative/dir", 'Invalid --agent-allow-write "relative/dir": must be an absolute path'),
        ("{tmp}/missing", 'Invalid --agent-allow-write "{tmp}/missing": directory does not exist'),
        ("{tmp}/file", 'Invalid --agent-allow-write "{tmp}/file": not a directory'),
        (
            "{tmp}/state/journal",
            'Invalid --agent-allow-write "{tmp}/state/journal": is inside the state directory '
            "{tmp}/state (journals, credentials), which agents may never write",
        ),
        (
            "{tmp}/ws",
            'Invalid --agent-allow-write "{tmp}/ws": is the workspace {tmp}/ws: its own agents '
            "write it already, and a grant (for every agent) would let the other workspaces' "
            "agents write it",
        ),
    ],
)
def test_a_bad_grant_stops_start_up_naming_it(tmp_path: Path, value: str, message: str) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "state" / "journal").mkdir(parents=True)
    with pytest.raises(SettingsError) as caught:
        _parse(tmp_path, "--agent-allow-write", value.format(tmp=tmp_path))
    assert str(caught.value) == message.format(tmp=tmp_path)


def test_the_config_file_grants_too_and_is_validated_the_same(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "ws").mkdir()
    config = tmp_path / "acp-serve.yaml"
    config.write_text(f"sandbox:\n  allowWrite: [{tmp_path / 'logs'}]\n")
    argv = ["--workspace", str(tmp_path / "ws"), "--config", str(config)]
    settings = parse_settings(argv, {"HOME": str(tmp_path)})
    merged = with_config_grants(settings, load_daemon_config(settings))
    assert merged.agent_allow_write == (str(tmp_path / "logs"),)
    config.write_text(f"sandbox:\n  allowWrite: [{tmp_path / 'ws'}]\n")
    with pytest.raises(SettingsError, match=r"at sandbox.allowWrite \"[^\"]+/ws\": is the work"):
        with_config_grants(settings, load_daemon_config(settings))
    # The CLI: exit 1 with the message, nothing started.
    result = subprocess.run(
        [sys.executable, "-m", "serve", *argv, "--port", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert f"config {config} at sandbox.allowWrite" in result.stderr


# ---- reading a refusal out of an agent's stderr --------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        "Error: EACCES: permission denied, mkdir '{p}'",  # node
        "PermissionError: [Errno 13] Permission denied: '{p}'",  # Python
        "bash: {p}: Permission denied",  # shells
        "touch: cannot touch '{p}': Permission denied",  # coreutils
        "open {p}: permission denied",  # Go
        'Error: failed to create "{p}": Permission denied (os error 13)',  # Rust
        "Error: EPERM: operation not permitted, open '{p}'",  # node, EPERM
    ],
)
def test_the_runtimes_ways_of_saying_it_are_read(tmp_path: Path, line: str) -> None:
    target = tmp_path / "out" / "x.log"
    target.parent.mkdir()
    stderr = f"starting\n{line.format(p=target)}\n    at Object.mkdirSync (node:fs:1372:26)\n"
    found = explain(stderr, {"write": [str(tmp_path / "ws")], "protected": []})
    assert found is not None
    assert (found.path, found.grant) == (str(target), str(target.parent))
    assert found.flag == f"--agent-allow-write {target.parent}"


def test_a_path_inside_the_rules_or_no_path_is_not_the_sandbox(tmp_path: Path) -> None:
    roots = {"write": [str(tmp_path)], "protected": [str(tmp_path / "state")]}
    inside = f"PermissionError: [Errno 13] Permission denied: '{tmp_path / 'x'}'"
    assert explain(inside, roots) is None  # the file mode refused it, not the sandbox
    assert explain("Error: permission denied (no path)\n", roots) is None
    assert explain("ENOENT: no such file or directory, open '/nope/x'", roots) is None
    protected = f"EACCES: permission denied, open '{tmp_path / 'state' / 'journal'}'"
    found = explain(protected, roots)
    assert found is not None and found.grant is None and found.flag is None
