"""Late binding (``--bootstrap-token``, ``POST /daemon/bind``) against real daemons.

A warm daemon starts with a pool-scoped bootstrap token: before the bind it serves only
the probes and the bind; bad binds change nothing (no token, no file, no clone) and leave
it bindable; the bind clones a local git repository into the empty workspace, writes the
credential files into the agents' home, gives the agents the tenant's variables, installs
the tenant's token and revokes the bootstrap token; a second bind is refused.
"""

from __future__ import annotations

import base64
import os
import shutil
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from serve.settings import SettingsError, parse_settings
from tests.support.daemon import DaemonProcess, spawn_daemon

BOOT = "bootstrap-token-pool-0123456789"
TENANT = "tenant-token-abcdef0123456789"
HEADER = "X-Acp-Serve-Token"
BOOT_AUTH = {"Authorization": f"Bearer {BOOT}"}
TENANT_AUTH = {"Authorization": f"Bearer {TENANT}"}

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("origin")
    _git(path, "init", "-q", "-b", "main")
    (path / "README.md").write_text("tenant project\n")
    _git(path, "add", "README.md")
    _git(path, "commit", "-q", "-m", "first")
    return path


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def daemon(home: Path) -> Iterator[DaemonProcess]:
    d = spawn_daemon(
        ["--public-probes", "--token-header", HEADER],
        env={"ACP_SERVE_BOOTSTRAP_TOKEN": BOOT, "HOME": str(home)},
    )
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def http(daemon: DaemonProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=daemon.url, timeout=60) as client:
        yield client


def _bind(http: httpx.Client, body: dict[str, Any], auth: dict[str, str]) -> httpx.Response:
    return http.post("/daemon/bind", json=body, headers=auth)


def _agent_pids(http: httpx.Client, auth: dict[str, str]) -> list[int]:
    status = http.get("/daemon/status", params={"detail": "full"}, headers=auth).json()
    pids: list[int] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("pid"), int) and "slots" in node:
                pids.append(node["pid"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(status)
    return pids


# The tests of this module run in order against one daemon: before, bad binds, the bind, after.


def test_before_the_bind_only_probes_and_the_bind_are_served(
    daemon: DaemonProcess, http: httpx.Client
) -> None:
    assert http.get("/health").status_code == 200
    assert http.get("/readyz").status_code == 200
    for method, path in (("GET", "/capabilities"), ("POST", "/session"), ("GET", "/session")):
        refused = http.request(
            method, path, headers=BOOT_AUTH, json={} if method == "POST" else None
        )
        assert refused.status_code == 403, (path, refused.text)
        assert refused.json()["code"] == "daemon_not_bound"
        assert http.request(method, path).status_code == 401
    # The /acp WebSocket upgrade too.
    key = base64.b64encode(os.urandom(16)).decode()
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as sock:
        sock.sendall(
            f"GET /acp HTTP/1.1\r\nHost: 127.0.0.1:{daemon.port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Authorization: Bearer {BOOT}\r\n\r\n".encode()
        )
        assert sock.recv(4096).split(b" ", 2)[1] == b"403"
    # No agent runs before the bind: it would not have the tenant's environment.
    assert not any(
        p.name.isdigit() and _is_child_of(int(p.name), daemon.proc.pid)
        for p in Path("/proc").iterdir()
    )


def _is_child_of(pid: int, parent: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return int(fields[1]) == parent


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"token": TENANT, "templateRef": "x"}, None),  # unknown member
        ({"token": "short"}, "token"),
        ({"token": TENANT, "agentEnv": {"1BAD": "x"}}, "agentEnv"),
        ({"token": TENANT, "agentEnv": {"QWEN_CODE_NO_RELAUNCH": "x"}}, "agentEnv"),
        ({"token": TENANT, "credentials": [{"path": "../escape", "content": "x"}]}, "credentials"),
        ({"token": TENANT, "credentials": [{"path": "/etc/x", "content": "x"}]}, "credentials"),
        ({"token": TENANT, "workspace": {"path": "/nonexistent/dir"}}, "workspace.path"),
        ({"token": TENANT, "workspace": {"path": "/tmp"}}, "workspace.path"),
        ({"token": TENANT, "workspace": {"repository": "ext::sh -c id"}}, "workspace.repository"),
        ({"token": TENANT, "workspace": {"repository": "-uhttps://x"}}, "workspace.repository"),
        (
            {"token": TENANT, "workspace": {"repository": "file:///x", "ref": "--upload-pack=x"}},
            "workspace.ref",
        ),
    ],
)
def test_a_bad_bind_changes_nothing(
    daemon: DaemonProcess, http: httpx.Client, home: Path, body: dict[str, Any], field: str | None
) -> None:
    # A valid credential file rides along: it must not be written when another member is bad.
    body = {**body, "credentials": body.get("credentials", [])}
    body["credentials"] = [*body["credentials"], {"path": "ok/creds.json", "content": "{}"}]
    response = _bind(http, body, BOOT_AUTH)
    assert response.status_code == 400, response.text
    assert response.json()["code"] in ("invalid_bind",)
    if field is not None:
        assert response.json()["field"] == field
    assert not (home / "ok").exists()
    assert list(daemon.workspace.iterdir()) == []
    # Still unbound: the tenant token is not accepted, the bootstrap token still is.
    assert http.get("/capabilities", headers=TENANT_AUTH).status_code == 401
    assert http.get("/capabilities", headers=BOOT_AUTH).status_code == 403


