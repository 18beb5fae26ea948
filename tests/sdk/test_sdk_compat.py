"""The published TypeScript SDK (@qwen-code/sdk DaemonClient) drives acp-serve unchanged."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import TOKEN
from tests.support.daemon import DaemonProcess
from tests.support.node import INSTALL_SCRIPT, NODE_PREFIX, missing_node_reason

SDK_DAEMON = NODE_PREFIX / "node_modules" / "@qwen-code" / "sdk" / "dist" / "daemon" / "index.js"
SCRIPT = Path(__file__).with_name("sdk_flow.mjs")


@pytest.fixture(scope="module")
def sdk_module() -> Path:
    reason = missing_node_reason()
    if reason is not None:
        pytest.skip(reason)
    if not SDK_DAEMON.is_file():
        subprocess.run([str(INSTALL_SCRIPT)], check=True, timeout=600, capture_output=True)
    assert SDK_DAEMON.is_file(), "scripts/install-node-deps did not install @qwen-code/sdk"
    return SDK_DAEMON


def test_daemon_client_full_flow(sdk_module: Path, daemon_proc: DaemonProcess) -> None:
    node = shutil.which("node")
    assert node is not None
    result = subprocess.run(
        [node, str(SCRIPT), sdk_module.as_uri(), daemon_proc.url, TOKEN],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["health"] == {"status": "ok"}
    assert out["mode"] == "http-bridge"
    assert {"session_create", "session_events", "session_prompt", "session_close"} <= set(
        out["features"]
    )
    assert out["session"]["attached"] is False
    assert out["firstStopReason"] == "end_turn"
    assert out["secondStopReason"] == "end_turn"
    assert out["permissionAnswered"] is True
    assert out["heartbeat"]["sessionId"] == out["session"]["sessionId"]
    assert "readerError" not in out
    seen = out["seen"]
    assert seen.count("turn_complete") == 2
    assert {"session_update", "permission_request", "permission_resolved"} <= set(seen)
    assert seen[-1] == "session_closed"
    # The SDK's reducer understood every event we sent.
    assert out["state"]["alive"] is False
    assert out["state"]["terminal"] == "session_closed"
    assert out["state"]["pendingPermissions"] == 0
    assert out["state"]["rejected"] == []
    written = daemon_proc.workspace / "sdk.txt"
    assert written.read_text() == "written by sdk"
