"""Real clients, unchanged, against the real daemon (scripted agent) over /acp.

* the published ``@qwen-code/sdk`` 0.1.14 ``DaemonClient`` over ``AcpHttpTransport`` and over
  ``AcpWsTransport``: health (``_qwen/health``), create, a streamed prompt, a permission
  answered, heartbeat, close (which the reference's reply makes throw);
* the official ``@agentclientprotocol/sdk`` 2.4.0 client over ``createHttpStream``, over
  ``createWebSocketStream``, and over stdio through a spawned ``acp-serve attach``:
  initialize, new, two prompts (one asks permission, answered through the client's
  handler), list, close (which the reference rejects).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TOKEN
from tests.support.daemon import DaemonProcess
from tests.support.node import INSTALL_SCRIPT, NODE_PREFIX, missing_node_reason

HERE = Path(__file__).parent
QWEN_SDK = NODE_PREFIX / "node_modules" / "@qwen-code" / "sdk" / "dist" / "daemon"
ACP_SDK = NODE_PREFIX / "node_modules" / "@agentclientprotocol" / "sdk"


@pytest.fixture(scope="module")
def node() -> str:
    reason = missing_node_reason()
    if reason is not None:
        pytest.skip(reason)
    if not (QWEN_SDK / "transports.js").is_file() or not (ACP_SDK / "package.json").is_file():
        subprocess.run([str(INSTALL_SCRIPT)], check=True, timeout=600, capture_output=True)
    assert (QWEN_SDK / "transports.js").is_file(), "install-node-deps did not install the sdk"
    assert (ACP_SDK / "package.json").is_file(), "install-node-deps did not install the ACP sdk"
    path = shutil.which("node")
    assert path is not None
    return path


def _run(node: str, script: str, *args: str, cwd: Path | None = None) -> dict:
    env = {**os.environ, "ACP_TEST_CWD": str(cwd) if cwd else ""}
    # Node 20 has WebSocket behind a flag (it is on by default from Node 22).
    result = subprocess.run(
        [node, "--experimental-websocket", str(HERE / script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("kind", ["http", "ws"])
def test_qwen_sdk_daemon_client_over_acp(node: str, daemon_proc: DaemonProcess, kind: str) -> None:
    out = _run(node, "qwen_sdk_flow.mjs", QWEN_SDK.as_uri(), daemon_proc.url, TOKEN, kind)
    assert out["transport"] == f"acp-{kind}"
    # Quirk 1: the SDK's health() calls _qwen/health, which qwen serve lacks.
    assert out["health"] == {"status": "ok"}
    assert out["session"]["attached"] is False
    assert out["session"]["clientId"].startswith("client_")
    assert out["firstStopReason"] == "end_turn"
    assert out["secondStopReason"] == "end_turn"
    assert out["text"] == "echo: hello over acp"
    assert out["permissionAnswered"] is True
    assert out["heartbeat"]["sessionId"] == out["session"]["sessionId"]
    # Quirk 2: closeSession resolves (qwen's 200 makes it throw).
    assert out["closed"] is True, out.get("closeError")
    assert "readerError" not in out
    seen = out["seen"]
    assert seen.count("turn_complete") == 2
    assert {"agent_message_chunk", "permission_request", "permission_resolved"} <= set(seen)
    assert seen[-1] == "session_closed"
    written = daemon_proc.workspace / f"acp-{kind}.txt"
    assert written.read_text() == f"written over {kind}"


@pytest.mark.parametrize("kind", ["http", "ws", "stdio"])
def test_official_acp_client(node: str, daemon_proc: DaemonProcess, kind: str) -> None:
    out = _run(
        node,
        "acp_sdk_flow.mjs",
        ACP_SDK.as_uri(),
        daemon_proc.url,
        TOKEN,
        kind,
        sys.executable,
        cwd=daemon_proc.workspace,
    )
    assert "error" not in out, out
    assert out["protocolVersion"] == 1
    assert out["loadSession"] is True
    assert out["firstStopReason"] == "end_turn"
    assert out["text"] == f"echo: hello over {kind}"
    # The child agent's permission request reached the client's handler; its answer was
    # the vote that let the write happen.
    assert out["permissions"] == 1
    assert out["permissionOptions"] == ["allow", "allow_always", "reject"]
    assert out["secondStopReason"] == "end_turn"
    assert (daemon_proc.workspace / f"acp-official-{kind}.txt").read_text() == f"official {kind}"
    assert out["listed"] is True
    # Quirk 3: session/close is answered before the session stream ends.
    assert out["closed"] is True
    assert {"available_commands_update", "agent_message_chunk", "tool_call"} <= set(out["updates"])
    if kind == "stdio":
        assert out["attachExit"] == 0