def test_a_failed_clone_changes_nothing(
    daemon: DaemonProcess, http: httpx.Client, home: Path, tmp_path: Path
) -> None:
    body = {
        "token": TENANT,
        "workspace": {"repository": (tmp_path / "no-such-repo").as_uri()},
        "credentials": [{"path": "ok/creds.json", "content": "{}"}],
    }
    response = _bind(http, body, BOOT_AUTH)
    assert response.status_code == 422, response.text
    assert response.json()["code"] == "bind_failed"
    assert "git clone failed" in response.json()["error"]
    assert list(daemon.workspace.iterdir()) == []
    assert not (home / "ok").exists()
    assert http.get("/capabilities", headers=TENANT_AUTH).status_code == 401


def test_the_bind(daemon: DaemonProcess, http: httpx.Client, home: Path, repo: Path) -> None:
    body = {
        "token": TENANT,
        "workspace": {"repository": repo.as_uri(), "ref": "main"},
        "agentEnv": {"TENANT_MARKER": "marker-value-42"},
        "credentials": [{"path": ".config/tenant/creds.json", "content": '{"key":"s3cret"}'}],
    }
    response = _bind(http, body, {HEADER: BOOT})
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["bound"] is True
    assert answer["cloned"] is True
    assert answer["agentEnv"] == ["TENANT_MARKER"]
    assert "s3cret" not in response.text and TENANT not in response.text
    # The repository is the workspace now (no temporary directory left behind).
    assert (daemon.workspace / "README.md").read_text() == "tenant project\n"
    assert sorted(p.name for p in daemon.workspace.iterdir()) == [".git", "README.md"]
    creds = home / ".config" / "tenant" / "creds.json"
    assert creds.read_text() == '{"key":"s3cret"}'
    assert stat.S_IMODE(creds.stat().st_mode) == 0o600


def test_after_the_bind(daemon: DaemonProcess, http: httpx.Client) -> None:
    # The bootstrap token is revoked, on both headers.
    for auth in (BOOT_AUTH, {HEADER: BOOT}):
        assert http.get("/capabilities", headers=auth).status_code == 401
        assert _bind(http, {"token": "another-token-0123456789"}, auth).status_code == 401
    # The tenant's token works, on both headers.
    caps = http.get("/capabilities", headers={HEADER: TENANT})
    assert caps.status_code == 200
    assert "daemon_late_bind" in caps.json()["features"]
    created = http.post("/session", json={}, headers=TENANT_AUTH)
    assert created.status_code == 200, created.text
    session_id = created.json()["sessionId"]
    prompt = http.post(
        f"/session/{session_id}/prompt",
        json={"prompt": [{"type": "text", "text": "hi"}]},
        headers=TENANT_AUTH,
    )
    assert prompt.status_code == 200, prompt.text
    # The agents run with the tenant's variable.
    deadline = time.monotonic() + 10
    environs: list[bytes] = []
    while time.monotonic() < deadline:
        environs = []
        for pid in _agent_pids(http, TENANT_AUTH):
            try:
                environs.append(Path(f"/proc/{pid}/environ").read_bytes())
            except OSError:
                pass
        if environs:
            break
        time.sleep(0.1)
    assert environs
    assert all(b"TENANT_MARKER=marker-value-42\0" in e for e in environs)
    security = http.get("/daemon/status", headers=TENANT_AUTH).json()["security"]
    assert security["lateBinding"] == {"enabled": True, "bound": True}
    assert security["tokenHeader"] == HEADER.lower()
    # A second bind is refused.
    again = _bind(http, {"token": "another-token-0123456789"}, TENANT_AUTH)
    assert again.status_code == 409
    assert again.json()["code"] == "already_bound"
    assert "marker-value-42" not in daemon.stderr() and TENANT not in daemon.stderr()


