"""``--token-header NAME``: the token also accepted from a header a proxy does not strip.

agent-sandbox's router drops ``Authorization`` before forwarding, so behind it the token
must travel in another header. One real daemon (``--token T --token-header
X-Acp-Serve-Token``); the Python SDK, the CLI and ``acp-serve attach`` send it; the
WebSocket upgrade of ``/acp`` is checked on a raw socket. Start-up refusals run the parser.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import trio

from serve.client import AcpServeClient, SyncAcpServeClient
from serve.settings import SettingsError, parse_settings
from tests.support.daemon import ROOT, DaemonProcess, spawn_daemon

TOKEN = "tenant-token-0123456789abcdef"
HEADER = "X-Acp-Serve-Token"
UNAUTHORIZED = {"error": "Unauthorized"}


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    d = spawn_daemon(["--token-header", HEADER], env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def http(daemon: DaemonProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        yield client


def test_the_header_carries_the_token(http: httpx.Client) -> None:
    assert http.get("/capabilities", headers={HEADER: TOKEN}).status_code == 200
    # Any case of the name.
    assert http.get("/capabilities", headers={HEADER.lower(): TOKEN}).status_code == 200
    created = http.post("/session", json={}, headers={HEADER: TOKEN})
    assert created.status_code == 200, created.text
    # Authorization keeps working beside it.
    ok = http.get("/capabilities", headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {HEADER: TOKEN[:-1]},
        {HEADER: TOKEN + "x"},
        {HEADER: f"Bearer {TOKEN}"},  # the bare token, no scheme
        {HEADER: ""},
        {"X-Other-Token": TOKEN},
    ],
    ids=["none", "short", "long", "scheme", "empty", "other-header"],
)
def test_a_wrong_header_gets_the_uniform_401(http: httpx.Client, headers: dict[str, str]) -> None:
    response = http.post("/session", json={}, headers=headers)
    assert response.status_code == 401
    assert response.json() == UNAUTHORIZED


def test_the_header_twice_is_refused(daemon: DaemonProcess) -> None:
    status, _ = _raw(
        daemon.port,
        f"GET /capabilities HTTP/1.1\r\nHost: 127.0.0.1:{daemon.port}\r\n"
        f"{HEADER}: {TOKEN}\r\n{HEADER}: {TOKEN}\r\nConnection: close\r\n\r\n",
    )
    assert status == 401


def _raw(port: int, request: str) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request.encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    return int(data.split(b" ", 2)[1]), data


@pytest.mark.parametrize(("value", "status"), [(TOKEN, 101), ("wrong-token", 401)])
def test_the_acp_websocket_upgrade_takes_the_header(
    daemon: DaemonProcess, value: str, status: int
) -> None:
    key = base64.b64encode(os.urandom(16)).decode()
    got, _ = _raw(
        daemon.port,
        f"GET /acp HTTP/1.1\r\nHost: 127.0.0.1:{daemon.port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        f"{HEADER}: {value}\r\n\r\n",
    )
    assert got == status


def test_the_sdk_sends_the_header(daemon: DaemonProcess) -> None:
    async def main() -> tuple[str, str]:
        async with AcpServeClient(daemon.url, TOKEN, token_header=HEADER) as client:
            session = await client.create_session()
            without = AcpServeClient(daemon.url, TOKEN, token_header="X-Not-It")
            try:
                await without.create_session()
            except Exception as exc:  # the SDK's 401 error
                refused = type(exc).__name__
            else:
                refused = "accepted"
            finally:
                await without.aclose()
            return session.session_id, refused

    session_id, refused = trio.run(main)
    assert session_id
    assert refused != "accepted"
    with SyncAcpServeClient(daemon.url, TOKEN, token_header=HEADER) as sync:
        assert sync.create_session().session_id


def test_the_cli_sends_the_header(daemon: DaemonProcess) -> None:
    env = {k: v for k, v in os.environ.items() if k != "QWEN_SERVER_TOKEN"}
    env["QWEN_SERVER_TOKEN"] = TOKEN

    def caps(header: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "serve.client", "--url", daemon.url, "--token-header"]
        return subprocess.run(
            [*argv, header, "--json", "caps"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )

    # The token goes in the named header, not in Authorization: a header the daemon does
    # not read is refused.
    assert caps("X-Not-It").returncode != 0
    accepted = caps(HEADER)
    assert accepted.returncode == 0, accepted.stderr
    assert "features" in accepted.stdout


def test_attach_sends_the_header(daemon: DaemonProcess) -> None:
    env = {k: v for k, v in os.environ.items() if k != "QWEN_SERVER_TOKEN"}
    env.update(QWEN_SERVER_TOKEN=TOKEN, ACP_SERVE_TOKEN_HEADER=HEADER)
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}
    assert _attach_initialize(daemon, {**env, "ACP_SERVE_TOKEN_HEADER": "X-Not-It"}, init) is None
    reply = _attach_initialize(daemon, env, init)
    assert reply is not None
    assert reply["id"] == 1
    assert reply["result"]["protocolVersion"] == 1, reply


def _attach_initialize(
    daemon: DaemonProcess, env: dict[str, str], init: dict[str, object]
) -> dict[str, Any] | None:
    """The reply to ``initialize`` through a spawned ``acp-serve attach``, None on an error."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "serve", "attach", daemon.url],
        env=env,
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(init) + "\n")
        proc.stdin.flush()
        reply: dict[str, Any] = json.loads(proc.stdout.readline() or "{}")
    finally:
        proc.kill()
        proc.wait()
    return reply if "result" in reply else None


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--token-header", "X-Acp-Serve-Token"], {}, "--token-header needs a token"),
        (["--token-header", "Authorization"], {"QWEN_SERVER_TOKEN": TOKEN}, "reserved"),
        (["--token-header", "X-Sandbox-ID"], {"QWEN_SERVER_TOKEN": TOKEN}, "reserved"),
        (["--token-header", "X Token"], {"QWEN_SERVER_TOKEN": TOKEN}, "not an HTTP header"),
    ],
)
def test_bad_token_header_flags_refused(
    args: list[str], env: dict[str, str], message: str, tmp_path: object
) -> None:
    with pytest.raises(SettingsError, match=message):
        parse_settings(["--workspace", str(tmp_path), *args], env)
