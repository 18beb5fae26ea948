"""``acp-serve attach`` as an editor meets it when something is wrong (issue 46).

No daemon at the URL: every request is answered with a JSON-RPC error after a bounded
retry (it used to retry ``initialize`` for ever, the editor waiting without a word), stderr
says what was tried, and closing stdin ends the bridge at once, even mid-retry. A wrong path:
a JSON-RPC error (not the daemon's ``{"error":"Not found"}``) and a non-zero exit.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.daemon import running_daemon

ROOT = Path(__file__).resolve().parents[2]
#: Longer than the bridge's bounded retry (serve.client.attach.CONNECT_RETRY_S, 10 s).
GUARD_S = 30.0


def _free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _attach(url: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "serve", "attach", url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )


def _send(proc: subprocess.Popen[bytes], rid: int, method: str, params: dict[str, Any]) -> None:
    assert proc.stdin is not None
    message = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
    proc.stdin.write(json.dumps(message).encode() + b"\n")
    proc.stdin.flush()


def _reply(proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, "the bridge closed its stdout without answering"
    message = json.loads(line)  # stdout carries JSON-RPC only
    assert message.get("jsonrpc") == "2.0", message
    return message  # type: ignore[no-any-return]


def test_no_daemon_every_request_gets_a_json_rpc_error_and_stdin_eof_ends_it() -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    proc = _attach(url)
    try:
        started = time.monotonic()
        _send(proc, 1, "initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        _send(proc, 2, "session/new", {"cwd": str(ROOT), "mcpServers": []})
        init = _reply(proc)
        assert time.monotonic() - started < GUARD_S
        assert init["id"] == 1 and "error" in init, init
        assert "unreachable" in init["error"]["message"]
        assert f"{url}/acp" in init["error"]["message"]  # what it tried
        new = _reply(proc)
        assert new["id"] == 2 and "error" in new, new
        assert "unreachable" in new["error"]["message"]
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(timeout=10) == 0
        assert proc.stdout is not None and proc.stdout.read() == b""
        assert proc.stderr is not None
        stderr = proc.stderr.read().decode()
        assert f"cannot reach {url}/acp" in stderr, stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_stdin_closed_while_the_daemon_is_being_reached_ends_the_bridge() -> None:
    proc = _attach(f"http://127.0.0.1:{_free_port()}")
    try:
        _send(proc, 1, "initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        assert proc.stderr is not None
        assert b"cannot reach" in proc.stderr.readline()  # it is retrying now
        assert proc.stdin is not None
        proc.stdin.close()
        closed = time.monotonic()
        proc.wait(timeout=GUARD_S)
        assert time.monotonic() - closed < 3.0  # not after the retries ran out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_wrong_path_is_a_json_rpc_error_and_a_failed_exit() -> None:
    with running_daemon() as daemon:
        proc = _attach(f"{daemon.url}/wrong/path")
        try:
            _send(proc, 1, "initialize", {"protocolVersion": 1, "clientCapabilities": {}})
            init = _reply(proc)
            assert init["id"] == 1 and "error" in init, init
            assert "/wrong/path/acp" in init["error"]["message"]
            assert proc.wait(timeout=GUARD_S) != 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