def test_a_daemon_with_its_own_token_has_nothing_to_bind() -> None:
    d = spawn_daemon(env={"QWEN_SERVER_TOKEN": TENANT})
    try:
        with httpx.Client(base_url=d.url, timeout=30) as http:
            response = _bind(http, {"token": "another-token-0123456789"}, TENANT_AUTH)
            assert response.status_code == 409
            assert response.json()["code"] == "not_late_bound"
            assert http.get("/capabilities", headers=TENANT_AUTH).status_code == 200
    finally:
        d.stop()


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--bootstrap-token", BOOT, "--token", TENANT], {}, "cannot be combined"),
        (
            [],
            {"ACP_SERVE_BOOTSTRAP_TOKEN": BOOT, "QWEN_SERVER_TOKEN": TENANT},
            "cannot be combined",
        ),
        (["--bootstrap-token", "short"], {}, "shorter than 16"),
        (["--bootstrap-token", "  "], {}, "empty"),
    ],
)
def test_bad_bootstrap_flags_refused(
    args: list[str], env: dict[str, str], message: str, tmp_path: Path
) -> None:
    with pytest.raises(SettingsError, match=message):
        parse_settings(["--workspace", str(tmp_path), *args], env)


def test_bootstrap_settings(tmp_path: Path) -> None:
    settings = parse_settings(
        ["--workspace", str(tmp_path), "--hostname", "0.0.0.0", "--require-auth"],
        {"ACP_SERVE_BOOTSTRAP_TOKEN": BOOT},
    )
    assert settings.bootstrap is True
    assert settings.token == BOOT
    assert settings.token_generated is False


def test_a_resumed_sandbox_binds_again_and_restores_its_sessions(
    tmp_path: Path, repo: Path
) -> None:
    """After a suspend/resume the pod starts unbound from the template again: the claimer
    binds with the workspace already on the volume and the sessions come back from the
    journal."""
    dirs = {"workspace": tmp_path / "ws", "state_dir": tmp_path / "state"}
    env = {"ACP_SERVE_BOOTSTRAP_TOKEN": BOOT, "HOME": str(tmp_path / "home")}
    d = spawn_daemon(["--public-probes"], env=env, **dirs)  # type: ignore[arg-type]
    try:
        with httpx.Client(base_url=d.url, timeout=60) as http:
            body = {"token": TENANT, "workspace": {"repository": repo.as_uri()}}
            assert _bind(http, body, BOOT_AUTH).status_code == 200
            sid = http.post("/session", json={}, headers=TENANT_AUTH).json()["sessionId"]
            prompt = http.post(
                f"/session/{sid}/prompt",
                json={"prompt": [{"type": "text", "text": "before the suspend"}]},
                headers=TENANT_AUTH,
            )
            assert prompt.status_code == 200, prompt.text
    finally:
        assert d.stop() == 0
    d = spawn_daemon(["--public-probes"], env=env, **dirs)  # type: ignore[arg-type]
    try:
        with httpx.Client(base_url=d.url, timeout=60) as http:
            assert http.get("/capabilities", headers=TENANT_AUTH).status_code == 401
            clone = _bind(http, body, BOOT_AUTH)
            assert clone.status_code == 400 and clone.json()["field"] == "workspace.repository"
            again = {"token": TENANT, "workspace": {"path": str(d.workspace)}}
            assert _bind(http, again, BOOT_AUTH).status_code == 200
            loaded = http.post(f"/session/{sid}/load", json={}, headers=TENANT_AUTH)
            assert loaded.status_code == 200, loaded.text
            with http.stream(
                "GET", f"/session/{sid}/events", headers={**TENANT_AUTH, "Last-Event-ID": "0"}
            ) as stream:
                text = ""
                for line in stream.iter_lines():
                    text += line
                    if "replay_complete" in line:
                        break
            assert "before the suspend" in text
    finally:
        d.stop()
